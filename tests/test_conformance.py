"""Every contract over every estimator and both backends, from one table.

Each `Case` is an estimator with small, fast parameters, its data, and how its results
compare; each test below runs one contract of `dmp.utils.estimator_checks` over the cases it
applies to, on one 2-worker LocalCluster (``dask_client``) and in process.  The contracts:

* ``backends``: the fit on Dask is the in-process fit, round for round;
* ``bytes``: every round counts the bytes of each primitive, the same on both backends;
* ``resume``: a fit stopped and resumed from its checkpoint is the uninterrupted fit (in
  process and on Dask);
* ``worker_loss``: a fit that loses a worker process recovers to the undisturbed result;
* ``bad_input``: NaN, infinite, wrongly shaped and empty data are refused;
* ``pickle``: a fitted estimator survives pickling;
* ``clone``: ``sklearn.base.clone`` keeps the parameters (the client by reference) and a
  clone fits to the same result.

A case runs the contracts in ``contracts``; `test_every_estimator_keeps_every_contract`
checks that every public estimator is in the table for every contract, or says why not.
The in-process and Dask fits of a case are made once and shared by the contracts.  The last
part checks `dmp.engine.testing.check_program` on the README's program and shows every one
of its checks failing on a program that breaks it.
"""

from dataclasses import dataclass, field

import numpy as np
import pytest
from sklearn.base import BaseEstimator
from sklearn.datasets import load_digits

import dmp.decomposition
import dmp.hashing
import dmp.linear_model

from dmp.decomposition import LatentDirichletAllocation, MatrixFactorization
from dmp.engine import Broadcast, Program
from dmp.engine.testing import (check_program, check_program_backends, check_program_bytes,
                                check_program_pickles, check_program_resume,
                                check_program_worker_loss)
from dmp.hashing import BinaryAutoencoder
from dmp.linear_model import Lasso, SparsifiedSGDClassifier, SparsifiedSGDRegressor
from dmp.linear_model._lasso_program import LassoProgram
from dmp.utils import estimator_checks as checks

from conftest import alpha_max, make_problem
from mf_reference import low_rank_ratings
from test_lda import lda_corpus
from test_sparsified import breast_cancer

pytestmark = [pytest.mark.dask, pytest.mark.timeout(300)]

#: every public estimator of dmp
ESTIMATORS = [getattr(mod, name) for mod in (dmp.linear_model, dmp.decomposition, dmp.hashing)
              for name in mod.__all__ if isinstance(getattr(mod, name), type)
              and issubclass(getattr(mod, name), BaseEstimator)]
ALL = frozenset({"backends", "bytes", "resume", "worker_loss", "bad_input", "pickle", "clone"})


@dataclass
class Case:
    """One row of the table."""

    name: str
    data: object            # () -> (X, y or None, fit_params)
    make: object            # (X, y) -> an unfitted estimator
    contracts: frozenset = ALL
    #: result(estimator, X, y) -> dict: what a fit found (default: every fitted attribute);
    #: compared exactly unless ``resume`` / ``loss`` give tolerances
    result: object = None
    #: per-round history columns compared as well
    history: tuple = ()
    #: the attribute holding the per-round history
    rounds: str = "history_"
    #: keyword arguments of check_resume (stop_at, ...; "backends": where it runs) and of
    #: check_worker_loss (at, ...)
    resume: dict = field(default_factory=dict)
    loss: dict = field(default_factory=dict)
    #: assertions of this model's own, on the in-process and Dask fits
    extra: object = None
    #: why a contract is left out
    why_not: dict = field(default_factory=dict)

    def __repr__(self):
        return self.name


def _lasso_objective(X, y, est):
    r = y - X @ est.coef_ - est.intercept_
    alpha = est.alpha
    return 0.5 * float(r @ r) / X.shape[0] + alpha * np.abs(est.coef_).sum()


def _lasso_result(est, X, y):
    return {"objective": _lasso_objective(X, y, est), "coef_": est.coef_}


# a resumed Lasso restores its residuals and its schedule's state: the uninterrupted fit's
# rounds exactly; a recovered one recomputes a lost partition's residual from its
# coefficients: the same optimum, reached to rounding in other rounds
LASSO_LOSS = dict(rtol={"objective": 1e-8}, atol={"coef_": 1e-6})
# with rounds in flight (staleness 1) the resumed fit reaches the optimum in other rounds
LASSO_STALE_RESUME = dict(same_rounds=False, rtol={"objective": 1e-7}, atol={"coef_": 1e-5})


