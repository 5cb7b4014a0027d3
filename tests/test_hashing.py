"""Binary hashing primitives against brute force: packed Hamming search, Euclidean ground
truth, ITQ / PCA hashing, and the binary autoencoder's Z step."""

import itertools

import numpy as np
import pytest
from sklearn.datasets import load_digits
from sklearn.neighbors import NearestNeighbors

from dmp.hashing import (euclidean_neighbors, hamming_search, itq, pack_codes, pca_hash,
                         quantization_loss, retrieval_precision, unpack_codes, z_step)
from dmp.hashing._zstep import z_objective


# ---------------------------------------------------------------- codes and search
@pytest.mark.parametrize("L", [5, 37, 64, 70])
def test_hamming_search_matches_brute_force(L):
    rng = np.random.default_rng(L)
    db = rng.integers(0, 2, (500, L), dtype=np.uint8)
    q = rng.integers(0, 2, (30, L), dtype=np.uint8)
    np.testing.assert_array_equal(unpack_codes(pack_codes(db), L), db)
    k = 25
    idx, dist = hamming_search(pack_codes(q), pack_codes(db), k, n_bits=L)
    full = (q[:, None, :] != db[None, :, :]).sum(axis=2)
    want = np.argsort(full, axis=1, kind="stable")[:, :k]     # ties in database order
    np.testing.assert_array_equal(idx, want)
    np.testing.assert_array_equal(dist, np.take_along_axis(full, want, axis=1))


def test_hamming_search_rejects_bad_input():
    a = pack_codes(np.ones((4, 16), dtype=np.uint8))
    with pytest.raises(ValueError, match="not the same code length"):
        hamming_search(a, pack_codes(np.ones((4, 24), dtype=np.uint8)), 2)
    with pytest.raises(ValueError, match=r"k must be in \[1, 4\]"):
        hamming_search(a, a, 5)
    with pytest.raises(ValueError, match="packed uint8"):
        hamming_search(a.astype(np.int64), a, 1)
    with pytest.raises(ValueError, match="only 0 and 1"):
        pack_codes(np.full((2, 3), 2))


def test_euclidean_neighbors_and_precision():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((400, 7))
    Q = rng.standard_normal((50, 7))
    got = euclidean_neighbors(Q, X, 10, chunk=16)
    want = NearestNeighbors(n_neighbors=10, algorithm="brute").fit(X).kneighbors(Q)[1]
    np.testing.assert_array_equal(got, want)
    p, r = retrieval_precision(np.array([[1, 2, 3, 4]]), np.array([[4, 9]]))
    assert (p, r) == (0.25, 0.5)
    with pytest.raises(ValueError, match="same number of features"):
        euclidean_neighbors(Q[:, :3], X, 2)


def test_retrieval_precision_counts_each_rows_common_ids_as_sets_do():
    """Precision and recall against per-row set intersections, on rows of distinct ids
    drawn from overlapping ranges (ids that one row holds and another row's list does not
    must not count), negative ids included, and lists of different lengths."""
    rng = np.random.default_rng(5)
    for n_q, k, K, n_ids, lo in [(200, 50, 50, 400, 0), (31, 7, 20, 60, -25), (1, 3, 3, 3, 9)]:
        ret = np.array([rng.choice(n_ids, k, replace=False) for _ in range(n_q)]) + lo
        rel = np.array([rng.choice(n_ids, K, replace=False) for _ in range(n_q)]) + lo
        hits = np.array([len(set(a) & set(b)) for a, b in zip(ret.tolist(), rel.tolist())])
        p, r = retrieval_precision(ret, rel)
        assert p == pytest.approx(np.mean(hits / k), abs=1e-15)
        assert r == pytest.approx(np.mean(hits / K), abs=1e-15)
    # the same ids in another row's list are not hits
    assert retrieval_precision(np.array([[1, 2], [3, 4]]), np.array([[3, 4], [1, 2]])) == (0, 0)


# ---------------------------------------------------------------- linear baselines
def test_itq_rotation_lowers_the_quantisation_loss_and_beats_pca_hashing():
    X = load_digits().data.astype(float)
    rng = np.random.default_rng(0)
    perm = rng.permutation(len(X))
    db, queries = X[perm[200:]], X[perm[:200]]
    h_pca = pca_hash(db, 16)
    h_itq = itq(db, 16, random_state=0)
    # the projection is an orthogonal rotation of the principal directions
    W = h_pca.projection_
    np.testing.assert_allclose(W.T @ W, np.eye(16), atol=1e-10)
    R = np.linalg.lstsq(W, h_itq.projection_, rcond=None)[0]
    np.testing.assert_allclose(R.T @ R, np.eye(16), atol=1e-8)
    # ITQ's rotation quantises better than none and than random rotations
    from dmp.hashing import LinearHash

    loss = quantization_loss(db, h_itq)
    assert loss < quantization_loss(db, h_pca)
    for seed in range(5):
        Rr, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((16, 16)))
        assert loss < quantization_loss(db, LinearHash(h_pca.mean_, W @ Rr))
    truth = euclidean_neighbors(queries, db, 50)
    prec = {}
    for name, h in (("pca", h_pca), ("itq", h_itq)):
        idx, _ = hamming_search(pack_codes(h.codes(queries)), pack_codes(h.codes(db)), 50)
        prec[name] = retrieval_precision(idx, truth)[0]
    assert prec["itq"] > prec["pca"] + 0.02, prec
    with pytest.raises(ValueError, match="n_bits must be in"):
        itq(db, 65)
    with pytest.raises(ValueError, match="NaN"):
        pca_hash(np.full((5, 3), np.nan), 2)


