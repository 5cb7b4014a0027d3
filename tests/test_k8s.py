"""Kubernetes manifests: offline validation (core schemas, the operator's CRD schemas, a strict
unknown-key check) and container commands that resolve to real entry points."""

import copy
import glob
import importlib.util
import io
import re
import shutil
import subprocess
import sys
from contextlib import redirect_stdout
from functools import lru_cache
from pathlib import Path

import pytest
import yaml

from dmp.cli import build_parser, main
from dmp.k8s import render_cluster, render_job, to_yaml, write_base

REPO = Path(__file__).resolve().parents[1]
K8S = REPO / "k8s"
PIPELINES = sorted((REPO / "pipelines").glob("*.yaml"))
kubernetes_validate = pytest.importorskip("kubernetes_validate")


# ---------------------------------------------------------------------------------------
# validators


# .ci/install unpacks the dask-kubernetes wheel here, off the import path (see there why)
CRD_PACKAGE = Path(sys.prefix) / "share" / "dask-kubernetes" / "dask_kubernetes"


@lru_cache(maxsize=1)
def crd_schemas() -> dict:
    """{(apiVersion, kind): openAPIV3Schema} from the CRDs in the dask-kubernetes wheel."""
    if CRD_PACKAGE.is_dir():
        root = CRD_PACKAGE
    else:                    # an environment made by an earlier .ci/install
        spec = importlib.util.find_spec("dask_kubernetes")
        if spec is None:
            pytest.skip(f"dask-kubernetes' CRDs are not in {CRD_PACKAGE} (.ci/install puts them "
                        "there)")
        root = Path(spec.submodule_search_locations[0])
    files = glob.glob(str(root / "operator/deployment/helm/dask-kubernetes-operator/crds/*.yaml"))
    assert files, f"no CRDs found under {root}"
    out = {}
    for f in files:
        # libyaml's loader where PyYAML has it: the same documents, parsed ~7x faster (the
        # CRDs are large: pure-Python parsing took seconds of the module's time)
        crd = yaml.load(Path(f).read_text(), Loader=getattr(yaml, "CSafeLoader",
                                                             yaml.SafeLoader))
        for ver in crd["spec"]["versions"]:
            out[(f"{crd['spec']['group']}/{ver['name']}", crd["spec"]["names"]["kind"])] = \
                ver["schema"]["openAPIV3Schema"]
    return out