def _problem():
    X, y = make_problem()
    return X, y, {}


def _lasso(schedule):
    return lambda X, y: Lasso(alpha=0.05 * alpha_max(X, y), schedule=schedule, tol=1e-10,
                              random_state=3, n_workers=2, checkpoint_every=10)


def _lasso_resumed(n_workers, staleness):
    """The Lasso of the interrupted-fit test: the checkpoint rounds must be reached drained
    (with rounds in flight) and written."""
    def data():
        X, y = make_problem(n=200, p=1500, density=0.03, seed=2)
        return X, y, {}

    def make(X, y):
        return Lasso(alpha=0.02 * alpha_max(X, y), tol=1e-8, random_state=0,
                     n_workers=n_workers, schedule="round_robin", schedule_size=100,
                     staleness=staleness, checkpoint_every=10)

    return Case(f"lasso-{n_workers}w-stale{staleness}", data, make,
                contracts=frozenset({"resume"}), result=_lasso_result,
                resume=dict(stop_at=35, checkpoint_round=30, exact_stop=True,
                            resume_params={"checkpoint_every": 500}, backends=("local",),
                            **(LASSO_STALE_RESUME if staleness else {})),
                why_not={c: "the lasso case" for c in ALL - {"resume"}})


def _sgd_regression():
    rng = np.random.default_rng(3)
    A = rng.standard_normal((1200, 40))
    b = A @ rng.standard_normal(40) + 0.1 * rng.standard_normal(1200)
    return A, b, {}


def _breast_cancer():
    X, y = breast_cancer()
    return X, y, {}


def _corpus():
    X, _, _ = lda_corpus(n_docs=120, n_words=150, n_topics=5, doc_len=40, seed=7)
    return X, None, {}


def _ratings():
    tr, te = low_rank_ratings(n=120, m=90, k=3, density=0.3, seed=8)
    return tr, None, {"X_val": te}


def _digits():
    X = load_digits().data
    return X[np.random.default_rng(0).permutation(len(X))[300:]], None, {}


def _lda_extra(local, remote):
    # word blocks went worker to worker in batches of sub-rounds (in process: round by round)
    batched = remote.history_["batch"] != remote.history_["round"]
    assert batched.sum() >= 6 and not batched[:3].any(), remote.history_["batch"]
    assert np.all(local.history_["batch"] == local.history_["round"])


def _ba_result(est, X, y):
    out = checks.fitted_result(est)
    # per iteration: every partition holding the same model, no iteration lost or repeated
    # by a recovery
    out.update({f"iteration_history_[{k!r}]": est.iteration_history_[k]
                for k in ("iteration", "identical")})
    return out


def _ba_extra(local, remote):
    # the ring bytes per iteration too (a recovered fit sends an interrupted iteration's
    # again, so they are not part of the result)
    np.testing.assert_array_equal(remote.iteration_history_["bytes_ring"], local.iteration_history_["bytes_ring"])
    assert remote.iteration_history_["bytes_ring"][0] > 0 and remote.iteration_history_["identical"].all()
    assert list(local.iteration_history_["iteration"]) == list(range(local.n_iter_))


BA_NO_RESUME = "BinaryAutoencoder has no checkpoint: a lost worker's part comes from the driver"
VARIANT = "the variant of a case that runs every contract"

def _only(*contracts, why=VARIANT):
    """``contracts`` and ``why_not`` of a variant that runs only ``contracts``."""
    return dict(contracts=frozenset(contracts), why_not={c: why for c in ALL - set(contracts)})


