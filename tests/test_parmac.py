"""ParMAC binary autoencoder: equivalence with serial MAC, what travels, retrieval quality
against ITQ and PCA hashing, streaming, the speed-up model and bad input."""

import math

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.datasets import load_digits

from dmp.hashing import (BinaryAutoencoder, euclidean_neighbors, hamming_search, itq,
                         pack_codes, parmac_speedup, parmac_time, pca_hash,
                         retrieval_precision, unpack_codes)
from dmp.io import make_hashing_mixture

from ba_reference import serial_ba_mac, serial_ba_mac_dcd


@pytest.fixture(scope="module")
def digits():
    X = load_digits().data
    perm = np.random.default_rng(0).permutation(len(X))
    return X[perm[300:]], X[perm[:300]]          # database, queries


def _precision(codes_q, codes_db, n_bits, truth):
    found, _ = hamming_search(codes_q, codes_db, truth.shape[1], n_bits)
    return retrieval_precision(found, truth)[0]


def _baselines(Db, Q, n_bits, truth):
    out = {}
    for name, h in (("itq", itq(Db, n_bits, random_state=0)), ("pca", pca_hash(Db, n_bits))):
        out[name] = _precision(pack_codes(h.codes(Q)), pack_codes(h.codes(Db)), n_bits, truth)
    return out


@pytest.mark.parametrize("init_margin", [10.0, None])
def test_one_worker_equals_serial_mac_with_sgd(digits, init_margin):
    Db, _ = digits
    X = Db[:600]
    kw = dict(n_bits=8, n_epochs=2, mu0=1e-3, mu_factor=2.0, max_iter=12,
              init_margin=init_margin)
    ref = serial_ba_mac(X, batch=32, lam=1e-4, seed=0, itq_iter=20, **kw)
    ba = BinaryAutoencoder(kw["n_bits"], n_epochs=2, mu0=1e-3, mu_factor=2.0, max_iter=12,
                           itq_iter=20, init_margin=init_margin, validation_size=0, random_state=0,
                           backend="local").fit(X)
    assert ba.n_iter_ == len(ref["history"])
    np.testing.assert_array_equal(ba.iteration_history_["penalty"],
                                  [h["penalty"] for h in ref["history"]])
    A = ref["A"] / ref["scale"]
    np.testing.assert_allclose(ba.coef_, A, rtol=1e-9, atol=1e-12 * np.abs(A).max())
    np.testing.assert_allclose(ba.intercept_, ref["a"] - A @ ref["lo"], rtol=1e-9,
                               atol=1e-9)
    np.testing.assert_allclose(ba.decoder_coef_, ref["B"] * ref["scale"], rtol=1e-8,
                               atol=1e-8)
    # the last Z step reached Z = h(X) in both
    assert ba.stop_reason_ == "Z = h(X)" and ref["history"][-1]["penalty"] == 0
    np.testing.assert_array_equal(unpack_codes(ba.transform(ref["X"]), 8), ref["Z"])


@pytest.mark.parametrize("P", [1, 3])
def test_dcd_w_step_on_p_workers_is_serial_cyclic_dual_cd(digits, P):
    # w_step="dcd": the duals live with their points, the SVM weights travel round the ring,
    # so P workers run one cyclic dual coordinate descent (against a numpy reference)
    Db, _ = digits
    X = Db[:450]
    kw = dict(n_bits=6, n_epochs=2, mu0=1e-2, mu_factor=2.0, max_iter=4)
    ref = serial_ba_mac_dcd(X, C=1.0, seed=0, itq_iter=10, n_parts=P, **kw)
    ba = BinaryAutoencoder(w_step="dcd", C=1.0, itq_iter=10, validation_size=0,
                           random_state=0, backend="local", n_workers=P, **kw).fit(X)
    assert ba.n_iter_ == len(ref["history"])
    np.testing.assert_array_equal(ba.iteration_history_["penalty"],
                                  [h["penalty"] for h in ref["history"]])
    A = ref["A"] / ref["scale"]
    np.testing.assert_allclose(ba.coef_, A, rtol=1e-6, atol=1e-9 * np.abs(A).max())
    np.testing.assert_allclose(ba.intercept_, ref["a"] - A @ ref["lo"], rtol=1e-6,
                               atol=1e-6 * np.abs(ref["a"]).max())
    assert ba.iteration_history_["identical"].all()
    # what travels (nothing on one worker): per sending round each partition's group id and
    # its units' weights on the r whitened directions and biases (r: directions of non-zero
    # variance)
    ev = np.linalg.eigvalsh(np.cov(X.T))
    r = int(np.sum(ev > 1e-9 * ev.max()))
    np.testing.assert_array_equal(ba.iteration_history_["bytes_ring"],
                                  (P > 1) * (2 * P + P - 1) * (8 * P + 8 * 6 * (r + 1)))


