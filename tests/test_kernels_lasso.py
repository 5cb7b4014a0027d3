"""Tests for the Numba kernels of STRADS Lasso (dmp.kernels.lasso), against plain numpy."""

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.stats import chisquare

from dmp.kernels import lasso as kernels
from dmp.linear_model._lasso_program import priority_sample


# ----------------------------------------------------------------------------- helpers

def _csc_parts(X):
    X = sp.csc_matrix(X, dtype=np.float64)
    X.sum_duplicates()
    X.eliminate_zeros()
    X.sort_indices()
    return (np.ascontiguousarray(X.indptr, dtype=np.int64),
            np.ascontiguousarray(X.indices, dtype=np.int32),
            np.ascontiguousarray(X.data, dtype=np.float64))


def _soft(a, t):
    return np.sign(a) * max(abs(a) - t, 0.0)


def _numpy_cd(Xc, sq, w, r, idx, alpha_n):
    """Plain sequential coordinate descent on dense (already centred) columns."""
    w = w.copy()
    r = r.copy()
    deltas = np.zeros(len(idx))
    for t, j in enumerate(idx):
        if sq[j] <= 0.0:
            continue
        xj = Xc[:, j]
        new = _soft(xj @ r + sq[j] * w[j], alpha_n) / sq[j]
        d = new - w[j]
        deltas[t] = d
        w[j] = new
        r -= d * xj
    return w, r, deltas


def _problem(seed, n=40, p=25, density=0.3):
    rng = np.random.default_rng(seed)
    X = sp.random(n, p, density=density, random_state=rng, format="csc",
                  data_rvs=rng.standard_normal).toarray()
    X[:, 3] = 0.0                      # an all-zero column
    X[:, 7] += 2.0 * (X[:, 7] != 0)    # a column with a large mean
    y = X[:, :6] @ rng.standard_normal(6) + 0.3 * rng.standard_normal(n)
    return X, y


# ----------------------------------------------------------------------------- cd_sweep