CASES = [
    Case("lasso", _problem, _lasso("priority"), result=_lasso_result, history=("objective",),
         resume=dict(stop_at=35, checkpoint_round=30, exact_stop=True,
                     other_params={"alpha": 1.0}, resume_params={"checkpoint_every": 500}),
         loss=dict(at=25, same_rounds=False, **LASSO_LOSS)),
    Case("lasso-round_robin", _problem, _lasso("round_robin"), history=("objective",),
         **_only("backends", "bytes")),
    Case("lasso-random", _problem, _lasso("random"), history=("objective",),
         **_only("backends", "bytes")),
    _lasso_resumed(1, 0),
    _lasso_resumed(3, 0),
    _lasso_resumed(3, 1),
    Case("sgd-regressor", _sgd_regression,
         # more partitions than workers
         lambda X, y: SparsifiedSGDRegressor(max_iter=60, tol=None, random_state=0,
                                             n_workers=3, checkpoint_every=10),
         history=("objective", "upload_bytes"),
         resume=dict(stop_at=30, other_params={"alpha": 1.0})),
    Case("sgd-classifier-isaga", _breast_cancer,
         lambda X, y: SparsifiedSGDClassifier(alpha=1e-2, method="isaga", batch_size=8,
                                              n_workers=3, max_iter=60, tol=None,
                                              random_state=0, checkpoint_every=15),
         history=("objective", "upload_bytes"), resume=dict(stop_at=30)),
    Case("sgd-classifier-isega", _breast_cancer,
         lambda X, y: SparsifiedSGDClassifier(alpha=1e-2, method="isega", n_workers=2,
                                              max_iter=60, tol=None, random_state=3),
         history=("objective", "upload_bytes"), **_only("backends", "bytes")),
    Case("sgd-classifier-isaga-b16", _breast_cancer,
         lambda X, y: SparsifiedSGDClassifier(alpha=1e-2, method="isaga", batch_size=16,
                                              n_workers=2, max_iter=60, tol=None,
                                              random_state=3),
         history=("objective", "upload_bytes"), **_only("backends", "bytes")),
    Case("lda", _corpus,
         lambda X, y: LatentDirichletAllocation(5, max_iter=6, sampler="sparse", random_state=4,
                                                n_workers=2, checkpoint_every=2),
         history=("ll_per_token",), extra=_lda_extra,
         resume=dict(stop_at=9, other_params={"sampler": "dense"})),
    # K = 1,500: the word blocks travel as their nonzeros and are sampled in that form
    Case("lda-buckets", _corpus,
         lambda X, y: LatentDirichletAllocation(1500, max_iter=6, sampler="buckets",
                                                random_state=4, n_workers=2,
                                                checkpoint_every=2),
         history=("ll_per_token",), extra=_lda_extra,
         resume=dict(stop_at=9, other_params={"sampler": "sparse"})),
    Case("lda-dense", _corpus,
         lambda X, y: LatentDirichletAllocation(5, max_iter=6, sampler="dense", random_state=4,
                                                n_workers=2),
         history=("ll_per_token",), extra=_lda_extra, **_only("backends", "bytes")),
    Case("mf-ccd++", _ratings,
         lambda X, y: MatrixFactorization(4, alpha=0.1, method="ccd++", block_size=2,
                                          max_iter=4, tol=None, n_workers=2, random_state=3,
                                          checkpoint_every=1),
         history=("objective", "valid_rmse"), resume=dict(stop_at=9)),
    Case("mf-ccd", _ratings,
         lambda X, y: MatrixFactorization(4, alpha=0.1, method="ccd", block_size=2, max_iter=4,
                                          tol=None, n_workers=2, random_state=3,
                                          checkpoint_every=1),
         history=("objective", "valid_rmse"), resume=dict(stop_at=5)),
    Case("mf-als", _ratings,
         lambda X, y: MatrixFactorization(4, alpha=0.1, method="als", max_iter=4, tol=None,
                                          n_workers=2, random_state=3, checkpoint_every=1),
         history=("objective", "valid_rmse"), resume=dict(stop_at=5),
         **_only("backends", "bytes", "resume")),
    Case("mf-als-blocks", _ratings,
         lambda X, y: MatrixFactorization(4, alpha=0.1, method="als", block_size=3,
                                          max_iter=4, tol=None, n_workers=2, random_state=3,
                                          checkpoint_every=1),
         history=("objective", "valid_rmse"), resume=dict(stop_at=7),
         **_only("resume", why="mf-als with blocks of fewer than k coordinates")),
    Case("ba", _digits, lambda X, y: BinaryAutoencoder(16, max_iter=5, random_state=0,
                                                       n_workers=3),
         contracts=ALL - {"resume"}, result=_ba_result, rounds="round_history_",
         extra=_ba_extra, why_not={"resume": BA_NO_RESUME},
         # during the W step (the encoders' hops) of iteration 3, which then runs again
         loss=dict(at=lambda r, m: m.get("phase") == "hop" and m.get("iteration") == 3,
                   same_rounds=False)),
]


def _cases(contract):
    return [pytest.param(c, id=c.name) for c in CASES if contract in c.contracts]


_DATA: dict = {}
_FITS: dict = {}


