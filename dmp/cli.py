"""The ``dmp`` command line: ``dmp run``, ``dmp data``, ``dmp monitor``, ``dmp k8s``."""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import signal
import sys
import threading
import warnings


#: dest: (option, the Dask setting it gives, help)
_TLS_OPTIONS = {
    "tls_ca_file": ("--tls-ca-file", "distributed.comm.tls.ca-file",
                    "CA certificate(s) the scheduler's certificate is signed by"),
    "tls_cert": ("--tls-cert", "distributed.comm.tls.client.cert", "the client's certificate"),
    "tls_key": ("--tls-key", "distributed.comm.tls.client.key", "the client's private key"),
}


def _tls_config(args, address) -> dict:
    """The Dask settings the ``--tls-*`` options give (checked against ``address``): the
    client then takes them like any other Dask TLS configuration."""
    given = {dest: getattr(args, dest) for dest in _TLS_OPTIONS
             if getattr(args, dest) is not None}
    if not given:
        return {}
    options = ", ".join(_TLS_OPTIONS[d][0] for d in given)
    if address is None:
        raise ValueError(f"{options}: only for --scheduler tls://host:port (the embedded "
                         f"cluster does not use TLS)")
    if not str(address).startswith(("tls://", "wss://")):
        raise ValueError(f"{options} given for the scheduler address {address!r}, which is "
                         f"not a TLS one: use tls://host:port")
    return {_TLS_OPTIONS[d][1]: value for d, value in given.items()}


def _add_tls_options(parser) -> None:
    for dest, (opt, key, what) in _TLS_OPTIONS.items():
        parser.add_argument(opt, dest=dest, metavar="PEM",
                            help=f"tls:// scheduler: {what} (default Dask's {key})")


def _cmd_run(args) -> int:
    import dask

    from .pipeline import load_pipeline, run_pipeline

    tls = _tls_config(args, args.scheduler)
    spec = load_pipeline(args.pipeline)
    # only the main thread may set handlers (a caller running the CLI in a thread keeps its own)
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, _interrupt_quietly) if main_thread else None
    try:
        with dask.config.set(tls):
            run_pipeline(spec, scheduler=args.scheduler, workers=args.workers,
                         resume=args.resume, output=args.output,
                         show_progress=not args.no_progress)
    except KeyboardInterrupt:
        # Ctrl-C is the user's choice, not a failure: no traceback, the way back instead
        end_bar = "" if args.no_progress else "\n"
        print(f"{end_bar}dmp: run interrupted; its checkpoints are kept, continue it with: "
              f"{_resume_command(args)}", file=sys.stderr)
        return 130
    finally:
        if main_thread:
            signal.signal(signal.SIGINT, previous)
    return 0


def _interrupt_quietly(signum, frame) -> None:
    """Ctrl-C during ``dmp run``: Dask's loggers are silenced before the interrupt is
    raised, since what the loop thread logs about the calls it cancels would otherwise race
    the driver's own handling of it."""
    from .pipeline import _silence_distributed

    _silence_distributed()
    raise KeyboardInterrupt


def _resume_command(args) -> str:
    """The ``dmp run`` command line of ``args`` with ``--resume``."""
    import shlex

    argv = ["dmp", "run", args.pipeline]
    if args.scheduler:
        argv += ["--scheduler", args.scheduler]
    if args.workers:
        argv += ["--workers", str(args.workers)]
    argv.append("--resume")
    if args.output:
        argv += ["--output", args.output]
    if args.no_progress:
        argv.append("--no-progress")
    return shlex.join(argv)


def _cmd_monitor(args) -> int:
    import dask

    from .monitor import follow

    if args.timeout is not None and args.timeout <= 0:
        raise ValueError(f"--timeout must be positive, got {args.timeout}")
    with dask.config.set(_tls_config(args, args.address)):
        follow(args.address, exit_when_done=args.exit_when_done, timeout=args.timeout,
               interval=args.interval)
    return 0


def _cmd_k8s_render(args) -> int:
    from .k8s import render_job, to_yaml

    doc = render_job(args.pipeline, workers=args.workers, image=args.image, memory=args.memory,
                     cpu=args.cpu, pvc=None if args.no_pvc else args.pvc,
                     storage_secret=args.storage_secret, name=args.name,
                     namespace=args.namespace)
    sys.stdout.write(to_yaml(doc))
    return 0