@pytest.mark.parametrize("intercept", [False, True])
def test_cd_sweep_matches_numpy(intercept):
    X, y = _problem(0)
    n, p = X.shape
    indptr, indices, data = _csc_parts(X)
    col_sums = X.sum(axis=0)
    means = col_sums / n if intercept else np.zeros(p)
    Xc = X - means
    sq = (Xc ** 2).sum(axis=0)
    sq[3] = 0.0
    ytil = y - y.mean() if intercept else y.copy()
    alpha_n = 0.05 * np.abs(Xc.T @ ytil).max()

    rng = np.random.default_rng(1)
    w = np.zeros(p)
    r = ytil.copy()
    w_ref, r_ref = w.copy(), r.copy()
    for sweep in range(4):  # repeated sweeps, each in a different order, 3 is zero column
        idx = rng.permutation(p).astype(np.int64)
        delta = np.full(p, np.nan)
        w_before = w.copy()
        total = kernels.cd_sweep(indptr, indices, data, sq, means, col_sums, w, r, idx, alpha_n,
                                 delta)
        w_ref, r_ref, d_ref = _numpy_cd(Xc, sq, w_ref, r_ref, idx, alpha_n)
        np.testing.assert_allclose(w, w_ref, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(r, r_ref, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(delta, d_ref, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(total, np.abs(d_ref).sum(), rtol=1e-12, atol=1e-14)
        # r is the true residual of the current w, and the zero column stays put
        np.testing.assert_allclose(r, ytil - Xc @ w, rtol=0, atol=1e-12 * np.abs(ytil).max())
        assert w[3] == 0.0 and delta[list(idx).index(3)] == 0.0
        np.testing.assert_allclose(w - w_before, np.bincount(idx, delta, minlength=p),
                                   atol=1e-15)
    assert np.count_nonzero(w) > 2  # the sweeps did something
    assert np.count_nonzero(w) < p - 1


def test_cd_sweep_subset_and_repeated_index():
    X, y = _problem(2)
    n, p = X.shape
    indptr, indices, data = _csc_parts(X)
    col_sums = X.sum(axis=0)
    means = col_sums / n
    Xc = X - means
    sq = (Xc ** 2).sum(axis=0)
    sq[3] = 0.0
    ytil = y - y.mean()
    alpha_n = 0.02 * np.abs(Xc.T @ ytil).max()
    idx = np.array([7, 0, 7, 3, 12, 0, 5], dtype=np.int64)
    w = np.random.default_rng(3).standard_normal(p) * 0.1
    w[3] = 0.0
    r = ytil - Xc @ w
    w_ref, r_ref, d_ref = _numpy_cd(Xc, sq, w, r, idx, alpha_n)
    delta = np.empty(len(idx))
    kernels.cd_sweep(indptr, indices, data, sq, means, col_sums, w, r, idx, alpha_n, delta)
    np.testing.assert_allclose(w, w_ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(r, r_ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(delta, d_ref, rtol=1e-12, atol=1e-12)


def test_soft_threshold():
    for a, t in [(3.0, 1.0), (-3.0, 1.0), (0.5, 1.0), (-0.5, 1.0), (1.0, 1.0), (2.0, 0.0)]:
        assert kernels.soft_threshold(a, t) == _soft(a, t)


# ----------------------------------------------------------------------------- passes

@pytest.mark.parametrize("n", [53, 64])   # rows in whole groups of four, and a rest
def test_dense_sweeps_take_the_csc_sweeps_steps(n):
    """Columns stored whole (``dense=True``): the same coordinate descent as the CSC sweeps,
    only each dot product summed in four interleaved parts (rounding-level differences)."""
    rng = np.random.default_rng(n)
    p = 9
    X = rng.standard_normal((n, p))
    indptr, indices, data = _csc_parts(X)
    y = X[:, :3] @ np.array([1.0, -2.0, 0.5]) + 0.1 * rng.standard_normal(n)
    sq, means, sums = (X ** 2).sum(axis=0), np.zeros(p), X.sum(axis=0)
    idx = np.array([4, 0, 2, 1, 8], dtype=np.int64)
    out = {}
    for dense in (False, True):
        w, r, delta = np.zeros(p), y.copy(), np.empty(len(idx))
        done = kernels.cd_sweeps(indptr, indices, data, sq, means, sums, w, r, idx, 2.0, 30,
                                 1e-10, delta, dense)
        out[dense] = (w, r, delta, done)
    (w0, r0, d0, n0), (w1, r1, d1, n1) = out[False], out[True]
    assert n0 == n1 and np.count_nonzero(w1) >= 3
    np.testing.assert_allclose(w1, w0, rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(d1, d0, rtol=1e-11, atol=1e-13)
    # the residual stays the true one
    np.testing.assert_allclose(r1, y - X @ w1, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("p", [1, 4, 7, 12])   # whole groups of four columns and a rest
def test_dense_correlations_equal_the_csc_pass_bit_for_bit(p):
    rng = np.random.default_rng(p)
    n = 53
    X = rng.standard_normal((n, p))
    indptr, indices, data = _csc_parts(X)
    assert len(data) == n * p   # every entry stored, rows in order
    r = rng.standard_normal(n)
    csc, dense = np.empty(p), np.empty(p)
    kernels.correlations(indptr, indices, data, r, csc)
    kernels.dense_correlations(data, n, r, dense)
    np.testing.assert_array_equal(dense, csc)
    np.testing.assert_allclose(dense, X.T @ r, rtol=1e-12, atol=1e-12)


def test_correlations_gap_priorities_block_matvec():
    X, y = _problem(4)
    n, p = X.shape
    indptr, indices, data = _csc_parts(X)
    rng = np.random.default_rng(5)
    r = rng.standard_normal(n)
    corr = np.empty(p)
    kernels.correlations(indptr, indices, data, r, corr)
    np.testing.assert_allclose(corr, X.T @ r, rtol=1e-12, atol=1e-12)

    sq = (X ** 2).sum(axis=0)
    w = rng.standard_normal(p) * (rng.random(p) < 0.5)
    alpha_n = 0.5
    prio = np.empty(p)
    dual_norm = kernels.gap_priorities(corr, sq, w, alpha_n, prio)
    assert dual_norm == np.abs(corr).max()
    ref = np.zeros(p)
    for j in range(p):
        if sq[j] > 0:
            ref[j] = _soft(corr[j] + sq[j] * w[j], alpha_n) / sq[j] - w[j]
    assert prio[3] == 0.0
    np.testing.assert_allclose(prio, ref ** 2, rtol=1e-12, atol=1e-12)
    vd = ref
    # the virtual step is exactly what one coordinate update would do
    means = np.zeros(p)
    for j in [0, 5, 7]:
        ww, rr = w.copy(), r.copy()
        d = np.empty(1)
        kernels.cd_sweep(indptr, indices, data, sq, means, X.sum(axis=0), ww, rr,
                         np.array([j], dtype=np.int64), alpha_n, d)
        np.testing.assert_allclose(d[0], vd[j], rtol=1e-12, atol=1e-14)

    for means in (np.zeros(p), X.mean(axis=0)):
        out0 = rng.standard_normal(n)
        out = out0.copy()
        kernels.block_matvec(indptr, indices, data, means, w, out)
        np.testing.assert_allclose(out, out0 + (X - means) @ w, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- filter

def _brute_filter(Xc, sq, cand, max_keep, rho):
    kept = []
    for k in cand:
        if len(kept) >= max_keep:
            break
        if sq[k] <= 0.0:
            continue
        ok = all(abs(Xc[:, j] @ Xc[:, k]) < rho * np.sqrt(sq[j]) * np.sqrt(sq[k])
                 for j in kept)
        if ok:
            kept.append(int(k))
    return kept


def _filter_data(seed):
    from dmp.io import make_correlated_lasso

    rng = np.random.default_rng(seed)
    X, _, _ = make_correlated_lasso(n=150, p=120, density=0.08, group_size=6,
                                    group_corr=0.7, seed=seed)
    X = X.toarray()
    n = X.shape[0]
    # positive-valued columns with large means and disjoint supports: they correlate
    # (after centring) only through their means
    extra = np.zeros((n, 8))
    for c in range(3):  # disjoint supports of n/3 rows: centred cosine about -0.5
        rows = np.arange(c * 50, c * 50 + 50)
        extra[rows, c] = rng.uniform(1.0, 1.1, len(rows))
    for c in range(3, 8):
        rows = np.arange(c * 18, c * 18 + 18) % n
        extra[rows, c] = rng.uniform(1.0, 2.0, len(rows))
    X = np.hstack([X, extra, np.zeros((n, 1))])  # plus an all-zero column
    return X


def _run_filter(X, means, sq, cand, max_keep, rho, budget):
    indptr, indices, data = _csc_parts(X)
    n = X.shape[0]
    need = int((indptr[cand + 1] - indptr[cand]).sum())
    row_head = np.full(n, -1, dtype=np.int64)
    nxt = np.full(need, -7, np.int64)
    col = np.full(need, -7, np.int64)
    val = np.zeros(need)
    kept = np.full(min(max_keep, len(cand)), -1, dtype=np.int64)
    m = kernels.dependency_filter(indptr, indices, data, means, sq, cand, len(kept), rho, float(n),
                                  budget, row_head, nxt, col, val, kept)
    return list(kept[:m]), row_head


@pytest.mark.parametrize("intercept", [False, True])
@pytest.mark.parametrize("rho", [0.1, 0.3, 0.6])
def test_dependency_filter_matches_brute_force(intercept, rho):
    X = _filter_data(0)
    n, p = X.shape
    means = X.sum(axis=0) / n if intercept else np.zeros(p)
    Xc = X - means
    sq = (Xc ** 2).sum(axis=0)
    rng = np.random.default_rng(1)
    n_rejected = 0
    for trial in range(6):
        cand = rng.permutation(p)[: rng.integers(20, p)].astype(np.int64)
        if trial == 0:  # all the large-mean columns first, then everything else
            cand = np.r_[np.arange(p - 9, p), rng.permutation(p - 9)].astype(np.int64)
        for max_keep in (len(cand), 15):
            ref = _brute_filter(Xc, sq, cand, max_keep, rho)
            kept, row_head = _run_filter(X, means, sq, cand, max_keep, rho, 10**12)
            assert kept == ref
            assert np.all(row_head == -1)
            n_rejected += len(cand) - len(ref)
    assert n_rejected > 0
    if intercept and rho <= 0.3:
        # the mean-only interaction (disjoint supports) must reject some of the extras
        extras = np.arange(p - 9, p - 1)
        cand = extras.astype(np.int64)
        ref = _brute_filter(Xc, sq, cand, len(cand), rho)
        assert len(ref) < len(extras)
        kept, _ = _run_filter(X, means, sq, cand, len(cand), rho, 10**12)
        assert kept == ref


@pytest.mark.parametrize("intercept", [False, True])
def test_dependency_filter_tiny_budget(intercept):
    X = _filter_data(3)
    n, p = X.shape
    means = X.sum(axis=0) / n if intercept else np.zeros(p)
    Xc = X - means
    sq = (Xc ** 2).sum(axis=0)
    rng = np.random.default_rng(4)
    rho = 0.3
    shorter = 0
    for budget in (0, 1, 5, 20, 60):
        cand = rng.permutation(p).astype(np.int64)
        ref = _brute_filter(Xc, sq, cand, p, rho)
        kept, row_head = _run_filter(X, means, sq, cand, p, rho, budget)
        assert np.all(row_head == -1)
        assert len(kept) >= 1
        assert len(set(kept)) == len(kept)
        for a in range(len(kept)):
            for b in range(a):
                j, k = kept[a], kept[b]
                cos = abs(Xc[:, j] @ Xc[:, k]) / np.sqrt(sq[j] * sq[k])
                assert cos < rho
        # the greedy scan simply stops early: a prefix of the full answer
        assert kept == ref[: len(kept)]
        shorter += len(kept) < len(ref)
    assert shorter > 0


# ----------------------------------------------------------------------------- sampler

def test_priority_sample_single_draw_frequencies():
    """k = 1: P(j) = (prio_j + floor) / sum, over moving and settled variables alike."""
    prio = np.array([0.0, 1.0, 2.0, 0.0, 4.0, 0.5, 3.0, 0.0, 1.5, 0.0])
    floor = 0.3
    rng = np.random.default_rng(12345)
    N = 30000
    counts = np.zeros(len(prio), dtype=np.int64)
    for _ in range(N):
        out = priority_sample(prio, floor, 1, rng)
        assert len(out) == 1
        counts[out[0]] += 1
    w = prio + floor
    assert chisquare(counts, N * w / w.sum()).pvalue > 1e-3
    # a sampler that ignored the priorities would fail
    assert chisquare(counts, np.full(len(w), N / len(w))).pvalue < 1e-6


def test_priority_sample_pairs_successive_sampling():
    """k = 2 from the moving set: P(i, j) = w_i / S * w_j / (S - w_i)."""
    prio = np.array([1.0, 2.0, 3.0, 4.0])
    floor = 0.0001
    w = prio + floor
    S = w.sum()
    rng = np.random.default_rng(7)
    N = 20000
    # unordered pairs: P({i, j}) = P(i, j) + P(j, i)
    un = [(i, j) for i in range(4) for j in range(i + 1, 4)]
    freq = {pr: 0 for pr in un}
    for _ in range(N):
        out = priority_sample(prio, floor, 2, rng)
        freq[tuple(sorted(out.tolist()))] += 1
    expected = np.array([w[i] / S * w[j] / (S - w[i]) + w[j] / S * w[i] / (S - w[j])
                         for i, j in un]) * N
    assert chisquare(np.array([freq[pr] for pr in un]), expected).pvalue > 1e-3


@pytest.mark.parametrize("k", [1, 7, 30, 200])
def test_priority_sample_takes_all_moving_then_uniform(k):
    rng = np.random.default_rng(0)
    p = 200
    prio = np.zeros(p)
    moving = rng.choice(p, 20, replace=False)
    prio[moving] = rng.exponential(1.0, 20)
    for _ in range(30):
        out = priority_sample(prio, 1e-3, k, rng)
        assert len(out) == min(k, p)
        assert len(np.unique(out)) == len(out)
        if k > 20:  # all moving variables fit: every one of them is taken
            assert set(moving.tolist()) <= set(out.tolist())
        else:
            assert len(out) == k


@pytest.mark.parametrize("p", [200, 6000])   # the floor's keyed draw / its rejection draw
def test_priority_sample_draws_settled_variables_uniformly(p):
    """Settled variables beyond the moving set are drawn uniformly, without repeats."""
    rng = np.random.default_rng(0)
    prio = np.zeros(p)
    moving = rng.choice(p, 20, replace=False)
    prio[moving] = rng.exponential(1.0, 20)
    counts = np.zeros(p)
    for _ in range(3000):
        out = priority_sample(prio, 1e-3, 30, rng)
        assert len(np.unique(out)) == 30 and set(moving.tolist()) <= set(out.tolist())
        counts[out] += 1
    dead = np.setdiff1d(np.arange(p), moving)
    assert chisquare(counts[dead]).pvalue > 1e-3


@pytest.mark.parametrize("seed", range(6))
def test_priority_keys_top_chooses_the_k_smallest_keys(seed):
    """The scheduler's key selection against numpy's sort of the same keys."""
    rng = np.random.default_rng(seed)
    p = int(rng.integers(5, 400))
    prio = rng.exponential(1.0, p) * (rng.random(p) < 0.6)
    live = np.flatnonzero(prio)
    n_dead = p - len(live)
    floor = 0.05
    for k in sorted({1, 2, len(live) // 2 + 1, len(live), min(p, len(live) + 3)}):
        if k < 1 or k > p or len(live) < k:
            continue
        m = min(k, n_dead)
        e_live, e_dead = rng.standard_exponential(len(live)), rng.standard_exponential(m)
        keys = np.concatenate([e_live / (prio[live] + floor),
                               np.cumsum(e_dead / (floor * (n_dead - np.arange(m))))])
        ids = np.empty(len(keys), np.int64)
        c = kernels.priority_keys_top(prio, live, floor, n_dead, e_live, e_dead, k,
                                      np.empty(len(keys)), ids)
        best = np.argsort(keys, kind="stable")[:k]
        assert c == int(np.count_nonzero(best >= len(live)))
        assert sorted(ids[:k - c].tolist()) == sorted(live[best[best < len(live)]].tolist())

    # the settled variables' uniform subset: those of the c smallest keys
    dead = np.flatnonzero(prio == 0)
    u = rng.random(len(dead))
    for c in {1, len(dead) // 3 + 1, len(dead)}:
        if not 1 <= c <= len(dead):
            continue
        out = np.empty(len(dead), np.int64)
        kernels.uniform_settled(prio, u.copy() if c < len(dead) else np.empty(0), c, out)
        assert sorted(out[:c].tolist()) == sorted(dead[np.argsort(u)[:c]].tolist())