def _data(case):
    if case.name not in _DATA:
        _DATA[case.name] = case.data()
    return _DATA[case.name]


def _estimator(case):
    X, y, _ = _data(case)
    return case.make(X, y)


def _compare(case, tolerances=None):
    """check_* keyword arguments saying how the case's results compare."""
    X, y, _ = _data(case)
    result = None if case.result is None else (lambda est: case.result(est, X, y))
    tol = {k: v for k, v in (tolerances or {}).items() if k in ("rtol", "atol")}
    return dict(result=result, history=case.history, rounds=case.rounds, **tol)


def _fitted(case, where, client):
    """The case's fit in process or on Dask, made once."""
    key = (case.name, where)
    if key not in _FITS:
        X, y, fit_params = _data(case)
        if where == "local":
            fit = checks.fit_local(_estimator(case), X, y, client=client,
                                   fit_params=fit_params)
        else:
            fit = checks.fit_dask(_estimator(case), X, y, client=client, fit_params=fit_params)
        _FITS[key] = fit
    return _FITS[key]


@pytest.fixture(scope="module", autouse=True)
def _forget_fits():
    yield
    _FITS.clear()
    _DATA.clear()


def test_every_estimator_keeps_every_contract():
    """The table covers every public estimator with every contract, or says why not."""
    assert len(ESTIMATORS) >= 6, ESTIMATORS
    for cls in ESTIMATORS:
        rows = [c for c in CASES if type(_estimator(c)) is cls]
        assert rows, f"{cls.__name__} is not in the table"
        for contract in sorted(ALL):
            if not any(contract in c.contracts for c in rows):
                assert all(c.why_not.get(contract) for c in rows), \
                    f"{cls.__name__}: no case runs {contract!r}, and none says why"
    for c in CASES:
        missing = ALL - c.contracts - set(c.why_not)
        assert not missing, f"{c.name}: contracts {sorted(missing)} neither run nor explained"


@pytest.mark.parametrize("case", _cases("backends"))
def test_backends_agree(dask_client, case):
    X, y, fit_params = _data(case)
    local, remote = _fitted(case, "local", dask_client), _fitted(case, "dask", dask_client)
    checks.check_backends_agree(_estimator(case), X, y, client=dask_client,
                                fit_params=fit_params, fitted=(local, remote),
                                **_compare(case))
    if case.extra is not None:
        case.extra(local, remote)


@pytest.mark.parametrize("case", _cases("bytes"))
def test_bytes_accounted(dask_client, case):
    X, y, fit_params = _data(case)
    checks.check_bytes_accounted(_estimator(case), X, y, client=dask_client,
                                 fit_params=fit_params, rounds=case.rounds,
                                 fitted=(_fitted(case, "local", dask_client),
                                         _fitted(case, "dask", dask_client)))


def _resume_params():
    return [pytest.param(c, where, id=f"{c.name}-{where}") for c in CASES
            if "resume" in c.contracts for where in c.resume.get("backends", ("local", "dask"))]


@pytest.mark.parametrize("case, where", _resume_params())
def test_resume(dask_client, tmp_path, case, where):
    X, y, fit_params = _data(case)
    kw = {k: v for k, v in case.resume.items() if k not in ("backends", "rtol", "atol")}
    checks.check_resume(_estimator(case), X, y,
                        backend="local" if where == "local" else dask_client,
                        fit_params=fit_params, directory=tmp_path,
                        reference=_fitted(case, where, dask_client),
                        **kw, **_compare(case, case.resume))


@pytest.mark.parametrize("case", _cases("bad_input"))
def test_refuses_bad_input(case):
    X, y, fit_params = _data(case)
    checks.check_refuses_bad_input(_estimator(case), X, y, fit_params=fit_params)


@pytest.mark.parametrize("case", _cases("pickle"))
def test_pickle(dask_client, case):
    X, y, fit_params = _data(case)
    checks.check_pickle(_estimator(case), X, y, fit_params=fit_params,
                        fitted=_fitted(case, "local", dask_client),
                        result=_compare(case)["result"])


@pytest.mark.parametrize("case", _cases("clone"))
def test_clone(dask_client, case):
    X, y, fit_params = _data(case)
    checks.check_clone(_estimator(case), X, y, client=dask_client, fit_params=fit_params,
                       fitted=_fitted(case, "local", dask_client),
                       result=_compare(case)["result"])


# ------------------------------------------------------- each estimator check can fail


