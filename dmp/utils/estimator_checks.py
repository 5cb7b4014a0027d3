"""The contracts every dmp estimator keeps, as plain functions that raise ``AssertionError``.

Each check takes an unfitted estimator (its parameters define the fit), the data its ``fit``
takes, and what to compare; it fits clones of the estimator as it needs and raises
``AssertionError`` naming what broke.  They hold for any estimator written the way dmp's are:

* parameters ``backend`` (``"local"`` or a ``distributed.Client``), ``n_workers`` (the
  number of partitions), ``random_state`` and ``callback(round, metrics) -> bool`` (True
  stops the fit), and for `check_resume` ``checkpoint``, ``checkpoint_every`` and ``resume``;
* fitted attributes ending in ``_``, a per-round history (``history_`` by default: a dict of
  arrays with the engine's columns ``round``, ``time``, ``push_s``, ``bytes_*`` and
  ``worker_losses``) and ``recoveries_`` (the worker losses recovered from).

A fit is deterministic given ``random_state`` and ``n_workers``, on either backend: results
are compared exactly unless ``rtol`` / ``atol`` say otherwise.  ``result(estimator) -> dict``
picks what a fit's result is (`fitted_result` by default: every fitted attribute but the
history, the recoveries and the wall time); ``history`` names per-round columns compared as
well (timing columns differ from fit to fit).  ``fit_params`` are keyword arguments of
``fit`` (e.g. MatrixFactorization's ``X_val``).

The checks that need a cluster take a ``client`` of one whose workers run in processes,
with at least as many partitions (``n_workers``) as workers; `check_worker_loss` kills one
of them, so the cluster must restart it (the nannies of a ``LocalCluster`` do).

`dmp.engine.testing` has the same contracts for a `dmp.engine.Program`.
"""

from __future__ import annotations

import inspect
import os
import pickle
import tempfile
import warnings

import numpy as np
import scipy.sparse as sp
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning

from ..engine import CheckpointStore
from ._checks import assert_same, kill_when, wait_for_workers, worker_addresses

__all__ = ["fitted_result", "assert_same_fit", "fit_local", "fit_dask", "bad_inputs",
           "check_backends_agree", "check_bytes_accounted", "check_resume", "check_worker_loss",
           "check_refuses_bad_input", "check_pickle", "check_clone"]

#: fitted attributes that are not part of a fit's result: how it went, not what it found
NOT_RESULTS = ("history_", "round_history_", "iteration_history_", "recoveries_",
               "wall_time_")
#: the per-round byte counts of each primitive, as the engine records them
BYTE_COLUMNS = ("bytes_schedule", "bytes_push", "bytes_pull", "bytes_ring")
#: methods whose outputs `check_pickle` compares, when they take the data alone
OUTPUT_METHODS = ("predict", "predict_proba", "decision_function", "transform", "score")


def fitted_result(estimator) -> dict:
    """Every public fitted attribute (a name ending in ``_``) but `NOT_RESULTS`."""
    return {name: value for name, value in vars(estimator).items()
            if name.endswith("_") and not name.startswith("_") and name not in NOT_RESULTS}


def _fitted_names(estimator) -> list:
    return sorted(n for n in vars(estimator) if n.endswith("_") and not n.startswith("_"))


def _rounds(estimator, rounds: str) -> dict:
    h = getattr(estimator, rounds, None)
    if not isinstance(h, dict) or "round" not in h:
        raise AssertionError(f"{type(estimator).__name__}.{rounds} is not a per-round "
                             f"history (a dict of arrays with a 'round' column)")
    return h