def _cmd_k8s_cluster(args) -> int:
    from .k8s import render_cluster, to_yaml

    sys.stdout.write(to_yaml(render_cluster(name=args.name, workers=args.workers,
                                            image=args.image, memory=args.memory, cpu=args.cpu,
                                            pvc=None if args.no_pvc else args.pvc)))
    return 0


class _warnings_as_lines(warnings.catch_warnings):
    """A data command's warnings (a file cut short, ...) as ``dmp: warning: ...`` lines,
    not Python's ``file:line: UserWarning`` with a line of dmp's source."""

    def __init__(self):
        super().__init__(record=True)

    def __enter__(self):
        self._caught = super().__enter__()
        return self._caught

    def __exit__(self, *exc):
        super().__exit__(*exc)
        for w in self._caught:
            print(f"dmp: warning: {w.message}", file=sys.stderr)


def _cmd_data_make(args) -> int:
    from .io import build_dataset

    with _warnings_as_lines():
        ds = build_dataset(args.recipe, args.output, overwrite=args.overwrite)
    print(ds)
    return 0


def _validated(ds) -> str:
    """What ``ds.validate()`` (which returned) checked, in one line."""
    from .io import DenseDataset, RatingsDataset, SparseRowDataset
    from .utils.text import plural

    if isinstance(ds, RatingsDataset):
        total = sum(ds.nnz_of(s) for s in ds.splits)
        ids = "" if ds.load_ids()[0] is None else "; user and item ids distinct"
        return (f"validated: ok ({plural(len(ds.splits), 'split')}, "
                f"{plural(total, 'rating', grouped=True)}: every array present with its dtype "
                f"and length, indices in range and sorted, ratings finite, the by-user and "
                f"by-item copies equal, counts as in the metadata, no pair in two "
                f"splits{ids})")
    if isinstance(ds, DenseDataset):
        queries = (f" and {plural(ds.n_queries, 'held-out query', 'held-out queries')}"
                   if ds.n_queries else "")
        return (f"validated: ok ({plural(ds.n_shards, 'shard')} of "
                f"{plural(ds.n_samples, 'point', grouped=True)}{queries}: float32 of the "
                f"declared shapes, every value finite)")
    extra = ""
    if isinstance(ds, SparseRowDataset):
        extra = "".join(f", {what} of the right length"
                        for what, there in (("vocabulary", ds.load_vocabulary()),
                                            ("document names", ds.load_names()))
                        if there is not None)
    else:
        extra = ", column sums and squared norms matching the data"
    return (f"validated: ok ({plural(ds.n_shards, 'shard')}, "
            f"{plural(ds.nnz, 'stored value', grouped=True)} and "
            f"{plural(ds.n_samples, 'target', grouped=True)}: every array present with its "
            f"dtype and length, indices in range and strictly increasing, no stored zeros, "
            f"values and targets finite, counts as in the metadata{extra})")


def _cmd_data_info(args) -> int:
    from .io import DenseDataset, RatingsDataset, SparseRowDataset, open_dataset
    from .utils.text import plural

    ds = open_dataset(args.path)
    if args.validate:
        ds.validate()
    print(ds)
    if isinstance(ds, SparseRowDataset):
        print(f"kind: {ds.KIND}")
        print(f"row_bounds: {ds.row_bounds.tolist()}")
        names = ds.load_names(0, 3)   # not all of them: a corpus may have millions
        if names is not None:
            first = ", ".join(str(x) for x in names) + (", ..." if ds.n_samples > 3 else "")
            print(f"names: {ds.n_samples} ({first})")
    if isinstance(ds, DenseDataset):
        print(f"kind: {ds.KIND}")
        print(f"row_bounds: {ds.row_bounds.tolist()}")
        print(f"held-out queries: {ds.n_queries}")
    if isinstance(ds, RatingsDataset):
        print(f"kind: {ds.KIND}")
        print(f"shape: {plural(ds.n_users, 'user')} x {plural(ds.n_items, 'item')}")
        print(f"splits: {', '.join(ds.splits)}")
        for s in ds.splits:
            print(f"nnz[{s}]: {ds.nnz_of(s)}")
        lo_hi = "" if ds.rating_range is None else \
            f", ratings in [{ds.rating_range[0]:g}, {ds.rating_range[1]:g}]"
        print(f"duplicates: {ds.duplicates}{lo_hi}")
    if args.validate:
        print(_validated(ds))
    return 0