class ImputesMissingCounts(LatentDirichletAllocation):
    """Reads a NaN or an infinity in the counts as no count."""

    def fit(self, X, y=None):
        X = X.copy()
        X.data = np.nan_to_num(X.data, nan=0.0, posinf=0.0)
        return super().fit(X, y)


class CountsMebibytes(MatrixFactorization):
    """Reports its ring bytes in MiB."""

    def fit(self, X, y=None, **kw):
        super().fit(X, y, **kw)
        self.history_["bytes_ring"] = self.history_["bytes_ring"] / 2**20
        return self


class DropsItsItemFactors(MatrixFactorization):
    """Leaves its item factors out of its pickle."""

    def __getstate__(self):
        state = dict(super().__getstate__())
        state.pop("item_factors_", None)
        return state


class _ProgramWithoutResiduals(LassoProgram):
    def checkpoint_arrays(self, s):
        return {"w": s["w"]}

    def driver_state(self):
        state = dict(super().driver_state())
        for key in ("r", "l1", "objective", "floor", "max_abs_w", "need_gap", "need_refresh"):
            state.pop(key)
        return state


class CheckpointsNoResidual(Lasso):
    """Checkpoints its coefficients but not the residuals (as dmp's checkpoints once did)."""

    def _make_program(self, fit):
        program = super()._make_program(fit)
        program.__class__ = _ProgramWithoutResiduals
        return program


class ForgetsItsCallback(Lasso):
    """Clones itself by hand, with every parameter but one."""

    def __sklearn_clone__(self):
        params = self.get_params(deep=False)
        params.pop("callback")
        return type(self)(**params)


def test_each_estimator_check_fails_on_an_estimator_that_breaks_it(dask_client, tmp_path):
    X, _, _ = lda_corpus(n_docs=40, n_words=60, n_topics=3, doc_len=20, seed=9)
    kw = dict(max_iter=3, n_workers=2)
    with pytest.raises(AssertionError, match="on Dask against in process: topic_word_counts_"):
        checks.check_backends_agree(LatentDirichletAllocation(3, random_state=None, **kw), X,
                                    client=dask_client)
    with pytest.raises(AssertionError, match="accepted X with a NaN"):
        checks.check_refuses_bad_input(ImputesMissingCounts(3, random_state=0, **kw), X)
    R = _ratings()[0]
    mf = dict(n_components=3, max_iter=2, tol=None, n_workers=2, random_state=0)
    with pytest.raises(AssertionError, match=r"bytes_ring'\] must hold one integer per round"):
        checks.check_bytes_accounted(CountsMebibytes(**mf), R, client=dask_client)
    with pytest.raises(AssertionError, match="fitted attributes after pickling: the entries "
                                             r"differ: \['item_factors_'\]"):
        checks.check_pickle(DropsItsItemFactors(**mf), R)
    Xl, yl, _ = _problem()
    lasso = _lasso("priority")(Xl, yl)
    with pytest.raises(AssertionError, match=r"clone\(ForgetsItsCallback\) did not keep its "
                                             r"backend and callback .* callback None"):
        checks.check_clone(ForgetsItsCallback(**lasso.get_params()), Xl, yl,
                           client=dask_client)
    # checkpoints without the residuals: the resumed fit rebuilds them, to rounding, in a
    # round of its own, and leaves the uninterrupted fit's path
    with pytest.raises(AssertionError, match=r"resumed fit's history_\['round'\] is not rounds "
                                             r"0 to \d+ \(the uninterrupted fit's\)"):
        checks.check_resume(CheckpointsNoResidual(**lasso.get_params()), Xl, yl, stop_at=35,
                            directory=tmp_path)
    # a fit that loses no worker (this one ends before the kill is due) proves nothing
    with pytest.raises(AssertionError, match="the fit ended before round 1000000"):
        checks.check_worker_loss(lasso, Xl, yl, client=dask_client, at=10**6,
                                 directory=tmp_path)


# ------------------------------------------------------------------- programs (README's)