def test_auto_mu0_is_the_itq_starts_reconstruction_error_over_16(digits):
    # mu0="auto": mu0 = E_0 / 16, E_0 the mean ||x - B z - b||^2 of the ITQ start's codes and
    # their least-squares decoder on the [0, 1]-scaled points (computed here from scratch)
    Db, _ = digits
    X = Db[:500]
    ba = BinaryAutoencoder(8, mu0="auto", itq_iter=0, max_iter=2, validation_size=0,
                           random_state=0, backend="local").fit(X)
    lo = X.min(axis=0)
    Xs = (X - lo) / (X.max(axis=0) - lo).max()
    _, evecs = np.linalg.eigh(np.cov(Xs.T, bias=True))
    R, _ = np.linalg.qr(np.random.default_rng([0, 4]).standard_normal((8, 8)))
    Z = ((Xs - Xs.mean(axis=0)) @ evecs[:, ::-1][:, :8] @ R > 0).astype(float)
    Z1 = np.hstack([Z, np.ones((len(Z), 1))])
    res = Xs - Z1 @ np.linalg.lstsq(Z1, Xs, rcond=None)[0]
    E0 = np.mean(np.sum(res ** 2, axis=1))
    np.testing.assert_allclose(ba.iteration_history_["mu"][0], E0 / 16, rtol=1e-6)
    np.testing.assert_allclose(ba.iteration_history_["mu"][1], 1.5 * E0 / 16, rtol=1e-6)


def test_early_stopping_ends_the_fit_when_validation_precision_stops_improving(digits):
    Db, _ = digits
    kw = dict(w_step="dcd", n_epochs=5, mu0=1e-3, random_state=0, backend="local")
    full = BinaryAutoencoder(8, **kw).fit(Db)
    early = BinaryAutoencoder(8, n_iter_no_change=1, **kw).fit(Db)
    n = early.n_iter_
    assert early.stop_reason_ == "validation precision stopped improving"
    # the first iteration that is not better than the best so far ends the fit
    assert n == early.best_iteration_ + 2 < full.n_iter_
    prec = full.iteration_history_["precision"]
    np.testing.assert_array_equal(early.iteration_history_["precision"], prec[:n])
    if early.best_iteration_ >= 0:
        assert prec[early.best_iteration_] == prec[:n].max() >= prec[n - 1]