# ---------------------------------------------------------------- the Z step
def _z_problem(N=60, D=12, L=6, seed=0):
    rng = np.random.default_rng(seed)
    B = rng.standard_normal((D, L))
    b = rng.standard_normal(D)
    Zt = rng.integers(0, 2, (N, L))
    X = Zt @ B.T + b + 0.7 * rng.standard_normal((N, D))
    H = rng.integers(0, 2, (N, L), dtype=np.uint8)
    return X, B, b, H


@pytest.mark.parametrize("mu", [0.0, 0.3, 5.0])
def test_enumeration_is_the_exact_minimiser(mu):
    X, B, b, H = _z_problem()
    Z = z_step(X, B, b, H, mu, method="enumerate")
    all_codes = np.array(list(itertools.product([0, 1], repeat=6)), dtype=np.uint8)
    brute = np.array([[z_objective(X[n:n + 1], B, b, H[n:n + 1], z[None], mu)[0]
                       for z in all_codes] for n in range(len(X))])
    np.testing.assert_allclose(z_objective(X, B, b, H, Z, mu), brute.min(axis=1),
                               rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("L", [8, 12])
def test_alternating_never_worse_than_its_start_nor_better_than_enumeration(L):
    X, B, b, H = _z_problem(N=300, D=20, L=L, seed=L)
    mu = 0.5
    rng = np.random.default_rng(1)
    Z0 = rng.integers(0, 2, H.shape, dtype=np.uint8)
    Za = z_step(X, B, b, H, mu, method="alternate", Z0=Z0)
    Ze = z_step(X, B, b, H, mu, method="enumerate")
    e0, ea, ee = (z_objective(X, B, b, H, Z, mu) for Z in (Z0, Za, Ze))
    eh = z_objective(X, B, b, H, H, mu)
    assert np.all(ea <= np.minimum(e0, eh) + 1e-9)
    assert np.all(ee <= ea + 1e-9)
    # a local search from the better start finds the exact optimum for most points
    assert np.mean(np.all(Za == Ze, axis=1)) >= 0.8


def test_z_step_rejects_bad_input():
    X, B, b, H = _z_problem()
    with pytest.raises(ValueError, match="bits exceed"):
        z_step(X[:, :4], B[:4], b[:4], H, 1.0)
    with pytest.raises(ValueError, match="mu must be"):
        z_step(X, B, b, H, -1.0)
    with pytest.raises(ValueError, match="method must be"):
        z_step(X, B, b, H, 1.0, method="greedy")
    X2, B2, b2, H2 = _z_problem(N=3, D=20, L=17)
    with pytest.raises(ValueError, match="too slow"):
        z_step(X2, B2, b2, H2, 1.0, method="enumerate")


# ---------------------------------------------------------------- the W step's submodels
def test_decoder_from_summed_normal_equations_is_least_squares():
    from dmp.hashing._wstep import decoder_normal_equations, solve_decoder

    rng = np.random.default_rng(0)
    X = rng.standard_normal((300, 9))
    Z = rng.integers(0, 2, (300, 5))
    parts = [decoder_normal_equations(X[s], Z[s]) for s in (slice(0, 120), slice(120, 300))]
    B, b = solve_decoder(sum(p[0] for p in parts), sum(p[1] for p in parts))
    theta, *_ = np.linalg.lstsq(np.hstack([Z, np.ones((300, 1))]), X, rcond=None)
    np.testing.assert_allclose(B, theta[:-1].T, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(b, theta[-1], rtol=1e-6, atol=1e-8)


def test_sgd_svm_units_learn_their_bits_like_a_linear_svm():
    from sklearn.svm import LinearSVC

    from dmp.hashing._wstep import encode, sgd_svm

    rng = np.random.default_rng(0)
    X = rng.uniform(0, 1, (2000, 10))
    w_true = rng.standard_normal((3, 10))
    Y = (X @ w_true.T > np.median(X @ w_true.T, axis=0)).astype(np.uint8)
    W, bias, steps = np.zeros((3, 10)), np.zeros(3), np.zeros(3, np.int64)
    for epoch in range(20):
        sgd_svm(W, bias, steps, X, Y, rng.permutation(2000), 32, 1e-4, 0.2)
    assert np.all(steps == 20 * 63)                       # one step per minibatch per unit
    acc = np.mean(encode(X, W, bias) == Y, axis=0)
    ref = np.array([LinearSVC(C=10.0, dual=False).fit(X, Y[:, u]).score(X, Y[:, u])
                    for u in range(3)])
    assert np.all(acc >= ref - 0.03), (acc, ref)
    # units are independent: training one alone gives the same weights
    W1, b1, s1 = np.zeros((1, 10)), np.zeros(1), np.zeros(1, np.int64)
    W3, b3, s3 = np.zeros((3, 10)), np.zeros(3), np.zeros(3, np.int64)
    order = rng.permutation(2000)
    sgd_svm(W1, b1, s1, X, np.ascontiguousarray(Y[:, 1:2]), order, 32, 1e-4, 0.2)
    sgd_svm(W3, b3, s3, X, Y, order, 32, 1e-4, 0.2)
    np.testing.assert_array_equal(W1[0], W3[1])