class LeastSquaresGD(Program):
    """The README's program: distributed gradient descent for least squares on row shards."""

    name = "lsq-gd"

    def __init__(self, n_per_shard=200, n_features=5, step=0.5, seed=0):
        super().__init__()
        self.n_per_shard, self.n_features, self.step, self.seed = (n_per_shard, n_features,
                                                                   step, seed)

    def init_partition(self, k):
        rng = np.random.default_rng([self.seed, k])
        X = rng.standard_normal((self.n_per_shard, self.n_features))
        w_true = np.arange(self.n_features, dtype=float)
        return {"X": X, "y": X @ w_true, "w": np.zeros(self.n_features)}

    def push(self, state, plan):
        X, y, w = state["X"], state["y"], state["w"]
        return X.T @ (X @ w - y)

    def apply(self, state, w):
        state["w"] = w

    def partition_specs(self, n_partitions):
        return list(range(n_partitions))

    def start(self, n_partitions):
        self.driver = {"w": np.zeros(self.n_features), "P": n_partitions, "norm": np.inf}

    def schedule(self, round):
        return [None] * self.driver["P"]

    def pull(self, round, partials):
        g = np.sum(partials, axis=0) / (self.driver["P"] * self.n_per_shard)
        self.driver["w"] = self.driver["w"] - self.step * g
        self.driver["norm"] = float(np.linalg.norm(g))
        return Broadcast(self.driver["w"])

    def metrics(self):
        return {"grad_norm": self.driver["norm"]}

    def converged(self):
        return self.driver["norm"] < 1e-8


class ResumableGD(LeastSquaresGD):
    """The README's program with checkpoints, and a step that shrinks every round (so that
    the rounds of a run are not all alike)."""

    def start(self, n_partitions):
        super().start(n_partitions)
        self.driver["step"] = self.step

    def pull(self, round, partials):
        g = np.sum(partials, axis=0) / (self.driver["P"] * self.n_per_shard)
        self.driver["w"] = self.driver["w"] - self.driver["step"] * g
        self.driver["step"] *= 0.97
        self.driver["norm"] = float(np.linalg.norm(g))
        return Broadcast(self.driver["w"])

    def driver_state(self):
        return {"w": self.driver["w"], "norm": self.driver["norm"],
                "step": self.driver["step"]}

    def load_driver_state(self, state):
        self.driver.update(w=np.asarray(state["w"]), norm=float(state["norm"]),
                           step=float(state["step"]))

    def partition_arrays(self, state):
        return {"w": state["w"]}

    def restore_partition(self, state, arrays):
        state["w"] = np.array(arrays["w"])


# each breaks one contract, as programs do by mistake


class MomentumOnTheProgram(ResumableGD):
    """Keeps each partition's momentum on the program object: in process every partition
    adds to the same one, on Dask each worker has its own."""

    velocity = None

    def push(self, state, plan):
        g = super().push(state, plan)
        self.velocity = g if self.velocity is None else 0.5 * self.velocity + g
        return self.velocity


class ForgetsTheStep(ResumableGD):
    """Its checkpoint leaves out the step size: a resumed run starts again with the first."""

    def driver_state(self):
        return {"w": self.driver["w"], "norm": self.driver["norm"]}

    def load_driver_state(self, state):
        self.driver.update(w=np.asarray(state["w"]), norm=float(state["norm"]),
                           step=self.step)


