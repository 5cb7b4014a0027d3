"""scikit-learn's estimator checks for LDA and the binary autoencoder, and what every dmp
estimator inherits from `dmp.base.DMPEstimator` (parameters, backend, the fitting path)."""

import pathlib

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.base import clone
from sklearn.utils._param_validation import InvalidParameterError
from sklearn.utils.estimator_checks import check_estimator, parametrize_with_checks

from dmp.base import DMPEstimator
from dmp.decomposition import LatentDirichletAllocation, MatrixFactorization
from dmp.engine import LocalBackend
from dmp.hashing import BinaryAutoencoder
from dmp.linear_model import Lasso, SparsifiedSGDClassifier, SparsifiedSGDRegressor

ESTIMATORS = [Lasso, SparsifiedSGDRegressor, SparsifiedSGDClassifier,
              LatentDirichletAllocation, MatrixFactorization, BinaryAutoencoder]
WITH_CHECKPOINTS = [e for e in ESTIMATORS if e is not BinaryAutoencoder]


def _small_lda(cls=LatentDirichletAllocation):
    return cls(n_components=2, max_iter=5, transform_max_iter=4, backend="local",
               random_state=0)


def _small_ba():
    return BinaryAutoencoder(n_bits=2, max_iter=3, itq_iter=3, validation_size=0,
                             backend="local", random_state=0)


@parametrize_with_checks([_small_lda(), _small_ba()],
                         expected_failed_checks=lambda est: est._expected_failed_checks())
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)


def _integers(a):
    """Non-negative values as positive integers (no empty document), negative ones as
    negative integers, NaN and infinities unchanged."""
    with np.errstate(invalid="ignore"):
        return np.where(a < 0, np.floor(3 * a) - 1, np.ceil(3 * a) + 1)


def _as_counts(X):
    """Real test data of scikit-learn's checks as integers (token counts where they are
    non-negative); anything else (strings, complex values) unchanged."""
    if sp.issparse(X):
        return type(X)(_integers(X.toarray())) if X.dtype.kind in "fiu" else X
    a = np.asarray(X)
    try:
        real = a.astype(np.float64) if a.dtype == object else a
    except (TypeError, ValueError):
        return X
    if real.dtype.kind not in "fiu":
        return X
    return _integers(real).astype(object) if a.dtype == object else _integers(real)


class _CountsLDA(LatentDirichletAllocation):
    """LDA fed scikit-learn's test data turned into token counts."""

    def _expected_failed_checks(self):
        return {}

    def fit(self, X, y=None):
        return super().fit(_as_counts(X))

    def transform(self, X):
        return super().transform(_as_counts(X))

    def score(self, X, y=None):
        return super().score(_as_counts(X))


def test_lda_fails_its_expected_checks_only_for_the_data():
    lda = _small_lda()
    expected = lda._expected_failed_checks()
    assert expected and all(expected.values())
    results = check_estimator(lda, on_fail=None, on_skip=None,
                              expected_failed_checks=expected)
    failed = {r["check_name"] for r in results if r["status"] in ("failed", "xfail")}
    # each expected failure does fail (none is stale), and nothing else does
    assert failed == set(expected)
    for r in results:
        if r["status"] == "xfail":
            e = r["exception"]
            cause = e if isinstance(e, ValueError) else e.__cause__ or e.__context__
            assert isinstance(cause, ValueError), (r["check_name"], e)
            assert ("non-integer counts" in str(cause) or "empty document" in str(cause)
                    or "negative counts" in str(cause)), (r["check_name"], cause)
    # the same data as token counts, documents non-empty: every check passes
    check_estimator(_small_lda(_CountsLDA), on_skip=None)


def test_ba_expects_no_failed_check():
    assert _small_ba()._expected_failed_checks() == {}