def strict_unknown_keys(value, schema, path="") -> list[str]:
    """Keys the schema does not define (where it does not allow arbitrary ones)."""
    if not isinstance(schema, dict) or schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    errors = []
    if isinstance(value, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, sub in value.items():
            if props is not None and key in props:
                errors += strict_unknown_keys(sub, props[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                errors += strict_unknown_keys(sub, extra, f"{path}.{key}")
            elif extra is True or (props is None and extra is None):
                continue
            else:
                errors.append(f"{path}.{key}: not defined by the schema")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            errors += strict_unknown_keys(item, schema["items"], f"{path}[{i}]")
    return errors


def _pod_specs(doc):
    spec = doc.get("spec", {})
    if doc["kind"] == "DaskJob":
        yield "job", spec["job"]["spec"]
        spec = spec["cluster"]["spec"]
    if doc["kind"] in ("DaskJob", "DaskCluster"):
        yield "worker", spec["worker"]["spec"]
        yield "scheduler", spec["scheduler"]["spec"]


def validate(doc) -> None:
    """Raise AssertionError with every problem of one manifest."""
    import jsonschema

    kv_version = kubernetes_validate.utils.latest_version()
    if doc.get("apiVersion", "").startswith("kubernetes.dask.org/"):
        schema = crd_schemas().get((doc["apiVersion"], doc["kind"]))
        assert schema is not None, f"no CRD schema for {doc['apiVersion']} {doc['kind']}"
        assert doc.get("metadata", {}).get("name"), "metadata.name is required"
        errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
                  for e in jsonschema.Draft7Validator(schema).iter_errors(doc)]
        errors += strict_unknown_keys({"spec": doc["spec"]}, schema)
        for role, pod in _pod_specs(doc):   # the pod specs also against core Kubernetes
            pod_doc = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": role},
                       "spec": pod}
            try:
                kubernetes_validate.validate(pod_doc, kv_version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                errors.append(f"{role} pod: {exc.message}")
        assert not errors, f"{doc['kind']} {doc['metadata'].get('name')}: " + "; ".join(errors)
    else:
        try:
            kubernetes_validate.validate(doc, kv_version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(f"{doc['kind']}: {exc.message}") from exc


def containers(doc):
    for _, pod in _pod_specs(doc):
        yield from pod.get("containers", [])


def manifest_docs():
    files = [f for f in K8S.rglob("*.yaml") if f.name != "kustomization.yaml"]
    assert files
    for f in files:
        for doc in yaml.safe_load_all(f.read_text()):
            if doc:
                yield f.relative_to(REPO), doc


# ---------------------------------------------------------------------------------------
# the committed manifests


def test_committed_manifests_are_what_dmp_renders(tmp_path):
    for path in write_base(tmp_path):
        committed = K8S / path.relative_to(tmp_path)
        assert committed.exists(), f"{committed} is missing: run python -m dmp.k8s k8s"
        assert committed.read_text() == path.read_text(), \
            f"{committed} is stale: run python -m dmp.k8s k8s"
    assert sorted(p.stem for p in (K8S / "jobs").glob("*.yaml") if p.stem != "kustomization") \
        == sorted(p.stem for p in PIPELINES)      # one DaskJob per pipeline


@pytest.mark.parametrize("name,doc", [(str(f), d) for f, d in manifest_docs()],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_every_manifest_validates(name, doc):
    validate(doc)


def _kustomize(overlay):
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (with its built-in kustomize) is not installed")
    out = subprocess.run([kubectl, "kustomize", str(K8S / "overlays" / overlay)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def test_object_store_overlay_adds_credentials():
    docs = _kustomize("object-store")
    assert [d["kind"] for d in docs] == ["DaskJob"] * len(PIPELINES)
    for doc in docs:
        validate(doc)
        job = doc["spec"]["job"]["spec"]["containers"][0]
        worker = doc["spec"]["cluster"]["spec"]["worker"]["spec"]["containers"][0]
        for c in (job, worker):
            assert c["envFrom"] == [{"secretRef": {"name": "dmp-s3"}}]


def test_kustomize_overlay_renders_and_validates():
    docs = _kustomize("example")
    kinds = [d["kind"] for d in docs]
    assert kinds.count("DaskJob") == len(PIPELINES) and "DaskCluster" in kinds
    for doc in docs:
        validate(doc)
        assert doc["metadata"].get("namespace", "dmp") == "dmp"
        for c in containers(doc):
            assert c["image"] == "registry.example.com/ml/dmp:0.1.0"
        if doc["kind"] in ("DaskJob", "DaskCluster"):
            spec = doc["spec"]["cluster"]["spec"] if doc["kind"] == "DaskJob" else doc["spec"]
            assert spec["worker"]["replicas"] == 3
            assert spec["worker"]["spec"]["containers"][0]["resources"]["limits"]["memory"] \
                == "8Gi"


# ---------------------------------------------------------------------------------------
# dmp k8s render


@pytest.mark.parametrize("pipeline", PIPELINES, ids=lambda p: p.stem)
def test_render_every_pipeline_validates(pipeline):
    for kw in ({}, {"workers": 5, "image": "reg.example/dmp:dev", "memory": "12Gi",
                    "cpu": "2", "pvc": None, "storage_secret": "s3-creds",
                    "namespace": "ml"}):
        doc = render_job(pipeline, **kw)
        validate(doc)
        worker = doc["spec"]["cluster"]["spec"]["worker"]
        assert worker["replicas"] == kw.get("workers", 2)
        if kw:
            c = worker["spec"]["containers"][0]
            assert c["resources"]["limits"]["memory"] == "12Gi"
            assert c["envFrom"] == [{"secretRef": {"name": "s3-creds"}}]
            assert "volumes" not in worker["spec"] and doc["metadata"]["namespace"] == "ml"


def test_strict_check_rejects_unknown_keys():
    doc = render_job(PIPELINES[0])
    validate(doc)
    bad = copy.deepcopy(doc)
    bad["spec"]["cluster"]["spec"]["worker"]["replicaz"] = 2
    with pytest.raises(AssertionError, match="replicaz: not defined"):
        validate(bad)
    bad = copy.deepcopy(doc)
    bad["spec"]["job"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(AssertionError, match="imagePullPolicyy"):
        validate(bad)
    bad = copy.deepcopy(doc)
    bad["spec"]["cluster"]["spec"]["worker"]["replicas"] = "two"
    with pytest.raises(AssertionError, match="replicas"):
        validate(bad)
    with pytest.raises(AssertionError):
        validate({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                  "metadata": {"name": "x"}, "spec": {"accessModez": ["ReadWriteMany"]}})


@lru_cache(maxsize=None)
def _dask(*args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).parent / "dask"
    assert exe.exists(), f"the 'dask' entry point is not installed next to {sys.executable}"
    out = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out


def _dask_help(sub: str) -> str:
    return _dask(sub, "--help").stdout


def test_dask_commands_print_no_warning():
    # every `dask` command builds the whole command group first: a plugin's command that cannot
    # load (dask-kubernetes' without its CLI's dependencies) warned on each of them
    for args in (("--help",), ("scheduler", "--help"), ("worker", "--help")):
        err = _dask(*args).stderr
        assert "warn" not in err.lower() and "no module named" not in err.lower(), \
            f"dask {' '.join(args)}: {err}"


def _check_command(args, working_dir):
    args = [re.sub(r"\$\([A-Z_]+\)", "tcp://scheduler:8786", a) for a in args]
    prog, rest = args[0], args[1:]
    assert (Path(sys.executable).parent / prog).exists(), f"no entry point {prog!r}"
    if prog == "dmp":
        ns = build_parser().parse_args(rest)       # SystemExit on anything unknown
        if ns.command == "run":
            assert working_dir == "/opt/dmp"
            assert (REPO / ns.pipeline).exists(), f"{ns.pipeline} is not in the repository"
        return
    assert prog == "dask" and rest[0] in ("scheduler", "worker"), args
    help_text = _dask_help(rest[0])
    for opt in (a for a in rest[1:] if a.startswith("--")):
        assert re.search(rf"(^|\s){re.escape(opt)}[\s,=/]", help_text), \
            f"'dask {rest[0]}' has no option {opt}"
    if "--preload" in rest:
        module = rest[rest.index("--preload") + 1]
        assert importlib.util.find_spec(module) is not None, module


def test_container_commands_resolve_to_entry_points():
    docs = [d for _, d in manifest_docs()] + [render_job(p) for p in PIPELINES]
    seen = set()
    for doc in docs:
        for c in containers(doc):
            assert "command" not in c       # the image has no ENTRYPOINT: args are the command
            _check_command(c["args"], c.get("workingDir"))
            seen.add(tuple(c["args"][:2]))
    assert {("dask", "scheduler"), ("dask", "worker"), ("dmp", "run")} <= seen


def test_containerfile_matches_the_project():
    text = (REPO / "Containerfile").read_text()
    for src in re.findall(r"^COPY\s+(.+?)\s+\S+$", text, flags=re.M):
        for part in src.split():
            assert (REPO / part).exists(), f"Containerfile copies missing {part}"
    assert re.search(r"NUMBA_CACHE_DIR=\S+", text)
    assert "python -m dmp.kernels._warmup" in text
    assert importlib.util.find_spec("dmp.kernels._warmup") is not None
    preload = re.search(r"DASK_DISTRIBUTED__SCHEDULER__PRELOAD=(\S+)", text).group(1)
    assert importlib.util.find_spec(preload) is not None
    assert "ENTRYPOINT" not in re.sub(r"#.*", "", text)


def _anchors_and_aliases(text: str) -> list[str]:
    return [f"line {e.start_mark.line + 1}: {type(e).__name__} {e.anchor}"
            for e in yaml.parse(text)
            if isinstance(e, yaml.AliasEvent) or getattr(e, "anchor", None) is not None]


def test_manifests_are_plain_yaml(tmp_path):
    """Users read and edit the manifests: no ``&id001`` anchors or ``*id001`` aliases, and the
    text parses back to the very objects rendered (the probes share one dict in memory)."""
    docs = [render_job(p) for p in PIPELINES] + [render_cluster()]
    for doc in docs:
        text = to_yaml(doc)
        assert _anchors_and_aliases(text) == [], text
        assert yaml.safe_load(text) == doc
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["k8s", "render", str(REPO / "pipelines" / "lasso.yaml")]) == 0
    assert _anchors_and_aliases(buf.getvalue()) == []
    assert yaml.safe_load(buf.getvalue()) == render_job(REPO / "pipelines" / "lasso.yaml")
    for path in list(write_base(tmp_path)) + sorted(K8S.rglob("*.yaml")):
        assert _anchors_and_aliases(path.read_text()) == [], path


def test_cli_render_and_errors(tmp_path, capsys):
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["k8s", "render", str(REPO / "pipelines" / "lasso.yaml"), "--workers", "3",
                     "--image", "reg.example/dmp:7"]) == 0
    doc = yaml.safe_load(buf.getvalue())
    validate(doc)
    assert doc["spec"]["cluster"]["spec"]["worker"]["replicas"] == 3
    assert {c["image"] for c in containers(doc)} == {"reg.example/dmp:7"}
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["k8s", "cluster", "--workers", "4"]) == 0
    validate(yaml.safe_load(buf.getvalue()))
    # a pipeline the image does not hold, a bad quantity, a bad worker count
    outside = tmp_path / "mine.yaml"
    shutil.copy(REPO / "pipelines" / "lasso_small.yaml", outside)
    assert main(["k8s", "render", str(outside)]) == 2
    assert "the image holds the pipelines" in capsys.readouterr().err
    # any checkout's pipelines/ folder, wherever dmp itself is installed (a wheel has none)
    checkout = tmp_path / "checkout" / "pipelines"
    checkout.mkdir(parents=True)
    shutil.copy(REPO / "pipelines" / "lasso_small.yaml", checkout)
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["k8s", "render", str(checkout / "lasso_small.yaml")]) == 0
    job = yaml.safe_load(buf.getvalue())["spec"]["job"]["spec"]["containers"][0]
    assert "pipelines/lasso_small.yaml" in job["args"]
    assert main(["k8s", "render", str(PIPELINES[0]), "--memory", "lots"]) == 2
    assert "Kubernetes quantity" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:   # refused by the argument parser, at once
        main(["k8s", "render", str(PIPELINES[0]), "--workers", "0"])
    assert exc.value.code == 2 and "--workers: must be >= 1" in capsys.readouterr().err
    with pytest.raises(ValueError):
        render_cluster(workers=0)