def assert_same_fit(got, want, *, result=None, rtol=0.0, atol=0.0, history=(),
                    rounds: str = "history_", same_rounds: bool = True,
                    what: str = "the fit") -> None:
    """Assert that two fitted estimators found the same result (in the same rounds).

    Parameters
    ----------
    got, want : fitted estimators
    result : callable, optional
        ``result(estimator) -> dict`` (default `fitted_result`).
    rtol, atol : float or dict
        Tolerances of numeric values (0: exactly equal), or ``{entry: tolerance}`` for the
        entries of the result and the history columns named (0 for the others).
    history : sequence of str
        Columns of the per-round history compared as well.
    rounds : str
        The attribute holding the per-round history.
    same_rounds : bool
        Whether both fits must have run the same rounds (False: the result may be reached
        in another number of rounds, and ``history`` is not compared).
    what : str
        Names the comparison in the message.
    """
    result = result or fitted_result
    assert_same(result(got), result(want), rtol=rtol, atol=atol, what=what)
    if not same_rounds:
        return
    h_got, h_want = _rounds(got, rounds), _rounds(want, rounds)
    if len(h_got["round"]) != len(h_want["round"]):
        raise AssertionError(f"{what}: {len(h_got['round'])} rounds, expected "
                             f"{len(h_want['round'])}")
    for key in history:
        for h, whose in ((h_got, "the fit"), (h_want, "the reference")):
            if key not in h:
                raise AssertionError(f"{what}: {whose}'s {rounds} has no column {key!r}")
        assert_same({key: h_got[key]}, {key: h_want[key]}, rtol=rtol, atol=atol,
                    what=f"{what}: {rounds}")


def _args(X, y):
    return (X,) if y is None else (X, y)


def _fit(estimator, X, y, fit_params):
    with warnings.catch_warnings():
        # running out of rounds is how a small check ends, not what it checks
        warnings.simplefilter("ignore", ConvergenceWarning)
        return estimator.fit(*_args(X, y), **(fit_params or {}))


def _n_workers(estimator, client=None) -> int:
    n = estimator.get_params().get("n_workers")
    if n is None:
        n = len(worker_addresses(client)) if client is not None else 1
    return int(n)


def _variant(estimator, **params):
    return clone(estimator).set_params(**params)


def fit_local(estimator, X, y=None, *, fit_params=None, client=None):
    """Fit a clone of ``estimator`` in process, with as many partitions as it has on
    ``client``'s cluster."""
    return _fit(_variant(estimator, backend="local", n_workers=_n_workers(estimator, client)),
                X, y, fit_params)


def fit_dask(estimator, X, y=None, *, client, fit_params=None):
    """Fit a clone of ``estimator`` on ``client``'s cluster."""
    return _fit(_variant(estimator, backend=client, n_workers=_n_workers(estimator, client)),
                X, y, fit_params)


def check_backends_agree(estimator, X, y=None, *, client, fit_params=None, result=None,
                         rtol=0.0, atol=0.0, history=(),
                         rounds: str = "history_", fitted=None):
    """The fit on a Dask cluster gives the in-process result, round for round.

    Parameters
    ----------
    client : distributed.Client
    fitted : (local, dask) fitted estimators, optional
        Fits already made with `fit_local` and `fit_dask` (the check then only compares).

    Returns
    -------
    (local, dask) : the two fitted estimators
    """
    local, remote = fitted or (fit_local(estimator, X, y, fit_params=fit_params, client=client),
                               fit_dask(estimator, X, y, client=client, fit_params=fit_params))
    name = type(estimator).__name__
    if remote.recoveries_:
        raise AssertionError(f"{name} on Dask recovered from a worker loss "
                             f"({remote.recoveries_}) in a fit that should have lost none")
    assert_same_fit(remote, local, result=result, rtol=rtol, atol=atol, history=history,
                    rounds=rounds, what=f"{name} on Dask against in process")
    n = _n_workers(estimator, client)
    for est, where in ((local, "in process"), (remote, "on Dask")):
        push_s = np.asarray(_rounds(est, rounds).get("push_s", np.zeros((0, n))))
        if push_s.ndim != 2 or push_s.shape[1] != n:
            raise AssertionError(f"{name} {where}: {rounds}['push_s'] has shape "
                                 f"{push_s.shape}: expected one column per partition ({n})")
    return local, remote