def _fractions(text: str) -> tuple[float, ...]:
    try:
        fr = tuple(float(x) for x in text.split(","))
    except ValueError:
        fr = ()
    if len(fr) != 3:
        raise argparse.ArgumentTypeError(f"expected three comma-separated fractions "
                                         f"train,valid,test (e.g. 0.8,0.1,0.1), got {text!r}")
    return fr


def _columns(text: str) -> tuple:
    """``--columns``: three header names, or three 0-based positions, comma-separated."""
    parts = [x.strip() for x in text.split(",")]
    if len(parts) != 3 or not all(parts):
        raise argparse.ArgumentTypeError(f"expected three comma-separated columns USER,ITEM,"
                                         f"RATING (header names, or 0-based positions such "
                                         f"as 0,1,3), got {text!r}")
    if all(x.isdigit() for x in parts):
        return tuple(int(x) for x in parts)
    return tuple(parts)


def _int_at_least(low: int):
    """An argparse type: an integer >= ``low``, refused at once with a clear message."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    parse.__name__ = f"integer >= {low}"
    return parse


def _cmd_data_convert(args) -> int:
    with _warnings_as_lines():
        ds = args.convert(args)
    print(ds)
    return 0


def _convert_svmlight(args):
    from .io import convert_svmlight

    return convert_svmlight(args.source, args.dest, n_shards=args.shards,
                            n_features=args.n_features, overwrite=args.overwrite,
                            layout=args.layout)


def _convert_ratings(args):
    from .io import convert_ratings

    return convert_ratings(args.source, args.dest, format=args.file_format, split=args.split,
                           seed=args.seed, duplicates=args.duplicates, sep=args.sep,
                           columns=args.columns, overwrite=args.overwrite)


def _convert_uci(args):
    from .io import convert_corpus

    return convert_corpus(args.source, args.dest, format="uci", vocab=args.vocab,
                          n_shards=args.shards, overwrite=args.overwrite)


def _convert_text(args):
    from .io import convert_corpus

    return convert_corpus(args.source, args.dest, format="text", n_shards=args.shards,
                          overwrite=args.overwrite, per=args.per,
                          stop_words=None if args.stop_words == "none" else args.stop_words,
                          min_count=args.min_count)


def _convert_features(args):
    from .io import convert_features

    return convert_features(args.source, args.dest, n_shards=args.shards,
                            n_queries=args.n_queries, queries_source=args.queries_source,
                            max_points=args.max_points, seed=args.seed,
                            overwrite=args.overwrite)


class _FormatParser(argparse.ArgumentParser):
    """The parser of one ``dmp data convert`` format: an option of another format is an
    error that names it (argparse alone would call it unrecognized)."""

    #: the options of the other formats (set once every format is declared)
    foreign: frozenset = frozenset()

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        given = sorted({a.split("=", 1)[0] for a in extras} & self.foreign)
        if given:
            fmt = self.prog.rsplit(" ", 1)[-1]
            self.error(f"{', '.join(given)}: not an option of {fmt} conversion")
        return namespace, extras


def _add_convert_parser(dsub) -> None:
    """``dmp data convert FORMAT SOURCE DEST``: one sub-parser per format, with that
    format's options only."""
    conv = dsub.add_parser("convert", help="convert a file to a dmp Zarr dataset",
                           description="Convert a file to a dmp Zarr dataset; "
                                       "'dmp data convert FORMAT --help' lists a format's "
                                       "options.")
    formats = conv.add_subparsers(dest="format", required=True, metavar="FORMAT",
                                  parser_class=_FormatParser)

    def add(name, what, convert):
        f = formats.add_parser(name, help=what, description=what)
        f.add_argument("source", help="the file to convert" if name != "features" else
                       "the file to convert, or 'digits' (scikit-learn's)")
        f.add_argument("dest", help="the Zarr dataset to write")
        f.set_defaults(func=_cmd_data_convert, convert=convert)
        return f

    def shards(f):
        f.add_argument("--shards", type=_int_at_least(1), default=None,
                       help="number of shards")

    svm = add("svmlight", "LIBSVM file -> sparse store", _convert_svmlight)
    shards(svm)
    svm.add_argument("--layout", choices=["columns", "rows"], default="columns",
                     help="shard by columns (model-parallel, default) or by rows "
                          "(data-parallel)")
    svm.add_argument("--n-features", type=_int_at_least(1), default=None, help="columns")

    rat = add("ratings", "user/item/rating file -> ratings store", _convert_ratings)
    rat.add_argument("--format", dest="file_format",
                     choices=["auto", "movielens", "csv", "triplets"], default="auto",
                     help="file format (default auto)")
    rat.add_argument("--split", type=_fractions, default=(0.8, 0.1, 0.1),
                     help="train,valid,test fractions (default 0.8,0.1,0.1)")
    rat.add_argument("--seed", type=int, default=0, help="split seed (default 0)")
    rat.add_argument("--duplicates", choices=["error", "mean", "last", "sum"],
                     default="error", help="repeated (user, item) pairs (default error)")
    rat.add_argument("--sep", default=None,
                     help="field delimiter (default sniffed; '\\t' or 'tab' for tab)")
    rat.add_argument("--columns", type=_columns, default=None,
                     help="the user, item and rating columns, by header name "
                          "(userId,movieId,stars) or 0-based position (0,1,3) (default: "
                          "found by name in the header, else the first three)")

    uci = add("uci", "UCI bag-of-words docword file -> corpus store", _convert_uci)
    shards(uci)
    uci.add_argument("--vocab", default=None, help="the vocab.*.txt file")

    txt = add("text", "plain-text documents -> corpus store", _convert_text)
    shards(txt)
    txt.add_argument("--per", choices=["line", "file"], default="line",
                     help="one document per line of SOURCE, or per file of the directory "
                          "SOURCE (default line)")
    txt.add_argument("--min-count", type=_int_at_least(1), default=5,
                     help="prune words seen fewer times in all (default 5)")
    txt.add_argument("--stop-words", choices=["english", "none"], default="english",
                     help="stop-word list (default english)")

    feat = add("features", ".fvecs/.bvecs/.ivecs/.npy/CSV feature vectors (or 'digits', "
                           "scikit-learn's) -> dense store", _convert_features)
    shards(feat)
    feat.add_argument("--queries", dest="n_queries", type=_int_at_least(0), default=0,
                      help="hold out this many random points as queries")
    feat.add_argument("--queries-file", dest="queries_source", default=None,
                      help="held-out queries from this file (e.g. *_query.fvecs)")
    feat.add_argument("--max-points", type=_int_at_least(1), default=None,
                      help="keep the first points only")
    feat.add_argument("--seed", type=int, default=0, help="query-draw seed (default 0)")

    parsers = (svm, rat, uci, txt, feat)
    for f in parsers:
        f.add_argument("--overwrite", action="store_true",
                       help="replace a dmp dataset already at DEST")
    options = {f: {o for a in f._actions for o in a.option_strings} for f in parsers}
    every = set().union(*options.values())
    for f in parsers:
        f.foreign = frozenset(every - options[f])


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dmp", description="Dynamic model parallelism on Dask.")
    p.add_argument("-v", "--verbose", action="count", default=0)
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="run a pipeline (dataset -> fit -> metrics, plot, model)")
    r.add_argument("pipeline", help="pipeline YAML file, e.g. pipelines/lasso.yaml")
    g = r.add_mutually_exclusive_group()
    g.add_argument("--scheduler", help="address of a running Dask scheduler (tcp://host:8786, "
                                      "or tls://host:8786 with the --tls-* options or Dask's "
                                      "TLS configuration)")
    g.add_argument("--workers", type=_int_at_least(1),
                   help="worker processes of the embedded LocalCluster")
    r.add_argument("--resume", action="store_true", help="continue from the last checkpoints")
    r.add_argument("--output", help="output folder (default: the pipeline's 'output')")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_tls_options(r)
    r.set_defaults(func=_cmd_run)

    mo = sub.add_parser("monitor", help="follow the dmp fits running on a Dask cluster")
    mo.add_argument("address", help="scheduler address, e.g. tcp://127.0.0.1:8786 (tls://... "
                                    "with the --tls-* options or Dask's TLS configuration)")
    mo.add_argument("--exit-when-done", action="store_true",
                    help="return once a fit was followed and none is running any more")
    mo.add_argument("--timeout", type=float, default=None, help="return after this many seconds")
    mo.add_argument("--interval", type=float, default=1.0,
                    help="seconds between progress lines of one fit (default 1)")
    _add_tls_options(mo)
    mo.set_defaults(func=_cmd_monitor)

    k = sub.add_parser("k8s", help="Kubernetes manifests for the Dask operator")
    ksub = k.add_subparsers(dest="k8s_command", required=True)
    from .k8s import DEFAULT_IMAGE

    for kname, khelp in (("render", "print a DaskJob that runs a pipeline"),
                         ("cluster", "print a DaskCluster for interactive use")):
        kp = ksub.add_parser(kname, help=khelp)
        if kname == "render":
            kp.add_argument("pipeline", help="pipeline YAML in pipelines/")
            kp.add_argument("--storage-secret", default=None,
                            help="Secret with object-store credentials (env of job + workers)")
            kp.add_argument("--namespace", default=None)
        kp.add_argument("--workers", type=_int_at_least(1), default=2,
                        help="worker pods (default 2)")
        kp.add_argument("--image", default=DEFAULT_IMAGE, help=f"image (default {DEFAULT_IMAGE})")
        kp.add_argument("--memory", default="4Gi", help="memory per worker (default 4Gi)")
        kp.add_argument("--cpu", default="1", help="CPU request per worker (default 1)")
        kp.add_argument("--pvc", default="dmp-data",
                        help="ReadWriteMany claim mounted at /data (default dmp-data)")
        kp.add_argument("--no-pvc", action="store_true", help="no volume (object-store data)")
        kp.add_argument("--name", default=None if kname == "render" else "dmp")
        kp.set_defaults(func=_cmd_k8s_render if kname == "render" else _cmd_k8s_cluster)

    d = sub.add_parser("data", help="build, convert and inspect datasets")
    dsub = d.add_subparsers(dest="data_command", required=True)
    m = dsub.add_parser("make", help="build a dataset from a recipe (name or YAML file)")
    m.add_argument("recipe")
    m.add_argument("--output", help="Zarr path (default: the cache directory)")
    m.add_argument("--overwrite", action="store_true")
    m.set_defaults(func=_cmd_data_make)
    _add_convert_parser(dsub)
    i = dsub.add_parser("info", help="print a dataset's metadata")
    i.add_argument("path")
    i.add_argument("--validate", action="store_true", help="read and check every shard")
    i.set_defaults(func=_cmd_data_info)
    _add_plan_parser(sub)
    return p


