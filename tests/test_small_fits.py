"""Small fits stay light: importing the estimators and an in-process fit load neither zarr nor
distributed, and a Lasso on one partition checks its duality gap in the round that solved the
working set (benchmarks/small.py times both; BENCHMARKS.md, "Small problems and the first
fit")."""

import dataclasses
import subprocess
import sys
import textwrap

import numpy as np

from dmp.engine import LocalBackend, run
from dmp.io.sparse import InMemorySparseDataset
from dmp.io.synthetic import lasso_alpha_max, make_correlated_lasso
from dmp.linear_model._lasso_program import CDPlan, LassoProgram


def test_estimators_import_and_fit_in_process_without_zarr_or_distributed():
    # a fresh interpreter: the test session itself has a cluster (and distributed) loaded
    code = textwrap.dedent("""
        import sys
        import numpy as np
        import dask.config
        import dmp.linear_model, dmp.decomposition, dmp.hashing
        from dmp.linear_model import Lasso

        heavy = lambda: sorted({m.split(".")[0] for m in sys.modules
                                if m.split(".")[0] in ("zarr", "distributed")})
        print("import", heavy())
        rng = np.random.default_rng(0)
        X = rng.standard_normal((40, 6))
        Lasso(alpha=0.01).fit(X, X @ rng.standard_normal(6))
        print("fit", heavy())
        # what dmp/__init__ registers still is: its settings in Dask's configuration
        print("config", dask.config.get("dmp.batch.max-rounds") > 0)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out == ["import []", "fit []", "config True"], (
        f"importing dmp's estimators or an in-process fit loaded zarr or distributed "
        f"(or dmp's settings are missing): {out}")



def test_the_program_modules_a_worker_imports_load_no_scikit_learn():
    """A Dask worker unpickling a program imports the program's module (and its package):
    none of them pulls in the estimators and scikit-learn under them (about 1 s of CPU a
    fresh worker paid on its first fit; BENCHMARKS.md, "Setup on 8 workers against 1")."""
    code = textwrap.dedent("""
        import sys
        import dmp.linear_model._lasso_program, dmp.linear_model._sparsified_program
        import dmp.decomposition._lda_program, dmp.decomposition._mf_program
        import dmp.hashing._parmac
        print(sorted(m for m in sys.modules if m.split(".")[0] == "sklearn")[:3])
        from dmp.hashing import BinaryAutoencoder, itq
        print("sklearn" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out == ["[]", "True"], out


class _SeparateGapRounds(LassoProgram):
    """The same program with every gap check in a round of its own."""

    def schedule(self, round):
        return [dataclasses.replace(p, gap=False) if isinstance(p, CDPlan) else p
                for p in super().schedule(round)]


def _lasso_program(cls, X, y):
    ds = InMemorySparseDataset(X, y, n_shards=1)
    alpha = 0.05 * lasso_alpha_max(X, y, fit_intercept=True)
    return cls(ds, alpha=alpha, fit_intercept=True, schedule="priority", schedule_size=40,
               eta=1e-3, rho=None, oversample=2.0, tol=1e-10, check_every=300,
               refresh_every=3, seed=0, inner_sweeps=50)


def test_one_partition_checks_the_gap_in_the_round_that_solved_the_working_set():
    X, y, _ = make_correlated_lasso(n=120, p=300, density=0.1, seed=1)
    fused = _lasso_program(LassoProgram, X, y)
    separate = _lasso_program(_SeparateGapRounds, X, y)
    got = run(fused, LocalBackend(1), max_iter=500)
    want = run(separate, LocalBackend(1), max_iter=500)
    assert got.converged and want.converged
    kinds = [h["kind"] for h in want.history]
    n_separate_gaps = sum(a == "cd" and b == "gap" for a, b in zip(kinds, kinds[1:]))
    assert n_separate_gaps >= 2
    # the same iterates, in fewer rounds: each gap round after a solved working set is gone
    np.testing.assert_array_equal(fused.driver.coef, separate.driver.coef)
    assert fused.driver.updates == separate.driver.updates
    assert got.n_rounds <= want.n_rounds - n_separate_gaps + 1
    got_kinds = [h["kind"] for h in got.history]
    assert got_kinds.count("gap") < kinds.count("gap")
    # a CD round that checked the gap reports it (and the check count goes on)
    assert fused.driver.n_checks == separate.driver.n_checks
    assert got.history[-1]["dual_gap"] == fused.driver.gap
    gaps = [h["dual_gap"] for h in got.history]
    assert any(k == "cd" and g != g0 for k, g, g0 in zip(got_kinds[1:], gaps[1:], gaps))


def test_payload_sizes_by_type_count_as_the_rule_says():
    # the per-type sizers (dmp.engine.comm) keep the rule: arrays by nbytes (subclasses
    # too), containers and Messages by their parts, a Message's type and scalars 8 bytes
    from dmp.engine.comm import payload_nbytes
    from dmp.engine.program import Broadcast

    class Row(tuple):
        pass

    a = np.zeros(10)
    plan = CDPlan(round=1, idx=np.arange(3), keep=2, filter=True, sweeps=1, inner_tol=0.1)
    assert payload_nbytes(plan) == 8 + 8 + 24 + 6 * 8
    assert payload_nbytes(np.ma.masked_array(a)) == 80
    assert payload_nbytes(Row((a, 1.0))) == 88
    assert payload_nbytes({"x": a, "n": None, "b": b"abc"}) == 83
    assert payload_nbytes(Broadcast([a, "s"])) == 88
    assert payload_nbytes(None) == 0 and payload_nbytes(np.float64(1.0)) == 8


# every estimator and kernel family (Lasso, sparsified SGD, the three LDA samplers, MF's
# methods in the precisions each has, ParMAC), small enough to take a second in all
_EVERY_KERNEL_FIT = textwrap.dedent("""
    import sys
    import numpy as np
    import scipy.sparse as sp
    from dmp.decomposition import LatentDirichletAllocation, MatrixFactorization
    from dmp.hashing import BinaryAutoencoder
    from dmp.io.synthetic import make_lda_corpus, make_ratings
    from dmp.linear_model import Lasso, SparsifiedSGDClassifier

    def every_kernel_fit():
        rng = np.random.default_rng(0)
        X = rng.standard_normal((60, 8))
        y = X @ rng.standard_normal(8)
        out = {"lasso": Lasso(alpha=0.01, random_state=0).fit(X, y).coef_,
               "lasso_sparse": Lasso(alpha=0.01, random_state=0).fit(
                   sp.random(60, 8, density=0.5, random_state=0, format="csc"), y).coef_,
               "sgd": SparsifiedSGDClassifier(max_iter=3, tol=None, random_state=0).fit(
                   X, y > 0).coef_}
        docs, _, _ = make_lda_corpus(n_docs=20, n_words=30, n_topics=3, doc_len=15, seed=0)
        for sampler in ("dense", "sparse", "buckets"):
            out[f"lda_{sampler}"] = LatentDirichletAllocation(
                4, max_iter=3, sampler=sampler, random_state=0).fit(docs).components_
        (u, i, r), _, _, _ = make_ratings(n_users=30, n_items=20, n_obs=300, rank=3, seed=0)
        R = sp.coo_matrix((r, (u, i)), shape=(30, 20))
        for method, dtype in (("ccd++", "float64"), ("ccd", "float64"), ("ccd", "float32"),
                              ("als", "float64"), ("als", "float32")):
            mf = MatrixFactorization(3, method=method, dtype=dtype, max_iter=2, tol=None,
                                     random_state=0).fit(R)
            out[f"mf_{method}_{dtype}"] = mf.item_factors_
        out["ba"] = BinaryAutoencoder(n_bits=4, max_iter=2, random_state=0).fit(
            rng.standard_normal((80, 6))).transform(X[:, :6])
        return out
""")


def test_a_fresh_process_loads_every_kernel_without_numbas_compiler_setup(tmp_path):
    """Cached kernels load with Numba's runtime only (`dmp.kernels._jit`): a fresh process
    fits every estimator without Numba's compiler registries or its extensions' entry
    points, to the same results as here
    (where the kernels were compiled or loaded before)."""
    scope = {}
    exec(_EVERY_KERNEL_FIT, scope)
    here = scope["every_kernel_fit"]()   # also fills Numba's cache for the child
    code = _EVERY_KERNEL_FIT + textwrap.dedent(f"""
        out = every_kernel_fit()
        np.savez({str(tmp_path / "child.npz")!r}, **out)
        import numba.core.entrypoints
        print("registries", "numba.np.linalg" in sys.modules)
        print("extensions", numba.core.entrypoints._already_initialized)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["registries", "False", "extensions", "False"], (
        f"a fit in a fresh process loaded Numba's compiler registries or scanned the "
        f"installed packages for Numba extensions: {proc.stdout}")
    with np.load(tmp_path / "child.npz") as child:
        assert sorted(child.files) == sorted(here)
        for name, value in here.items():
            np.testing.assert_array_equal(child[name], value, err_msg=name)


def test_every_kernel_is_made_by_dmps_njit():
    """Every Numba kernel in dmp loads as `dmp.kernels._jit.njit` makes it (a kernel made
    with ``numba.njit`` directly would bring back the compiler set-up on a first fit)."""
    import importlib
    import pkgutil

    from numba.core.registry import CPUDispatcher

    import dmp
    from dmp.kernels._jit import loads_without_refresh

    kernels = []
    for info in pkgutil.walk_packages(dmp.__path__, "dmp."):
        if info.name.endswith(("_lda_kernels", "_kernels", "_wstep")) or \
                info.name.startswith("dmp.kernels."):
            module = importlib.import_module(info.name)
            kernels += [(info.name, name) for name, obj in vars(module).items()
                        if isinstance(obj, CPUDispatcher) and obj.__module__ == info.name
                        and not loads_without_refresh(obj)]
    assert kernels == []


_NON_ALLOCATING_FITS = textwrap.dedent("""
    import sys
    import warnings

    import numpy as np
    import scipy.sparse as sp

    warnings.simplefilter("ignore")
    rng = np.random.default_rng(0)
    R = sp.csr_matrix((rng.standard_normal(4000), (rng.integers(0, 200, 4000),
                                                    rng.integers(0, 80, 4000))),
                      shape=(200, 80)).tocoo()
    from dmp.decomposition import MatrixFactorization

    for method, dtype in [("als", "float32"), ("als", "float64"), ("ccd++", "float64"),
                          ("ccd", "float64")]:
        MatrixFactorization(4, method=method, dtype=dtype, max_iter=2, tol=None,
                            random_state=0).fit(R)
    from dmp.linear_model import Lasso

    X = rng.standard_normal((60, 20))
    y = X[:, 0] + 0.1 * rng.standard_normal(60)
    Lasso(alpha=0.01).fit(X, y)
    Lasso(alpha=0.01).fit(sp.random(60, 300, density=0.1, format="csc", random_state=0), y)
    Lasso(alpha=0.01, backend="local", n_workers=2).fit(X, y)
    from dmp.decomposition import LatentDirichletAllocation
    from dmp.io.synthetic import make_lda_corpus

    C = make_lda_corpus(n_docs=40, n_words=60, doc_len=30)[0].tocsr()
    for sampler, P in [("dense", 1), ("dense", 2), ("sparse", 1), ("buckets", 2)]:
        lda = LatentDirichletAllocation(4, max_iter=2, sampler=sampler, backend="local",
                                        n_workers=P, random_state=0).fit(C)
    lda.transform(C[:5])
    from dmp.hashing import BinaryAutoencoder
    from dmp.linear_model import SparsifiedSGDClassifier

    Xs = rng.standard_normal((200, 8))
    ys = (Xs[:, 0] > 0).astype(int)
    for method in ("isgd", "isega", "isaga", "iasgd"):
        SparsifiedSGDClassifier(method=method, max_iter=2, n_workers=2, backend="local",
                                random_state=0).fit(Xs, ys)
    for w_step, z_method in [("sgd", "enumerate"), ("dcd", "alternate")]:
        BinaryAutoencoder(n_bits=4, max_iter=2, w_step=w_step, z_method=z_method,
                          random_state=0).fit(Xs).transform(Xs[:5])
    print("arrayobj", "numba.np.arrayobj" in sys.modules)
""")


def test_no_fit_loads_a_kernel_that_allocates():
    """The kernels of every estimator (MF's methods, the Lasso on dense and sparse input and
    on two partitions, LDA's samplers, scores and `transform`, the sparsified SGD's methods,
    the binary autoencoder's W and Z steps and its validation search) take their buffers
    from the caller: a fresh process's first fits never make Numba import its array
    implementation, which loading the first cached kernel that allocates costs (50-90 ms
    here)."""
    exec(_NON_ALLOCATING_FITS, {})   # fills Numba's cache for the child
    proc = subprocess.run([sys.executable, "-c", _NON_ALLOCATING_FITS], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-2:] == ["arrayobj", "False"], proc.stdout


def test_plain_arrays_skip_scikit_learns_checks_and_anything_else_takes_them(monkeypatch):
    """A float64 matrix and a numeric target, finite and of one length, are passed as they
    are (what `validate_data` would return); every other input, bad ones included, still
    goes through scikit-learn's checks and messages."""
    import pytest
    import dmp.base
    from dmp.linear_model import Lasso, SparsifiedSGDClassifier

    calls = []
    real = dmp.base.validate_data
    monkeypatch.setattr(dmp.base, "validate_data",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    rng = np.random.default_rng(0)
    X = rng.standard_normal((30, 4))
    y = X @ rng.standard_normal(4)
    est = Lasso(alpha=0.01).fit(X, y)
    assert calls == [] and est.n_features_in_ == 4
    ref = Lasso(alpha=0.01).fit(X.tolist(), y)   # a list: scikit-learn converts it
    assert calls == [1]
    np.testing.assert_array_equal(est.coef_, ref.coef_)
    labels = (y > 0).astype(int)
    clf = SparsifiedSGDClassifier(max_iter=2, tol=None, random_state=0)
    clf.fit(X, labels).partial_fit(X, labels)
    assert calls == [1]
    for bad_X, bad_y, message in [
            (np.where(X > 1, np.nan, X), y, "Input X contains NaN"),
            (X, np.where(y > 1, np.inf, y), "Input y contains infinity"),
            (X, y[:-1], "inconsistent numbers of samples"),
            (X[:, :0], y, "0 feature"),
    ]:
        with pytest.raises(ValueError, match=message):
            Lasso(alpha=0.01).fit(bad_X, bad_y)
    with pytest.raises(ValueError, match="expecting 4 features"):
        clf.partial_fit(X[:, :3], labels)
    assert len(calls) == 6