class StartsFromItsOwnModel(ResumableGD):
    """``start`` hands the driver the program's initial model, which ``pull`` then updates in
    place: starting over after a worker loss starts from where the run had got to."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.w0 = np.zeros(self.n_features)

    def start(self, n_partitions):
        super().start(n_partitions)
        self.driver["w"] = self.w0

    def pull(self, round, partials):
        g = np.sum(partials, axis=0) / (self.driver["P"] * self.n_per_shard)
        self.driver["w"] -= self.driver["step"] * g
        self.driver["step"] *= 0.97
        self.driver["norm"] = float(np.linalg.norm(g))
        return Broadcast(self.driver["w"].copy())


class Gradient:
    def __init__(self, g):
        self.g = g


class HidesItsArrays(ResumableGD):
    """Sends its gradients inside an object the byte count cannot see into."""

    def push(self, state, plan):
        return Gradient(super().push(state, plan))

    def pull(self, round, partials):
        return super().pull(round, [p.g for p in partials])


class KeepsItsShard(ResumableGD):
    """Caches each shard on the program object, which is shipped to every worker."""

    def init_partition(self, k):
        state = super().init_partition(k)
        self.cache = getattr(self, "cache", {})
        self.cache[k] = state["X"]
        return state


def _w(program, result):
    return {"w": program.driver["w"], "n_rounds": result.n_rounds}


MAX_ITER = 30


def test_the_readme_program_keeps_every_contract(dask_client):
    done = check_program(LeastSquaresGD, client=dask_client, max_iter=MAX_ITER, result=_w,
                         worker_loss=False)
    assert done == {"pickles": None, "bytes": None, "backends": None,
                    "resume": "the program does not implement load_driver_state",
                    "worker loss": "worker_loss=False"}
    done = check_program(ResumableGD, client=dask_client, max_iter=MAX_ITER, result=_w,
                         worker_loss=False)
    assert done == {"pickles": None, "bytes": None, "resume": None, "resume on Dask": None,
                    "backends": None, "worker loss": "worker_loss=False"}


@pytest.mark.slow
def test_a_program_survives_a_worker_loss(dask_client):
    check_program_worker_loss(ResumableGD, client=dask_client, max_iter=MAX_ITER, result=_w,
                              checkpoint_every=5)


def test_each_program_check_fails_on_the_program_that_breaks_it(dask_client):
    kw = dict(max_iter=MAX_ITER)
    with pytest.raises(AssertionError, match="on Dask against in process"):
        check_program_backends(MomentumOnTheProgram, client=dask_client, **kw)
    check_program_backends(ResumableGD, client=dask_client, **kw)
    with pytest.raises(AssertionError, match="resumed against uninterrupted"):
        check_program_resume(ForgetsTheStep, stop_at=12, checkpoint_every=5, **kw)
    check_program_resume(ResumableGD, stop_at=12, checkpoint_every=5, **kw)
    with pytest.raises(AssertionError, match="partial .*Gradient.* holds 40 bytes of array "
                                             "data but is counted as 8"):
        check_program_bytes(HidesItsArrays, **kw)
    check_program_bytes(ResumableGD, **kw)
    with pytest.raises(AssertionError, match=r"pickle grew .*\['cache'\]"):
        check_program_pickles(KeepsItsShard, **kw)
    check_program_pickles(ResumableGD, **kw)


@pytest.mark.slow
def test_the_worker_loss_check_fails_on_a_program_that_starts_over_wrongly(dask_client):
    with pytest.raises(AssertionError, match="after a worker loss against undisturbed"):
        check_program_worker_loss(StartsFromItsOwnModel, client=dask_client,
                                  max_iter=MAX_ITER, result=_w)


# ---------------------------------------------------------------- the losses, last (slow)


@pytest.mark.slow
@pytest.mark.parametrize("case", _cases("worker_loss"))
def test_worker_loss(dask_client, tmp_path, case):
    X, y, fit_params = _data(case)
    kw = {k: v for k, v in case.loss.items() if k not in ("rtol", "atol")}
    checks.check_worker_loss(_estimator(case), X, y, client=dask_client, fit_params=fit_params,
                             directory=tmp_path, reference=_fitted(case, "local", dask_client),
                             **kw, **_compare(case, case.loss))


class _Fitted:
    """A stand-in fitted estimator: only its per-round history."""

    def __init__(self, batch, bytes_push):
        n = len(batch)
        self.history_ = {"round": np.arange(n), "batch": np.asarray(batch),
                         "bytes_push": np.asarray(bytes_push), "bytes_schedule": np.ones(n, int),
                         "bytes_pull": np.zeros(n, int), "bytes_ring": np.zeros(n, int)}


def test_bytes_accounted_lets_only_a_batchs_inner_rounds_push_less_on_dask():
    """`Program.close_batch` may drop what a batch's inner rounds would push: on Dask those
    rounds may push fewer bytes than in process, never more; a batch's last round and a
    round run alone must push the same."""
    local = _Fitted([0, 1, 2, 3, 4], [9, 9, 9, 9, 9])

    def check(batch, pushed):
        checks.check_bytes_accounted(None, None, client=None,
                                     fitted=(local, _Fitted(batch, pushed)))

    check([0, 1, 1, 1, 4], [9, 2, 2, 9, 9])                 # rounds 1 and 2 inside a batch
    with pytest.raises(AssertionError, match="inside a batch exceeds"):
        check([0, 1, 1, 1, 4], [9, 2, 12, 9, 9])
    with pytest.raises(AssertionError, match="byte counts on Dask against in process"):
        check([0, 1, 1, 1, 4], [9, 2, 2, 2, 9])              # round 3 ends its batch
    with pytest.raises(AssertionError, match="byte counts on Dask against in process"):
        check([0, 1, 2, 3, 4], [9, 2, 9, 9, 9])              # no batches: every count equal
