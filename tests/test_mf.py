"""MatrixFactorization (STRADS CCD / CCD++) against a serial numpy reference, invariants,
statistical quality, and bad input."""

import dask
import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.base import clone

from dmp.decomposition import MatrixFactorization
from dmp.engine.backends.local import LocalBackend

from mf_reference import low_rank_ratings, serial_mf


def small_problem(seed=0, n=40, m=25, density=0.3):
    rng = np.random.default_rng(seed)
    R = sp.random(n, m, density=density, random_state=seed, format="coo")
    R.data = rng.standard_normal(R.nnz) + 3.0
    return R


def gathered(backend):
    """(W, H) assembled from the partitions' current states (in-process backend)."""
    parts = [w.program.factors(w.state) for w in backend.workers]
    return np.vstack([p[1] for p in parts]), np.vstack([p[3] for p in parts])


@pytest.mark.parametrize("method,n_inner,block_size", [
    ("ccd", 1, "auto"), ("ccd", 1, 2), ("ccd++", 1, "auto"), ("ccd++", 3, "auto"),
    ("als", 1, "auto"), ("als", 1, 3)])
@pytest.mark.parametrize("n_workers", [1, 2, 3])
@pytest.mark.parametrize("reg_scaling", ["none", "count"])
def test_matches_serial_reference(method, n_inner, block_size, n_workers, reg_scaling):
    R = small_problem()
    k, alpha, n_iter = 4, 0.3, 4
    mf = MatrixFactorization(k, alpha=alpha, method=method, n_inner=n_inner,
                             block_size=block_size, max_iter=n_iter, tol=None,
                             reg_scaling=reg_scaling, backend="local", n_workers=n_workers,
                             random_state=7).fit(R)
    W, H, traj, mu = serial_mf(R, k, alpha, n_iter, 7, method, n_inner,
                               reg_scaling=reg_scaling, block_size=mf.block_size_)
    h = mf.history_
    if method in ("ccd", "als"):  # objective at the end of each half-iteration
        got = np.asarray([h["objective"][r] for r in range(1, len(h["phase"]))
                          if r == len(h["phase"]) - 1 or h["phase"][r] != h["phase"][r + 1]])
    else:  # one round per feature pass: the objective after its item update
        got = h["objective"][1:]
        traj = traj[1::2]
    assert len(got) == len(traj)
    np.testing.assert_allclose(got, traj, rtol=1e-10)
    np.testing.assert_allclose(mf.user_factors_, W, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(mf.item_factors_, H, rtol=1e-10, atol=1e-12)
    assert mf.mean_ == pytest.approx(mu, rel=1e-14)
    assert mf.objective_ == pytest.approx(mf.objective(R), rel=1e-10)


@pytest.mark.parametrize("method", ["ccd", "ccd++", "als"])
def test_objective_never_increases(method):
    tr, te = low_rank_ratings(n=120, m=80, k=4, density=0.3, noise=0.3, seed=2)
    mf = MatrixFactorization(6, alpha=0.1, method=method, max_iter=15, tol=None,
                             block_size=2, backend="local", n_workers=2, random_state=0)
    mf.fit(tr, X_val=te)
    f = mf.history_["objective"][1:]
    assert np.all(np.diff(f) <= 1e-12 * f[:-1])
    assert f[-1] < 0.2 * f[0]


def test_ccd_residuals_are_exact_after_every_half_iteration():
    """At the end of each W half the user-side residual copies equal r - mu - W H^T; at the
    end of each H half the item-side copies do (train and validation)."""
    tr, te = low_rank_ratings(n=60, m=45, k=3, density=0.35, seed=4)
    backend = LocalBackend(3)
    checked = []

    def check(rnd, rec):
        if rec["phase"] == "init":
            return False
        W, H = gathered(backend)
        for w in backend.workers:
            st = w.state
            r0, c0 = st["r0"], st["c0"]
            for key, res in (("rows", "er"), ("vrows", "evr"), ("cols", "ec"),
                             ("vcols", "evc")):
                if (rec["phase"] == "W") != key.endswith("rows"):
                    continue
                indptr, indices, data = st[key]
                n_local = len(indptr) - 1
                own = np.repeat(np.arange(n_local), np.diff(indptr))
                if key.endswith("rows"):
                    pred = np.einsum("ij,ij->i", W[r0 + own], H[indices])
                else:
                    pred = np.einsum("ij,ij->i", W[indices], H[c0 + own])
                np.testing.assert_allclose(st[res], data - mf_mean[0] - pred, rtol=0,
                                           atol=1e-11)
        checked.append(rec["phase"])
        return False

    mf_mean = [tr.data.mean()]
    mf = MatrixFactorization(4, alpha=0.2, method="ccd", max_iter=4, tol=None,
                             backend=backend, random_state=1, callback=check)
    mf.fit(tr, X_val=te)
    assert checked.count("W") == 4 and checked.count("H") == 4
    assert mf.mean_ == pytest.approx(mf_mean[0])


@pytest.mark.parametrize("method", ["ccd", "ccd++", "als"])
def test_reported_metrics_equal_recomputed_ones_every_round(method):
    tr, te = low_rank_ratings(n=50, m=40, k=3, density=0.4, seed=5)
    backend = LocalBackend(2)
    seen = []

    def check(rnd, rec):
        if rec["phase"] == "init":
            return False
        W, H = gathered(backend)   # CCD++: each partition solves the item column itself
        mu = tr.data.mean()
        e = tr.data - mu - np.einsum("ij,ij->i", W[tr.row], H[tr.col])
        ev = te.data - mu - np.einsum("ij,ij->i", W[te.row], H[te.col])
        obj = e @ e + 0.2 * ((W * W).sum() + (H * H).sum())
        assert rec["objective"] == pytest.approx(obj, rel=1e-11)
        assert rec["train_rmse"] == pytest.approx(np.sqrt(np.mean(e * e)), rel=1e-10)
        assert rec["valid_rmse"] == pytest.approx(np.sqrt(np.mean(ev * ev)), rel=1e-10)
        seen.append(rnd)
        return False

    MatrixFactorization(3, alpha=0.2, method=method, max_iter=3, tol=None, block_size=2,
                        backend=backend, random_state=0, callback=check).fit(tr, X_val=te)
    assert len(seen) == (9 if method == "ccd++" else 12)


@pytest.mark.parametrize("n_workers", [1, 3])
@pytest.mark.parametrize("valid", [False, True])
def test_ccdpp_in_batches_in_process_equals_one_round_a_call(n_workers, valid):
    """`LocalBackend(batches=True)` runs CCD++'s rounds in batches as the Dask backend does:
    a batch's inner rounds are scored by partition 0 (`Program.close_batch`) and reach the
    driver without the item vectors, and the fit is the one-round-a-call fit to the bit."""
    tr, te = low_rank_ratings(n=60, m=200, k=3, density=0.3, seed=7)

    def fit(batches):
        backend = LocalBackend(n_workers, batches=batches)
        mf = MatrixFactorization(4, alpha=0.1, method="ccd++", max_iter=3, tol=None,
                                 backend=backend, random_state=0)
        return mf.fit(tr, X_val=te if valid else None)

    one = fit(False)
    # batches grow 4x at a time up to the program's bound, however slow the first rounds
    with dask.config.set({"dmp.batch.target-duration": "1h"}):
        batched = fit(True)
    for key in ("objective", "train_rmse", "valid_rmse", "phase"):
        np.testing.assert_array_equal(batched.history_[key], one.history_[key])
    np.testing.assert_array_equal(batched.user_factors_, one.user_factors_)
    np.testing.assert_array_equal(batched.item_factors_, one.item_factors_)
    firsts = set(batched.history_["batch"])
    assert len(firsts) < len(batched.history_["round"])   # some rounds ran in batches
    inner = [b for r, b in zip(batched.history_["round"], batched.history_["bytes_push"])
             if r + 1 not in firsts and r > 0 and r + 1 < len(batched.history_["round"])]
    # each partition's item sums (two vectors of 200 float64) stay on the partitions
    assert inner and max(inner) < 200 * 8 < min(one.history_["bytes_push"][1:])


@pytest.mark.parametrize("method", ["ccd++", "ccd"])
def test_partition_sizes_read_each_pointer_from_the_store_once(tmp_path, method):
    """The memory check before a fit sizes every partition (`Program.partition_nbytes`):
    the driver reads each split's pointer from the store once, not once a partition, and
    the copy it keeps does not travel to the workers with the program."""
    import pickle

    from dmp.decomposition._mf_program import MFProgram
    from dmp.io import open_dataset
    from dmp.io.ratings import write_ratings

    tr, te = low_rank_ratings(n=300, m=200, k=3, density=0.2, seed=2)
    users = np.concatenate([tr.row, te.row])
    items = np.concatenate([tr.col, te.col])
    split = np.repeat(np.array([0, 1], np.int8), [tr.nnz, te.nnz])
    write_ratings(str(tmp_path / "r.zarr"), users, items, np.concatenate([tr.data, te.data]),
                  shape=tr.shape, split=split)
    ds = open_dataset(str(tmp_path / "r.zarr"))
    reads = []
    for name in ("row_indptr", "col_indptr"):
        def counted(split="train", _read=getattr(ds, name), _name=name):
            reads.append((_name, split))
            return _read(split)
        setattr(ds, name, counted)
    program = MFProgram(ds, method=method, n_components=4, alpha=0.1)
    specs = program.partition_specs(8)
    reads.clear()   # (the split into partitions reads the training pointers itself)
    sizes = [program.partition_nbytes(spec) for spec in specs]
    assert len(reads) == len(set(reads)) <= 4 and all(s > 0 for s in sizes)
    # each partition's ratings (train and validation), counted from the ratings themselves
    for spec in specs:
        for axis, ids, (a, b) in ((0, users, spec["rows"]), (1, items, spec["cols"])):
            assert program._nnz(axis, a, b) == np.count_nonzero((ids >= a) & (ids < b))
    assert len(reads) == len(set(reads)) <= 4
    del ds.row_indptr, ds.col_indptr   # the dataset's own methods again
    assert "_indptrs" not in pickle.loads(pickle.dumps(program)).__dict__
    program.start(8)   # the partitions exist: the driver lets the pointers go
    assert "_indptrs" not in program.__dict__


@pytest.mark.parametrize("method", ["ccd++", "ccd", "als"])
def test_test_rmse_reaches_the_noise_level(method):
    """Well-posed synthetic data: ~700 ratings per user-factor parameter group; the test RMSE
    must come within 2% of the noise standard deviation."""
    noise = 0.25
    tr, te = low_rank_ratings(n=400, m=300, k=3, density=0.6, noise=noise, seed=3)
    mf = MatrixFactorization(3, alpha=1.0, method=method, max_iter=60, tol=1e-7,
                             backend="local", n_workers=2, random_state=0).fit(tr)
    rmse = -mf.score(te)
    assert rmse < 1.02 * noise, rmse
    assert rmse > 0.9 * noise  # sanity: not fitting the test noise


@pytest.mark.parametrize("n_workers", [1, 3])
def test_als_with_as_many_cg_steps_as_coordinates_is_exact_als(n_workers):
    """CG solves a B-dimensional system in B steps: block ALS then equals alternating exact
    least-squares solves (np.linalg.solve on each row's normal equations)."""
    R = small_problem(seed=5, n=50, m=30, density=0.25)
    k, alpha, n_iter = 4, 0.2, 3
    mf = MatrixFactorization(k, alpha=alpha, method="als", cg_steps=k, max_iter=n_iter,
                             tol=None, reg_scaling="count", backend="local",
                             n_workers=n_workers, random_state=2).fit(R)
    W, H, traj, _ = serial_mf(R, k, alpha, n_iter, 2, "als", reg_scaling="count",
                              cg_steps=None)
    np.testing.assert_allclose(mf.user_factors_, W, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(mf.item_factors_, H, rtol=1e-7, atol=1e-9)
    assert mf.objective_ == pytest.approx(traj[-1], rel=1e-9)


@pytest.mark.parametrize("B", [4, 13, 64])
def test_vectorised_kernels_do_not_depend_on_where_arrays_lie(B):
    """The kernels' reassociated sums must come out bit for bit the same wherever the
    arrays lie (else a Dask worker and the driver would fit differently): the same inputs
    copied to buffers at shifted addresses give the same results."""
    from dmp.kernels.mf import cg_block_update, subtract_lowrank

    rng = np.random.default_rng(B)
    n, m = 30, 20
    A = sp.random(n, m, density=0.4, random_state=1, format="csr")
    ip, ix = A.indptr.astype(np.int64), A.indices.astype(np.int32)
    res = rng.standard_normal(A.nnz)
    F, O = rng.standard_normal((n, B)), rng.standard_normal((m, B))
    lam = np.full(n, 0.1)

    def placed(a, off):
        buf = np.empty(a.size + 8)
        out = buf[off:off + a.size].reshape(a.shape)
        out[:] = a
        return out

    results, keep = [], []
    for off in list(range(8)) * 4:
        keep.append(np.empty(rng.integers(1, 64)))   # the kernels' own buffers move too
        Fo, r, d = placed(F, off), placed(res, off), np.empty((n, B))
        cg_block_update(ip, ix, r, Fo, 0, placed(O, off), lam, d, 3, res, 0.0, True)
        r2 = placed(res, (off + 3) % 8)
        subtract_lowrank(ip, ix, r2, placed(F, off), 0, placed(O, 7 - off))
        results.append((Fo.copy(), r.copy(), d, r2.copy()))
    for got in results[1:]:
        for g, w in zip(got, results[0]):
            np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("method", ["als", "ccd"])
def test_float32_fits_track_the_float64_fit(method):
    """dtype=float32: the same iterations at float32 accuracy; the factors are float32 and
    the reported objective is the exact objective of those float32 factors."""
    tr, te = low_rank_ratings(n=80, m=60, k=3, density=0.3, noise=0.2, seed=6)
    kw = dict(alpha=0.1, method=method, max_iter=6, tol=None, reg_scaling="count",
              backend="local", n_workers=2, random_state=1)
    a = MatrixFactorization(5, **kw).fit(tr, X_val=te)
    b = MatrixFactorization(5, dtype=np.float32, **kw).fit(tr, X_val=te)
    assert b.user_factors_.dtype == np.float32 and b.item_factors_.dtype == np.float32
    assert a.user_factors_.dtype == np.float64
    np.testing.assert_allclose(b.history_["objective"], a.history_["objective"], rtol=1e-4)
    np.testing.assert_allclose(b.history_["valid_rmse"], a.history_["valid_rmse"], rtol=1e-4)
    np.testing.assert_allclose(b.predict(te.row, te.col), a.predict(te.row, te.col),
                               rtol=0, atol=1e-3)
    W, H = b.user_factors_.astype(np.float64), b.item_factors_.astype(np.float64)
    e = tr.data - b.mean_ - np.einsum("ij,ij->i", W[tr.row], H[tr.col])
    cu, ci = np.bincount(tr.row, minlength=80), np.bincount(tr.col, minlength=60)
    obj = e @ e + 0.1 * (cu @ (W * W).sum(1) + ci @ (H * H).sum(1))
    assert b.objective_ == pytest.approx(obj, rel=1e-5)


def test_cg_block_update_against_exact_rows():
    """The kernel on a block of coordinates: rows without entries go to 0, the others take
    `block_least_squares`' CG steps, ``delta`` is the change and the residual stays
    ``e - O (x - x0)``; with ``fresh`` the residual is first recomputed from the ratings."""
    from dmp.kernels.mf import cg_block_update
    from mf_reference import block_least_squares

    rng = np.random.default_rng(3)
    n, m, K, k0, B = 30, 20, 7, 2, 4
    A = sp.random(n, m, density=0.3, random_state=4, format="csr")
    A[[3, 11]] = 0.0
    A.eliminate_zeros()
    A.sort_indices()
    indptr, indices = A.indptr.astype(np.int64), A.indices.astype(np.int32)
    res = rng.standard_normal(A.nnz)
    F = rng.standard_normal((n, K))
    O = rng.standard_normal((m, B))
    lam = rng.uniform(0.1, 1.0, n)
    lam[3] = 0.0
    for steps in (1, 2, B):
        F2, res2, delta = F.copy(), res.copy(), np.full((n, B), np.nan)
        cg_block_update(indptr, indices, res2, F2, k0, O, lam, delta, steps, res, 0.0, False)
        for i in range(n):
            p = slice(indptr[i], indptr[i + 1])
            Oi = O[indices[p]]
            x0 = F[i, k0:k0 + B]
            x = block_least_squares(Oi, res[p], x0, lam[i], steps)
            np.testing.assert_allclose(F2[i, k0:k0 + B], x, rtol=1e-11, atol=1e-12)
            np.testing.assert_allclose(delta[i], x - x0, rtol=1e-11, atol=1e-12)
            np.testing.assert_allclose(res2[p], res[p] - Oi @ (x - x0), rtol=1e-11,
                                       atol=1e-12)
        np.testing.assert_array_equal(F2[:, :k0], F[:, :k0])      # other coordinates
        np.testing.assert_array_equal(F2[:, k0 + B:], F[:, k0 + B:])
        np.testing.assert_array_equal(F2[[3, 11], k0:k0 + B], 0.0)

    # a block of all K coordinates, the residual stale: recomputed from the ratings first
    F = F[:, :B].copy()
    rows = np.repeat(np.arange(n), np.diff(indptr))
    ratings = res + 2.5 + np.einsum("ij,ij->i", F[rows], O[indices])
    got = F.copy(), np.zeros_like(res), np.empty((n, B))
    cg_block_update(indptr, indices, got[1], got[0], 0, O, lam, got[2], 3, ratings, 2.5, True)
    want = F.copy(), res.copy(), np.empty((n, B))
    cg_block_update(indptr, indices, want[1], want[0], 0, O, lam, want[2], 3, ratings, 0.0,
                    False)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


def test_more_workers_same_result_and_convergence_stop():
    R = small_problem(seed=3, n=60, m=50)
    kw = dict(alpha=0.5, max_iter=500, tol=1e-4, random_state=0)
    a = MatrixFactorization(3, backend="local", n_workers=1, **kw).fit(R)
    b = MatrixFactorization(3, backend="local", n_workers=4, **kw).fit(R)
    np.testing.assert_allclose(a.user_factors_, b.user_factors_, rtol=1e-9, atol=1e-11)
    assert a.n_iter_ == b.n_iter_ < 500
    it = a.history_["iteration"]
    f_end = a.history_["objective"][np.r_[it[1:] != it[:-1], True]][1:]
    assert len(f_end) == a.n_iter_
    assert (f_end[-2] - f_end[-1]) <= 1e-4 * f_end[-2] < (f_end[-3] - f_end[-2])


def test_predict_and_score_against_numpy():
    tr, te = low_rank_ratings(n=50, m=30, k=2, seed=1)
    mf = MatrixFactorization(2, alpha=0.1, max_iter=10, backend="local",
                             random_state=0).fit(tr)
    pred = mf.predict(te.row, te.col)
    ref = mf.mean_ + np.einsum("ij,ij->i", mf.user_factors_[te.row], mf.item_factors_[te.col])
    np.testing.assert_allclose(pred, ref, rtol=1e-13)
    assert mf.score(te) == pytest.approx(-np.sqrt(np.mean((te.data - ref) ** 2)), rel=1e-12)
    assert mf.score((te.row, te.col, te.data)) == mf.score(te)
    with pytest.raises(ValueError, match="out of range"):
        mf.predict([0, 50], [0, 1])
    with pytest.raises(ValueError, match="differ in length"):
        mf.predict([0, 1], [0])


def test_user_without_training_ratings_predicts_the_mean():
    R = small_problem(n=30, m=20).tocsr()
    R = sp.vstack([R, sp.csr_matrix((1, 20))]).tocoo()  # user 30 has no ratings
    mf = MatrixFactorization(3, alpha=0.1, max_iter=5, backend="local", n_workers=2,
                             random_state=0).fit(R)
    assert mf.user_factors_.shape == (31, 3)
    np.testing.assert_array_equal(mf.user_factors_[30], 0.0)
    np.testing.assert_allclose(mf.predict([30, 30], [0, 5]), mf.mean_)


def test_explicit_zero_ratings_are_observations():
    u = np.array([0, 0, 1, 1, 2])
    i = np.array([0, 1, 0, 1, 1])
    r = np.array([0.0, 1.0, 0.0, 2.0, 0.0])
    mf = MatrixFactorization(1, alpha=0.01, max_iter=50, center=False, backend="local",
                             random_state=0).fit((u, i, r))
    # the three zero ratings pull the predictions of their cells towards 0
    assert np.abs(mf.predict(u[r == 0], i[r == 0])).max() < 0.3


@pytest.mark.parametrize("bad,match", [
    ((np.array([0, 0]), np.array([1, 1]), np.array([1.0, 2.0])), "uplicate"),
    ((np.array([0, 1]), np.array([1, 0]), np.array([1.0, np.nan])), "NaN|finite"),
    ((np.array([0, -1]), np.array([1, 0]), np.array([1.0, 2.0])), "negative|range"),
    ((np.array([], int), np.array([], int), np.array([])), "no ratings|empty"),
])
def test_bad_ratings_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        MatrixFactorization(2, backend="local").fit(bad)


def test_bad_arguments_are_refused():
    R = small_problem()
    with pytest.raises(TypeError, match="dense"):
        MatrixFactorization(2, backend="local").fit(R.toarray())
    with pytest.raises(ValueError, match="method"):
        MatrixFactorization(2, method="sgd", backend="local").fit(R)
    with pytest.raises(ValueError, match="needs method 'als' or 'ccd'"):
        MatrixFactorization(2, dtype="float32", backend="local").fit(R)
    with pytest.raises(ValueError, match="dtype must be float32 or float64"):
        MatrixFactorization(2, method="als", dtype=np.float16, backend="local").fit(R)
    with pytest.raises(ValueError, match="cg_steps"):
        MatrixFactorization(2, method="als", cg_steps=0, backend="local").fit(R)
    with pytest.raises(ValueError, match="n_components"):
        MatrixFactorization(0, backend="local").fit(R)
    with pytest.raises(ValueError, match="cannot share"):
        MatrixFactorization(2, backend="local", n_workers=30).fit(R)
    with pytest.raises(ValueError, match="X_val has shape"):
        MatrixFactorization(2, backend="local").fit(R, X_val=sp.coo_matrix((3, 3)))
    # X_val's own errors name X_val and positions in it
    n_users = R.shape[0]
    one = (np.array([n_users + 5]), np.array([0]), np.array([1.0]))
    with pytest.raises(ValueError, match=rf"X_val user ids must be in \[0, {n_users}\).*"
                                         rf"X_val user 0 is {n_users + 5}"):
        MatrixFactorization(2, backend="local").fit(R, X_val=one)
    with pytest.raises(ValueError, match="X_val rating 0 is nan"):
        MatrixFactorization(2, backend="local").fit(
            R, X_val=(np.array([0]), np.array([0]), np.array([np.nan])))
    fitted = MatrixFactorization(2, backend="local", max_iter=2).fit(R)
    with pytest.raises(ValueError, match=r"X has shape \(100, 100\), the model was fitted"):
        fitted.score(sp.coo_matrix(([1.0], ([0], [0])), shape=(100, 100)))
    # a matrix built without shape= is only as large as its largest ids: fine
    assert np.isfinite(fitted.score(sp.coo_matrix(([3.0], ([1], [2])))))


def test_sklearn_params_and_clone():
    mf = MatrixFactorization(5, alpha=0.2, method="ccd", block_size=3)
    p = mf.get_params()
    assert p["n_components"] == 5 and p["block_size"] == 3
    c = clone(mf).set_params(alpha=0.4)
    assert c.alpha == 0.4 and mf.alpha == 0.2
    R = small_problem()
    assert mf.set_params(backend="local", max_iter=2).fit(R) is mf


def test_checkpoint_resume_gives_the_uninterrupted_result(tmp_path):
    tr, te = low_rank_ratings(n=60, m=40, k=2, seed=6)
    kw = dict(alpha=0.1, max_iter=6, tol=None, backend="local", n_workers=2, random_state=0)
    full = MatrixFactorization(3, **kw).fit(tr)

    class Stop(Exception):
        pass

    def crash(rnd, rec):
        if rnd == 10:
            raise Stop

    ck = str(tmp_path / "ck.zarr")
    with pytest.raises(Stop):
        MatrixFactorization(3, checkpoint=ck, checkpoint_every=2, callback=crash,
                            **kw).fit(tr)
    # a partition's checkpoint without one of its arrays (another dmp version): a clear error
    import shutil

    from dmp.engine.checkpoint import CheckpointStore

    ck_old = str(tmp_path / "old.zarr")
    shutil.copytree(ck, ck_old)
    store = CheckpointStore(ck_old)
    shutil.rmtree(f"{store.partition_path(store.latest(), 1)}/lam_cols")
    with pytest.raises(ValueError, match=r"p0001' lacks the array\(s\) \['lam_cols'\]"):
        MatrixFactorization(3, checkpoint=ck_old, checkpoint_every=2, resume=True,
                            **kw).fit(tr)
    resumed = MatrixFactorization(3, checkpoint=ck, checkpoint_every=2, resume=True,
                                  **kw).fit(tr)
    np.testing.assert_array_equal(resumed.user_factors_, full.user_factors_)
    np.testing.assert_array_equal(resumed.item_factors_, full.item_factors_)
    np.testing.assert_allclose(resumed.history_["objective"], full.history_["objective"],
                               rtol=1e-13)