def check_bytes_accounted(estimator, X, y=None, *, client, fit_params=None,
                          rounds: str = "history_", fitted=None):
    """Every round records the bytes of each primitive (schedule, push, pull, ring), the
    same counts on both backends: they count the messages, not how they travelled.  The
    one exception: a round that ran inside a batch on Dask (not its batch's last) may push
    fewer bytes, what the program's `close_batch` dropped.

    The columns `BYTE_COLUMNS` must be there, hold one non-negative integer per round, and
    something must have been sent.  ``fitted`` as in `check_backends_agree`.
    """
    local, remote = fitted or (fit_local(estimator, X, y, fit_params=fit_params, client=client),
                               fit_dask(estimator, X, y, client=client, fit_params=fit_params))
    name = type(estimator).__name__
    for est, where in ((local, "in process"), (remote, "on Dask")):
        h = _rounds(est, rounds)
        n_rounds = len(h["round"])
        for key in BYTE_COLUMNS:
            if key not in h:
                raise AssertionError(f"{name} {where}: {rounds} has no column {key!r}")
            col = np.asarray(h[key])
            if col.shape != (n_rounds,) or not np.issubdtype(col.dtype, np.integer):
                raise AssertionError(f"{name} {where}: {rounds}[{key!r}] must hold one integer "
                                     f"per round ({n_rounds}); it is {col.dtype} of shape "
                                     f"{col.shape}")
            if np.any(col < 0):
                raise AssertionError(f"{name} {where}: {rounds}[{key!r}] has negative counts "
                                     f"(first at round {int(np.argmax(col < 0))})")
        if sum(int(np.sum(h[key])) for key in BYTE_COLUMNS) == 0:
            raise AssertionError(f"{name} {where}: {rounds} counts no bytes sent in "
                                 f"{n_rounds} rounds")
    h_remote = _rounds(remote, rounds)
    got = {k: np.asarray(h_remote[k]) for k in BYTE_COLUMNS}
    want = {k: np.asarray(_rounds(local, rounds)[k]) for k in BYTE_COLUMNS}
    # a round whose batch (the first round of its call) goes on after it
    batch = np.asarray(h_remote.get("batch", h_remote["round"]))
    inside = np.r_[batch[1:] == batch[:-1], False][:len(batch)]
    if got["bytes_push"].shape == want["bytes_push"].shape:
        pushed = got["bytes_push"][inside]
        if np.any(pushed > want["bytes_push"][inside]):
            raise AssertionError(f"{name} on Dask: {rounds}['bytes_push'] of a round inside a "
                                 f"batch exceeds the same round's in process")
        got["bytes_push"] = np.where(inside, want["bytes_push"], got["bytes_push"])
    assert_same(got, want, what=f"{name}'s byte counts on Dask against in process: {rounds}")
    return local, remote


def _is_local(backend) -> bool:
    return isinstance(backend, str) and backend == "local"