def test_dcd_svm_solves_the_l2_loss_svm():
    from sklearn.svm import LinearSVC

    from dmp.hashing._wstep import dcd_svm

    rng = np.random.default_rng(0)
    X = rng.standard_normal((300, 5))
    Y = (X @ rng.standard_normal((5, 3)) + 0.5 * rng.standard_normal((300, 3)) > 0.2)
    Y = Y.astype(np.uint8)
    W, b, alpha = np.zeros((3, 5)), np.zeros(3), np.zeros((300, 3))
    xsq = np.einsum("ij,ij->i", X, X)
    for _ in range(2000):
        pg = dcd_svm(W, b, alpha, X, xsq, Y, rng.permutation(300), 2.0, 1.0)
    assert pg < 1e-6     # LIBLINEAR's measure: the largest projected gradient of a pass
    for u in range(3):
        svm = LinearSVC(C=2.0, loss="squared_hinge", dual=True, intercept_scaling=1.0,
                        tol=1e-10, max_iter=100_000).fit(X, Y[:, u])
        np.testing.assert_allclose(W[u], svm.coef_[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(b[u], svm.intercept_[0], rtol=1e-5, atol=1e-6)
        # the duals reproduce the weights
        y = 2.0 * Y[:, u] - 1
        np.testing.assert_allclose(W[u], (alpha[:, u] * y) @ X, atol=1e-9)


def _patches(n, seed=0):
    """8x8 grey patches of scikit-learn's sample photographs, each patch's mean removed."""
    from sklearn.datasets import load_sample_images
    from sklearn.feature_extraction.image import extract_patches_2d

    rng = np.random.RandomState(seed)
    out = [extract_patches_2d(im.mean(axis=2) / 255.0, (8, 8), max_patches=n // 2,
                              random_state=rng).reshape(-1, 64)
           for im in load_sample_images().images]
    X = np.concatenate(out)
    return X - X.mean(axis=1, keepdims=True)


def test_first_w_step_keeps_the_itq_codes_it_starts_from():
    # Z = h_ITQ(X) is linearly separable by construction, so the W step's SVMs, warm-started
    # from the ITQ hyperplanes, should keep (nearly) all of it; an exact linear SVM
    # (LinearSVC, C = 100, on 20,000 patches) keeps 99.4%.  Unit-norm ITQ directions on
    # [0, 1]-scaled patches have margins ~0.01 and the two-epoch SGD kept 61% of them here;
    # scaled to init_margin = 10 it keeps 89% (99.5% on 20,000 points: more SGD steps).
    X = _patches(4000)
    lost = {}
    for margin in (None, 10.0):
        ba = BinaryAutoencoder(16, max_iter=1, validation_size=0, init_margin=margin,
                               random_state=0, backend="local").fit(X)
        # penalty_w: bits where h(X) after the W step differs from Z (here the ITQ codes)
        lost[margin] = ba.iteration_history_["penalty_w"][0] / (X.shape[0] * 16)
    assert lost[10.0] <= 0.15 and lost[None] >= 0.3, lost


@pytest.mark.parametrize("P", [2, 3])
def test_workers_hold_identical_submodels_and_only_submodels_travel(digits, P):
    Db, _ = digits
    L, e = 8, 2
    fits = {}
    for n in (600, 1200):
        ba = BinaryAutoencoder(L, n_epochs=e, max_iter=3, validation_size=0, random_state=0,
                               backend="local", n_workers=P).fit(Db[:n])
        fits[n] = ba
        assert ba.iteration_history_["identical"].all()
        D = Db.shape[1]
        # per sending round every partition hands on one group: its id and its units'
        # weights, biases and step counts; e P training hops + P - 1 copy hops
        per_round = 8 * P + 8 * L * (D + 2)
        np.testing.assert_array_equal(ba.iteration_history_["bytes_ring"],
                                      (e * P + P - 1) * per_round)
    # nothing that moves grows with the number of points
    np.testing.assert_array_equal(fits[600].iteration_history_["bytes_ring"],
                                  fits[1200].iteration_history_["bytes_ring"])
    np.testing.assert_array_equal(fits[600].iteration_history_["bytes_driver"],
                                  fits[1200].iteration_history_["bytes_driver"])


def test_sgd_decoder_travels_too_and_approaches_the_exact_one(digits):
    Db, _ = digits
    P, L, D = 2, 8, Db.shape[1]
    exact = BinaryAutoencoder(L, max_iter=4, validation_size=0, random_state=0,
                              backend="local", n_workers=P).fit(Db)
    sgd = clone(exact).set_params(decoder="sgd", n_epochs=4).fit(Db)
    assert sgd.iteration_history_["identical"].all()
    per_round = 8 * P + 8 * L * (D + 2) + 8 * D * (L + 2)
    np.testing.assert_array_equal(sgd.iteration_history_["bytes_ring"], (4 * P + P - 1) * per_round)
    # reconstruction error of the SGD decoder within 5% of the least-squares one
    assert sgd.iteration_history_["E_BA"][-1] < 1.05 * exact.iteration_history_["E_BA"][-1]


@pytest.mark.parametrize("n_bits", [16, 32])
def test_digits_precision_beats_itq_and_pca_hashing(digits, n_bits):
    Db, Q = digits
    truth = euclidean_neighbors(Q, Db, 50)
    base = _baselines(Db, Q, n_bits, truth)
    ba = BinaryAutoencoder(n_bits, random_state=0, backend="local", n_workers=2).fit(Db)
    p = _precision(ba.transform(Q), ba.transform(Db), n_bits, truth)
    assert p > base["itq"] > base["pca"], (p, base)
    # E_BA fell from the ITQ start
    assert ba.iteration_history_["E_BA"][-1] < ba.iteration_history_["E_BA"][0]
    assert ba.stop_reason_ == "Z = h(X)" and ba.iteration_history_["penalty"][-1] == 0


@pytest.mark.slow
@pytest.mark.parametrize("n_bits", [16, 32])
def test_mixture_of_50000_points_precision_beats_itq_and_pca_hashing(n_bits):
    X, _ = make_hashing_mixture(50_500, seed=4)
    Q, Db = X[:500], X[500:]
    truth = euclidean_neighbors(Q, Db, 100)
    base = _baselines(Db, Q, n_bits, truth)
    ba = BinaryAutoencoder(n_bits, random_state=0, backend="local", n_workers=2).fit(Db)
    p = _precision(ba.transform(Q), ba.transform(Db), n_bits, truth)
    assert p > base["itq"] and p > base["pca"], (p, base)


def test_transform_formats_and_reconstruction(digits):
    Db, Q = digits
    ba = BinaryAutoencoder(12, max_iter=3, random_state=0, backend="local").fit(Db)
    packed = ba.transform(Q)
    assert packed.dtype == np.uint8 and packed.shape == (len(Q), 2)
    bits = ba.set_params(code_format="bool").transform(Q)
    assert bits.dtype == bool and bits.shape == (len(Q), 12)
    np.testing.assert_array_equal(unpack_codes(packed, 12), bits)
    np.testing.assert_array_equal(bits, Q @ ba.coef_.T + ba.intercept_ > 0)
    rec = ba.inverse_transform(packed)
    np.testing.assert_allclose(rec, ba.inverse_transform(bits.astype(np.uint8)))
    np.testing.assert_allclose(rec, bits @ ba.decoder_coef_.T + ba.decoder_intercept_)
    # reconstructions beat the mean as a predictor
    assert np.mean((rec - Q) ** 2) < np.mean((Q - Db.mean(axis=0)) ** 2)


def test_estimator_conventions(digits):
    Db, _ = digits
    ba = BinaryAutoencoder(8, mu0=2e-3, max_iter=2, backend="local")
    assert ba.get_params()["mu0"] == 2e-3
    assert ba.fit(Db[:400]) is ba
    assert ba.n_features_in_ == 64 and ba.coef_.shape == (8, 64)
    h = ba.iteration_history_
    for key in ("mu", "E_BA", "penalty", "precision", "w_s", "z_s", "bytes_ring"):
        assert len(h[key]) == ba.n_iter_
    np.testing.assert_allclose(h["mu"], 2e-3 * 1.5 ** np.arange(ba.n_iter_))
    # per engine round, as every other estimator's history_: each round names its iteration
    rounds = ba.round_history_
    assert list(rounds["round"]) == list(range(len(rounds["round"])))
    assert len(rounds["round"]) > ba.n_iter_
    assert set(rounds["iteration"]) == set(h["iteration"])
    # history_ is the per-iteration history for one more release, with a warning saying so
    with pytest.warns(FutureWarning, match="iteration_history_.*round_history_"):
        old = ba.history_
    assert old is h
    assert not hasattr(clone(ba), "history_") and "history_" not in vars(ba)


def test_new_shard_joins_between_iterations(digits):
    Db, Q = digits
    first, later = Db[:900], Db[900:]
    ba = BinaryAutoencoder(16, max_iter=8, random_state=0, backend="local", n_workers=2)
    ba.fit(first, arrivals={3: later})
    assert ba.n_samples_fit_ == len(Db)
    assert ba.iteration_history_["identical"].all() and ba.n_iter_ >= 4
    # the joined points are coded by the model and counted in the penalty of later steps
    truth = euclidean_neighbors(Q, Db, 50)
    p = _precision(ba.transform(Q), ba.transform(Db), 16, truth)
    base = _baselines(first, Q, 16, euclidean_neighbors(Q, first, 50))
    assert p > 0.5 and base["itq"] > 0.5
    with pytest.raises(ValueError, match="arrivals keys"):
        clone(ba).fit(first, arrivals={0: later})
    with pytest.raises(ValueError, match="features"):
        clone(ba).fit(first, arrivals={2: later[:, :10]})
    with pytest.raises(ValueError, match=r"arrivals at MAC iterations \[8\] would never join"):
        clone(ba).fit(first, arrivals={8: later})


def test_speedup_model_closed_form():
    costs = dict(n_points=10**6, n_submodels=64, n_epochs=2, t_w=2e-8, t_z=5e-7, t_c=1e-4)
    N, M, e = 10**6, 64, 2
    T1 = e * M * N * 2e-8 + N * 5e-7
    assert parmac_time(1, **costs) == pytest.approx(T1, rel=1e-12)
    rho = e * M * 1e-4 / (N * (e * M * 2e-8 + 5e-7))
    for P in (2, 4, 8, 16, 32, 64):        # P divides M: S = P / (1 + rho P)
        assert parmac_speedup(P, final_pass=False, **costs) == pytest.approx(
            P / (1 + rho * P), rel=1e-12)
    # the copy pass adds (P - 1) ceil(M / P) t_c
    assert parmac_time(8, **costs) - parmac_time(8, final_pass=False, **costs) == \
        pytest.approx(7 * 8 * 1e-4)
    # beyond M workers the W step stops shrinking
    assert parmac_time(128, final_pass=False, **costs) > parmac_time(64, final_pass=False,
                                                                     **costs) - T1 / 64
    # the engine's per-round cost: e P hops + P - 1 copy hops + the Z step's round
    assert parmac_time(8, t_round=0.01, **{k: v for k, v in costs.items()}) - \
        parmac_time(8, **costs) == pytest.approx((2 * 8 + 7 + 1) * 0.01)
    assert parmac_time(1, t_round=0.01, **costs) - T1 == pytest.approx(3 * 0.01)
    with pytest.raises(ValueError, match="P must"):
        parmac_time(0, **costs)
    with pytest.raises(ValueError, match="t_c"):
        parmac_time(2, **{**costs, "t_c": math.nan})


@pytest.mark.parametrize("bad, match", [
    (lambda X: np.where(np.arange(X.size).reshape(X.shape) == 5, np.nan, X), "NaN"),
    (lambda X: np.where(np.arange(X.size).reshape(X.shape) == 7, np.inf, X), "NaN or inf"),
    (lambda X: X[:, :0], "empty"),
    (lambda X: X[0], "2-D"),
])
def test_bad_points_are_named(digits, bad, match):
    Db, _ = digits
    with pytest.raises(ValueError, match=match):
        BinaryAutoencoder(8, backend="local").fit(bad(Db[:100]))


def test_bad_settings_are_named(digits):
    Db, Q = digits
    with pytest.raises(ValueError, match="n_bits"):
        BinaryAutoencoder(0, backend="local").fit(Db[:100])
    with pytest.raises(ValueError, match="exceeds the 64 features"):
        BinaryAutoencoder(65, backend="local").fit(Db[:100])
    with pytest.raises(ValueError, match="cannot be split over 3 workers"):
        BinaryAutoencoder(2, backend="local", n_workers=3).fit(Db[:2, :4])
    with pytest.raises(ValueError, match="'alternate'"):
        BinaryAutoencoder(20, z_method="enumerate", backend="local").fit(Db[:100])
    with pytest.raises(ValueError, match="decoder"):
        BinaryAutoencoder(8, decoder="svd", backend="local").fit(Db[:100])
    with pytest.raises(ValueError, match="no variation"):
        BinaryAutoencoder(2, backend="local").fit(np.ones((50, 4)))
    ba = BinaryAutoencoder(8, max_iter=1, backend="local").fit(Db[:200])
    with pytest.raises(ValueError,
                       match="X has 10 features, but BinaryAutoencoder is expecting 64"):
        ba.transform(Q[:, :10])
    with pytest.raises(ValueError, match="codes must be"):
        ba.inverse_transform(np.zeros((3, 5), dtype=np.uint8))


def test_a_callback_stopping_before_the_first_model_is_refused_and_leaves_no_fit(digits):
    Db, _ = digits
    ba = BinaryAutoencoder(8, backend="local", max_iter=2,
                           callback=lambda r, record: record["phase"] == "itq")
    with pytest.raises(RuntimeError, match="before the ITQ initialisation had made a model"):
        ba.fit(Db[:400])
    assert not [k for k in vars(ba) if k.endswith("_")]
    # stopped once a model exists, it is that model
    ba.set_params(callback=lambda r, record: record["phase"] not in ("stats", "itq"))
    assert ba.fit(Db[:400]).coef_.shape == (8, 64)