def test_ba_and_lda_refuse_bad_points_in_sklearn_words():
    ba = _small_ba().fit(np.random.default_rng(0).random((40, 4)))
    with pytest.raises(ValueError, match="X has 3 features, but BinaryAutoencoder is "
                                         "expecting 4 features as input"):
        ba.transform(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="Reshape your data"):
        ba.transform(np.zeros(4))
    with pytest.raises(TypeError, match="Sparse data was passed"):
        ba.transform(sp.csr_matrix(np.ones((2, 4))))
    with pytest.raises(ValueError, match="1 sample"):
        _small_ba().fit(np.ones((1, 4)))
    with pytest.raises(ValueError, match="n_features=1"):
        _small_ba().fit(np.ones((5, 1)))
    obj = np.random.default_rng(1).random((40, 4)).astype(object)
    assert _small_ba().fit(obj).n_features_in_ == 4
    lda = _small_lda().fit(sp.csr_matrix(np.ones((6, 4))))
    with pytest.raises(ValueError, match="X has 5 features, but LatentDirichletAllocation is "
                                         "expecting 4 features as input"):
        lda.transform(np.ones((2, 5)))
    with pytest.raises(ValueError, match="Complex data not supported"):
        _small_lda().fit(np.ones((3, 4)) + 1j)
    with pytest.raises(ValueError, match="Negative values in data"):
        _small_lda().fit(-np.ones((3, 4)))


# --------------------------------------------------------------------------- the base
@pytest.mark.parametrize("cls", ESTIMATORS, ids=lambda c: c.__name__)
def test_every_estimator_derives_from_the_base_and_inherits_its_parameters(cls):
    assert issubclass(cls, DMPEstimator)
    own = cls._parameter_constraints
    for name, constraint in DMPEstimator._parameter_constraints.items():
        assert own[name] is constraint
    if cls in WITH_CHECKPOINTS:
        for name, constraint in DMPEstimator._checkpoint_constraints.items():
            assert own[name] is constraint
    else:
        assert "checkpoint" not in cls().get_params()
    if cls is not LatentDirichletAllocation:
        assert cls()._expected_failed_checks() == {}


@pytest.mark.parametrize("cls", ESTIMATORS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("backend", [3, "cluster", object()], ids=["int", "str", "object"])
def test_a_bad_backend_is_refused_by_parameter_validation(cls, backend):
    with pytest.raises(InvalidParameterError, match=r"The 'backend' parameter of "
                       rf"{cls.__name__} must be .*distributed\.Client.* an object "
                       r"implementing 'start', 'step' and 'close'"):
        cls(backend=backend).fit(np.ones((4, 4)), np.ones(4))


@pytest.mark.parametrize("cls", WITH_CHECKPOINTS, ids=lambda c: c.__name__)
def test_checkpoint_is_a_path_and_resume_needs_one(cls, tmp_path):
    with pytest.raises(InvalidParameterError, match="The 'checkpoint' parameter"):
        cls(checkpoint=3).fit(np.ones((4, 4)), np.ones(4))
    assert cls(checkpoint=pathlib.Path(tmp_path))._validate_params() is None
    with pytest.raises(ValueError, match="^resume=True needs a checkpoint location$"):
        cls(resume=True, backend="local").fit(np.ones((4, 4)), np.ones(4))


class _CountingBackend(LocalBackend):
    closed = 0

    def close(self):
        self.closed += 1
        super().close()


def test_a_backend_instance_is_used_and_closed_even_when_the_data_is_refused():
    X = np.random.default_rng(0).random((20, 5))
    y = X @ np.arange(5.0)
    backend = _CountingBackend()
    m = Lasso(alpha=0.01, backend=backend).fit(X, y)
    assert backend.closed == 1 and m.coef_.shape == (5,)
    assert clone(m).backend is backend
    X[3, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        Lasso(backend=backend).fit(X, y)
    assert backend.closed == 2


def test_moved_names_still_import():
    from dmp.linear_model._lasso import seed_from as old
    from dmp.utils.estimator import SharedBackendMixin, seed_from

    assert old is seed_from and seed_from(7) == 7
    assert issubclass(Lasso, SharedBackendMixin)
    assert DMPEstimator.__module__ == "dmp.base"