def check_resume(estimator, X, y=None, *, stop_at: int, backend="local", fit_params=None,
                 result=None, rtol=0.0, atol=0.0, history=(),
                 rounds: str = "history_", same_rounds: bool = True, exact_stop: bool = False,
                 reference=None, other_params=None, checkpoint_round=None,
                 resume_params=None, directory=None):
    """A fit stopped after round ``stop_at`` and continued with ``resume=True`` from its
    checkpoint gives the uninterrupted fit's result and history.

    The stopped fit writes checkpoints as the estimator's ``checkpoint_every`` says, at least
    one before ``stop_at``, and ends after ``stop_at`` (but before the uninterrupted fit's
    end).  The resumed fit must restore the stopped fit's history up to the last checkpoint
    written and run the rest.

    Parameters
    ----------
    stop_at : int
        The round after which the callback stops the fit (the "driver dies" there).
    backend : "local" or distributed.Client
        Where both fits and the reference run (``n_workers`` as the estimator says).
    same_rounds : bool
        Whether the resumed fit must run the uninterrupted fit's rounds (False: an estimator
        whose checkpoint restores its state to rounding, e.g. recomputing a residual, may
        reach the result in other rounds; the tolerances say how close).
    exact_stop : bool
        Whether, in process, the stopped fit must end right after ``stop_at`` (plus the
        rounds its ``staleness`` keeps in flight); False for an estimator that finishes a
        larger step first (e.g. LDA's sweep).
    reference : fitted estimator, optional
        The uninterrupted fit with the same parameters (made here when not given).
    other_params : dict, optional
        Parameters of another fit: resuming the checkpoint with them must be refused with a
        ``ValueError`` saying it is a "different fit (differs in: <their names>)".
    checkpoint_round : int, optional
        The round the last checkpoint before ``stop_at`` must be of, when the estimator's
        ``checkpoint_every`` counts rounds (checked in process).
    resume_params : dict, optional
        Parameters the resumed fit changes, which its checkpoint does not hold (e.g. a larger
        ``checkpoint_every``: writing a checkpoint every few rounds is what slows a small
        fit most).
    directory : path, optional
        Where the checkpoint goes (a temporary folder, removed afterwards, by default).
    """
    params = estimator.get_params()
    name = type(estimator).__name__
    for p in ("checkpoint", "checkpoint_every", "resume"):
        if p not in params:
            raise ValueError(f"{name} has no {p!r} parameter: it cannot resume")
    run_on = dict(backend=backend, n_workers=_n_workers(estimator, None if _is_local(backend)
                                                        else backend))
    if reference is None:
        reference = _fit(_variant(estimator, **run_on), X, y, fit_params)
    n_rounds = len(_rounds(reference, rounds)["round"])
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        ckpt = os.path.join(tmp, "checkpoint.zarr")
        stopped = _fit(_variant(estimator, checkpoint=ckpt,
                                callback=lambda r, m: r >= stop_at, **run_on), X, y, fit_params)
        h_stop = _rounds(stopped, rounds)
        last = int(h_stop["round"][-1])
        if not last < n_rounds - 1:
            raise AssertionError(f"{name}: the fit stopped at round {stop_at} ran to round "
                                 f"{last} of the uninterrupted fit's {n_rounds}: choose an "
                                 f"earlier stop_at")
        staleness = int(params.get("staleness", 0) or 0)
        if last < stop_at or (exact_stop and _is_local(backend)
                              and last != stop_at + staleness):
            raise AssertionError(f"{name}: the callback stopped the fit at round {stop_at} "
                                 f"(staleness {staleness}) but its last round was {last}")
        written = CheckpointStore(ckpt).latest()
        if written is None:
            raise AssertionError(f"{name} wrote no checkpoint in the {last + 1} rounds before "
                                 f"it stopped (checkpoint_every={params['checkpoint_every']}): "
                                 f"stop it later")
        if checkpoint_round is not None and _is_local(backend) and written != checkpoint_round:
            raise AssertionError(f"{name}: the last checkpoint of the fit stopped at round "
                                 f"{stop_at} is of round {written}, expected "
                                 f"{checkpoint_round}")
        if other_params:
            try:
                _fit(_variant(estimator, checkpoint=ckpt, resume=True, **run_on,
                              **other_params), X, y, fit_params)
            except ValueError as exc:
                said = f"different fit (differs in: {', '.join(sorted(other_params))})"
                if said not in str(exc):
                    raise AssertionError(f"{name}: resuming with {other_params} was refused, "
                                         f"but the message does not say {said!r}: "
                                         f"{exc}") from exc
            else:
                raise AssertionError(f"{name} resumed a checkpoint written with other "
                                     f"parameters ({other_params}) without complaint")
        resumed = _fit(_variant(estimator, checkpoint=ckpt, resume=True, **run_on,
                                **(resume_params or {})), X, y, fit_params)
    h_res = _rounds(resumed, rounds)
    np_round = np.asarray(h_res["round"])
    expected = n_rounds if same_rounds else len(np_round)
    if not np.array_equal(np_round, np.arange(expected)):
        whose = " (the uninterrupted fit's)" if same_rounds else ""
        raise AssertionError(f"{name}: the resumed fit's {rounds}['round'] is not rounds 0 to "
                             f"{expected - 1}{whose}: {np_round[:5].tolist()} ... "
                             f"{np_round[-3:].tolist()}")
    # the rounds before the checkpoint are the stopped fit's own records (restored with it),
    # the ones from it on were run again
    t_stop, t_res = np.asarray(h_stop["time"]), np.asarray(h_res["time"])
    if not np.array_equal(t_res[:written], t_stop[:written]):
        raise AssertionError(f"{name}: the resumed fit did not restore the stopped fit's "
                             f"history of the {written} rounds before its checkpoint of round "
                             f"{written}")
    if written < len(t_stop) and t_res[written] == t_stop[written]:
        raise AssertionError(f"{name}: the resumed fit did not run again from round "
                             f"{written}, its checkpoint's")
    assert_same_fit(resumed, reference, result=result, rtol=rtol, atol=atol, history=history,
                    rounds=rounds, same_rounds=same_rounds,
                    what=f"{name} resumed against uninterrupted")
    return resumed