def _workers_list(text: str) -> list[int]:
    """``"1,2,4,...,1024"`` -> [1, 2, 4, ..., 1024]: ``...`` continues the two numbers
    before it up to the one after it, by their ratio when the second is a multiple of the
    first, else by their step (``"2,5,...,11"``)."""
    parts = [p.strip() for p in text.split(",")]
    bad = argparse.ArgumentTypeError(
        f"workers must be whole numbers >= 1 separated by commas, e.g. 1,2,4,...,1024; got "
        f"{text!r}")
    out: list[int] = []
    for i, part in enumerate(parts):
        if part in ("...", "…"):
            if len(out) < 2 or i + 1 >= len(parts) or not parts[i + 1].isdigit():
                raise bad
            a, b, end = out[-2], out[-1], int(parts[i + 1])
            nxt = (lambda v: v * (b // a)) if a and b % a == 0 and b // a > 1 \
                else (lambda v: v + (b - a))
            if b <= a or end <= b:
                raise bad
            v = nxt(b)
            while v < end:
                out.append(v)
                v = nxt(v)
            continue
        if not part.isdigit() or int(part) < 1:
            raise bad
        out.append(int(part))
    return sorted(set(out))


def _local_alpha_max(ds, fit_intercept) -> float:
    """``||X~^T y~||_inf / n`` of a store, read here shard by shard (`dmp plan` has no
    cluster)."""
    from .pipeline import _shard_max_corr

    y = ds.load_y()
    ytil = y - y.mean() if fit_intercept else y
    return max(_shard_max_corr(ds, k, ytil) for k in range(ds.n_shards)) / ds.n_samples


def _cmd_plan(args) -> int:
    import json

    from .pipeline import _check_store_kind, _open_data, load_pipeline
    from .planning import parse_network, plan, plot_plan, table_text

    network = parse_network(args.network)      # a bad string fails before any work
    if args.probe_all_workers and not args.probe_on:
        raise ValueError("--probe-all-workers needs --probe-on ADDRESS, the cluster whose "
                         "workers probe")
    spec = load_pipeline(args.pipeline)
    ds = _open_data(spec)
    cls = spec.estimator.cls
    _check_store_kind(spec, ds, cls)
    params = dict(spec.estimator.params)
    ratio = params.pop("alpha_ratio", None)
    if ratio is not None:
        params["alpha"] = float(ratio) * _local_alpha_max(ds, params.get("fit_intercept", True))
    if spec.compare is not None:   # a pipeline that compares settings: plan the first
        params[spec.compare.key] = spec.compare.values[0]
    client = None
    if args.probe_on:
        from .utils.cluster import connect

        client = connect(args.probe_on, set_as_default=False)
    try:
        rows = plan(cls(**params), ds, workers=args.workers, network=network,
                    cores_per_worker=args.cores_per_worker, driver_cores=args.driver_cores,
                    cpu_period=args.cpu_period, memory_per_worker=args.memory_per_worker,
                    probe_max=args.probe_max, probe_seconds=args.probe_seconds, probe_on=client,
                    probe_all_workers=args.probe_all_workers, as_frame=False)
    finally:
        if client is not None:
            client.close()
    if args.png:
        plot_plan(rows, args.png, title=f"dmp plan {spec.name} ({network})")
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        quota = ("" if args.cores_per_worker >= 1 or args.cpu_period is None else
                 f" (a CPU quota, period {args.cpu_period * 1e3:g} ms)")
        print(f"{spec.name}: {cls.__name__} on {ds}; network {network}, "
              f"{args.cores_per_worker:g} core(s) per worker{quota}, {args.driver_cores:g} "
              f"for the driver (seconds: round loop and its split over the rounds)")
        print(table_text(rows))
    return 0


def _cpu_period(text: str) -> float | None:
    from .planning import _seconds

    try:
        v = float(text)             # seconds
    except ValueError:
        v = _seconds(text)
    if v is None or not 0 < v < float("inf"):
        raise argparse.ArgumentTypeError(f"--cpu-period must be a duration > 0 such as 100ms "
                                         f"or 10ms; got {text!r}")
    return v


def _positive_float(what: str):
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            v = float("nan")
        if not v > 0 or v == float("inf"):
            raise argparse.ArgumentTypeError(f"{what} must be a number > 0, got {text!r}")
        return v
    return parse


def _add_plan_parser(sub) -> None:
    pl = sub.add_parser("plan", help="predict a pipeline's fit on P workers from a short "
                                     "probe (time per round, split, memory per worker)")
    pl.add_argument("pipeline", help="pipeline YAML file, e.g. pipelines/lda.yaml")
    pl.add_argument("--workers", type=_workers_list, default=_workers_list("1,2,4,...,64"),
                    help="numbers of workers, e.g. 1,2,4,...,1024 (default 1,2,4,...,64)")
    pl.add_argument("--network", default="10Gbit,50us",
                    help="each link's bandwidth and latency (default 10Gbit,50us)")
    pl.add_argument("--cores-per-worker", type=_positive_float("--cores-per-worker"),
                    default=1.0, help="cores of each worker (default 1)")
    pl.add_argument("--driver-cores", type=_positive_float("--driver-cores"), default=1.0,
                    help="cores of the driver (default 1)")
    pl.add_argument("--cpu-period", type=_cpu_period, default=None, metavar="DURATION",
                    help="with fractional cores: price pushes as bursts of a CPU quota of "
                         "this period, e.g. 100ms (Kubernetes, Docker) or 10ms (dmp.testing."
                         "EmulatedCluster); default: a uniformly slowed core")
    pl.add_argument("--memory-per-worker", default="4GiB",
                    help="each worker's memory limit (default 4GiB)")
    pl.add_argument("--probe-max", type=_int_at_least(1), default=8,
                    help="probe every P up to this one, predict larger ones (default 8)")
    pl.add_argument("--probe-seconds", type=_positive_float("--probe-seconds"), default=5.0,
                    help="about how long each probe runs (default 5; at least two rounds "
                         "past the model's first rounds of other work: for LDA, one sweep "
                         "and more)")
    pl.add_argument("--probe-on", metavar="ADDRESS",
                    help="run the probes on a worker of the Dask scheduler at ADDRESS, to "
                         "time the kernels on the workers' own machines (default: here)")
    pl.add_argument("--probe-all-workers", action="store_true",
                    help="with --probe-on: probe on every worker at once and plan with the "
                         "slowest (kernels timed with all workers busy)")
    pl.add_argument("--json", action="store_true", help="print the table as JSON")
    pl.add_argument("--png", metavar="FILE", help="write the predicted speed-up to FILE")
    pl.set_defaults(func=_cmd_plan)


def _one_line(exc) -> str:
    return " ".join(str(exc).split())


def _scheduler_lost_line(exc, argv) -> str:
    """What `dmp run` prints when the scheduler went away: the round, and the command that
    continues the run from its checkpoints (or runs it again when there are none)."""
    import shlex

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] != ["run"] or exc.address is None:
        return _one_line(exc)
    where = f"the Dask scheduler at {exc.address} was lost" + (
        f" at round {exc.round}" if exc.round is not None else "")
    if exc.checkpoint_round is not None:
        again = argv if "--resume" in argv else [*argv, "--resume"]
        return (f"{where}; its checkpoints remain (round {exc.checkpoint_round} in "
                f"{exc.checkpoint}): start the cluster again and continue with: "
                f"dmp {shlex.join(again)}")
    return (f"{where}, before its first checkpoint; start the cluster again and rerun: "
            f"dmp {shlex.join(argv)}")


def main(argv=None) -> int:
    from .exceptions import DMPError, SchedulerLostError

    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING - 10 * min(args.verbose, 2),
                        format="%(levelname)s %(name)s: %(message)s")
    if not args.verbose:
        # the embedded cluster's start/stop chatter is not the user's business (distributed
        # sets its child loggers' levels itself, so filter at the handlers)
        quiet = ("distributed", "bokeh", "tornado")

        def keep(record):
            if (record.name.startswith(quiet) and record.exc_info
                    and isinstance(record.exc_info[1], asyncio.CancelledError)):
                # a client closed while it tries to reach a lost scheduler again logs the
                # cancelled attempt as an error (the run's own error says what happened)
                return False
            if (record.name == "distributed.client"
                    and str(record.msg).startswith("Failed to reconnect to scheduler")):
                # the client's own give-up when the scheduler is gone: the run's error
                # (SchedulerLostError) says it in one line, with how to resume
                return False
            return record.levelno >= logging.WARNING or not record.name.startswith(quiet)

        for handler in logging.getLogger().handlers:
            handler.addFilter(keep)
    try:
        return args.func(args)
    except SchedulerLostError as exc:
        print(f"dmp: error: {_scheduler_lost_line(exc, argv)}", file=sys.stderr)
        return 1
    except (ValueError, FileNotFoundError, FileExistsError, ConnectionError) as exc:
        print(f"dmp: error: {exc}", file=sys.stderr)
        return 2
    except DMPError as exc:
        # dmp's named errors of a fit (worker losses it gave up on, a model too big for
        # the workers, a paused worker): one line, not a traceback
        print(f"dmp: error: {_one_line(exc)}", file=sys.stderr)
        return 1
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        path = exc.filename or getattr(args, "dest", None) or getattr(args, "output", None)
        where = f" writing {path}" if path else ""
        print(f"dmp: error: no space left on device{where} ({exc.strerror or exc}); free "
              f"space there or write elsewhere (--output, the pipeline's "
              f"'checkpoints')", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
