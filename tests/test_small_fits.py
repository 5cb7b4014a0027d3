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
    assert payload_nbytes(plan) == 8 + 8 + 24 + 5 * 8
    assert payload_nbytes(np.ma.masked_array(a)) == 80
    assert payload_nbytes(Row((a, 1.0))) == 88
    assert payload_nbytes({"x": a, "n": None, "b": b"abc"}) == 83
    assert payload_nbytes(Broadcast([a, "s"])) == 88
    assert payload_nbytes(None) == 0 and payload_nbytes(np.float64(1.0)) == 8