def check_worker_loss(estimator, X, y=None, *, client, at=None, fit_params=None,
                      result=None, rtol=0.0, atol=0.0, history=(),
                      rounds: str = "history_", same_rounds: bool = True, reference=None,
                      directory=None):
    """A fit on ``client``'s cluster that loses a worker process (SIGKILL) recovers once and
    ends with the undisturbed result.

    The kill is sent when the callback sees round ``at``; it lands a moment later, in a
    push, a barrier or a checkpoint write.  An estimator with a ``checkpoint`` parameter
    writes a checkpoint every ``checkpoint_every`` rounds (it then recovers from one); one
    without recovers as it can (e.g. from the driver's copy of the model).  The check waits
    for the cluster to be whole again before it returns.

    Parameters
    ----------
    at : int or callable, optional
        The round (default: a third of the undisturbed fit's rounds), or
        ``at(round, metrics) -> bool``.
    same_rounds : bool
        As in `check_resume`: False when the recovered fit may reach the result in other
        rounds.
    reference : fitted estimator, optional
        The undisturbed fit with the same parameters (default: made in process).
    """
    name = type(estimator).__name__
    n_cluster = len(worker_addresses(client))
    if reference is None:
        reference = fit_local(estimator, X, y, fit_params=fit_params, client=client)
    n_rounds = len(_rounds(reference, rounds)["round"])
    if at is None:
        at = max(1, n_rounds // 3)
    due = at if callable(at) else (lambda r, m: r >= at)
    kill, fired = kill_when(client, due)

    params = estimator.get_params()
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        extra = ({"checkpoint": os.path.join(tmp, "checkpoint.zarr")} if "checkpoint" in params
                 else {})
        wait_for_workers(client, n_cluster)
        try:
            est = _fit(_variant(estimator, backend=client, callback=kill,
                                n_workers=_n_workers(estimator, client), **extra),
                       X, y, fit_params)
        finally:
            wait_for_workers(client, n_cluster)
    if not fired:
        raise AssertionError(f"{name}: the fit ended before round {at}, when the worker was "
                             f"to be killed")
    if len(est.recoveries_) != 1:
        raise AssertionError(f"{name}: a worker killed at round {fired[0][0]}, but the fit "
                             f"recovered from {len(est.recoveries_)} losses: "
                             f"{est.recoveries_}")
    h = _rounds(est, rounds)
    if "worker_losses" in h:
        losses = np.asarray(h["worker_losses"])
        kept = est.recoveries_[0].get("resumed_round", 0) > 0
        if losses[-1] != 1 or np.any(np.diff(losses) < 0) or (kept and losses[0] != 0):
            raise AssertionError(f"{name}: {rounds}['worker_losses'] should count the loss "
                                 f"from the rounds run after it on (0 ... 1); it is "
                                 f"{losses.tolist()}")
    assert_same_fit(est, reference, result=result, rtol=rtol, atol=atol, history=history,
                    rounds=rounds, same_rounds=same_rounds,
                    what=f"{name} after a worker loss against undisturbed")
    return est


# ----------------------------------------------------------------------- input and objects


def _rows(X, s):
    if sp.issparse(X):
        return X.tocsr()[s].asformat(X.format)
    return np.asarray(X)[s]


def _with_value(X, value):
    X = X.copy()
    if sp.issparse(X):
        X.data[0] = value
    else:
        X = np.asarray(X, dtype=float).copy()
        X.flat[0] = value
    return X


def _dense(X):
    return X.toarray() if sp.issparse(X) else np.asarray(X)


def bad_inputs(X, y=None) -> dict:
    """``{what: fit arguments}``: the data ``X`` (and ``y``) spoilt in the ways every fit must
    refuse: a NaN, an infinity, 1-D and 3-D arrays, no samples; a ``y`` of another length or
    with a NaN."""
    rest = () if y is None else (y,)
    cases = {"X with a NaN": (_with_value(X, np.nan), *rest),
             "X with an infinity": (_with_value(X, np.inf), *rest),
             "1-D X": (_dense(X)[:, 0], *rest),
             "3-D X": (_dense(X)[:, :, None], *rest),
             "X without samples": (_rows(X, slice(0, 0)),
                                   *(np.asarray(v)[:0] for v in rest))}
    if y is not None:
        y = np.asarray(y)
        cases["y one sample short"] = (X, y[:-1])
        if y.dtype.kind == "f":
            cases["y with a NaN"] = (X, _with_value(y, np.nan))
    return cases


def check_refuses_bad_input(estimator, X, y=None, *, fit_params=None):
    """``fit`` refuses `bad_inputs` with a ``ValueError`` (or ``TypeError``) that says why,
    and a fitted estimator with ``n_features_in_`` refuses data with another number of
    features in its predicting methods.  Fits in process."""
    name = type(estimator).__name__
    local = _variant(estimator, backend="local")
    for what, args in bad_inputs(X, y).items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                local.fit(*args, **(fit_params or {}))
        except (ValueError, TypeError) as exc:
            if not str(exc).strip():
                raise AssertionError(f"{name}.fit refused {what} with an empty "
                                     f"{type(exc).__name__}") from exc
        except Exception as exc:
            raise AssertionError(f"{name}.fit refused {what} with {type(exc).__name__} "
                                 f"({exc}), not a ValueError") from exc
        else:
            raise AssertionError(f"{name}.fit accepted {what}")
    fitted = _fit(_variant(estimator, backend="local"), X, y, fit_params)
    if not hasattr(fitted, "n_features_in_"):
        return
    narrow = _dense(X)[:, :-1]
    for method in _output_methods(fitted):
        try:
            getattr(fitted, method)(*_args(narrow, None if method != "score" else y))
        except ValueError:
            continue
        except Exception as exc:
            raise AssertionError(f"{name}.{method} refused X with "
                                 f"{fitted.n_features_in_ - 1} features (fitted with "
                                 f"{fitted.n_features_in_}) with {type(exc).__name__}, not a "
                                 f"ValueError: {exc}") from exc
        raise AssertionError(f"{name}.{method} accepted X with {fitted.n_features_in_ - 1} "
                             f"features; it was fitted with {fitted.n_features_in_}")


def _output_methods(estimator) -> list:
    """`OUTPUT_METHODS` of ``estimator`` callable with the data alone (``score``: and y)."""
    found = []
    for method in OUTPUT_METHODS:
        fn = getattr(estimator, method, None)
        if fn is None:
            continue
        required = [p for p in inspect.signature(fn).parameters.values()
                    if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY,
                                                           p.POSITIONAL_OR_KEYWORD)]
        if len(required) == 1:
            found.append(method)
    return found


def _outputs(estimator, X, y) -> dict:
    return {m: getattr(estimator, m)(*_args(X, y if m == "score" else None))
            for m in _output_methods(estimator)}


def check_pickle(estimator, X, y=None, *, fit_params=None, fitted=None, result=None,
                 outputs=None):
    """A fitted estimator survives ``pickle``: the same parameters, fitted attributes and
    outputs (`OUTPUT_METHODS` that take the data alone, or ``outputs(estimator) -> dict``).

    ``fitted``: a fit made in process (one whose ``backend`` is a string); made here when not
    given.
    """
    name = type(estimator).__name__
    fitted = fitted or _fit(_variant(estimator, backend="local"), X, y, fit_params)
    try:
        blob = pickle.dumps(fitted)
    except Exception as exc:
        raise AssertionError(f"a fitted {name} cannot be pickled: {type(exc).__name__}: "
                             f"{exc}") from exc
    restored = pickle.loads(blob)
    if type(restored) is not type(fitted):
        raise AssertionError(f"{name} unpickled as {type(restored).__name__}")
    assert_same(restored.get_params(deep=False), fitted.get_params(deep=False),
                what=f"{name}'s parameters after pickling")
    assert_same((result or fitted_result)(restored), (result or fitted_result)(fitted),
                what=f"{name}'s fitted attributes after pickling")
    outputs = outputs or (lambda est: _outputs(est, X, y))
    want = outputs(fitted)
    try:
        got = outputs(restored)
    except Exception as exc:
        raise AssertionError(f"the unpickled {name} cannot give its outputs: "
                             f"{type(exc).__name__}: {exc}") from exc
    assert_same(got, want, what=f"{name}'s outputs after pickling")
    return restored


def check_clone(estimator, X, y=None, *, client=None, fit_params=None, fitted=None,
                result=None):
    """``sklearn.base.clone`` gives an unfitted estimator with the same parameters (a
    ``Client`` as ``backend`` and the ``callback`` kept by reference: a connection and a
    function, not values), and a clone of a fitted estimator fits to the same result.

    ``fitted``: a fit of ``estimator`` in process (made here when not given).
    """
    name = type(estimator).__name__
    backend = client if client is not None else "local"
    original = _variant(estimator, backend=backend, callback=_never_stop)
    try:
        twin = clone(original)
    except Exception as exc:
        raise AssertionError(f"clone({name}) with backend {backend!r} failed: "
                             f"{type(exc).__name__}: {exc}") from exc
    if twin is original:
        raise AssertionError(f"clone({name}) returned the estimator itself")
    if twin.backend is not backend or twin.callback is not _never_stop:
        raise AssertionError(f"clone({name}) did not keep its backend and callback (the same "
                             f"objects): backend {twin.backend!r}, callback "
                             f"{twin.callback!r}")
    assert_same(twin.get_params(deep=False), original.get_params(deep=False),
                what=f"clone({name})'s parameters")
    fitted = fitted or _fit(_variant(estimator, backend="local"), X, y, fit_params)
    again = clone(fitted)
    left = _fitted_names(again)
    if left:
        raise AssertionError(f"clone of a fitted {name} kept fitted attributes {left}")
    _fit(again, X, y, fit_params)
    assert_same((result or fitted_result)(again), (result or fitted_result)(fitted),
                what=f"{name}: the fit of a clone against the original's")
    return again


def _never_stop(round, metrics) -> bool:
    return False
