"""Kubernetes manifests for the Dask Kubernetes operator (``dmp k8s render``).

One container image (``Containerfile``) serves as scheduler, worker and job runner.  A
``DaskJob`` runs ``dmp run <pipeline> --scheduler $(DASK_SCHEDULER_ADDRESS) --resume`` in a job
pod against a cluster the operator creates for it and deletes afterwards:

* scheduler: ``dask scheduler --preload dmp.monitor.preload`` (the dmp dashboard page in the
  menu, the monitor that keeps partition-holding workers out of downscaling);
* workers: ``dask worker --name $(DASK_WORKER_NAME) --nthreads 1 --memory-limit auto`` (the pod's
  memory limit, read from its cgroup), pinned by name, so that a replacement pod takes over its
  predecessor's partitions;
* data, dataset cache and checkpoints under ``/data``: a ReadWriteMany PersistentVolumeClaim
  (default ``dmp-data``), or an object store when the pipeline's dataset is a URL
  (``--storage-env`` passes credentials from a Secret).
"""

from __future__ import annotations

from pathlib import Path

import yaml

API_VERSION = "kubernetes.dask.org/v1"
DATA_MOUNT = "/data"
WORKDIR = "/opt/dmp"
DEFAULT_IMAGE = "ghcr.io/dmp-project/dmp:0.1.0"
PIPELINES_DIR = Path(__file__).resolve().parent.parent / "pipelines"


def _quantity(text: str, what: str) -> str:
    import re

    text = str(text).strip()
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)?(m|[KMGTPE]i?|[kMGTPE])?", text):
        raise ValueError(f"{what} must be a Kubernetes quantity such as 4Gi or 500m, got {text!r}")
    return text


def _name(text: str) -> str:
    import re

    name = re.sub(r"[^a-z0-9-]+", "-", str(text).lower()).strip("-")[:50]
    if not name:
        raise ValueError(f"cannot make a Kubernetes name from {text!r}")
    return name


def _data_volume(pvc: str | None) -> tuple[list, list]:
    if not pvc:
        return [], []
    return ([{"name": "data", "persistentVolumeClaim": {"claimName": pvc}}],
            [{"name": "data", "mountPath": DATA_MOUNT}])


def _env(storage_secret: str | None) -> tuple[list, list]:
    env = [{"name": "DMP_CACHE_DIR", "value": f"{DATA_MOUNT}/cache"}]
    env_from = [{"secretRef": {"name": storage_secret}}] if storage_secret else []
    return env, env_from


def _container(name, image, args, *, cpu, memory, limit_memory, env, env_from, mounts,
               ports=(), probes=False):
    c = {"name": name, "image": image, "imagePullPolicy": "IfNotPresent",
         "args": [str(a) for a in args], "workingDir": WORKDIR,
         "resources": {"requests": {"cpu": cpu, "memory": memory},
                       "limits": {"memory": limit_memory}}}
    if env:
        c["env"] = env
    if env_from:
        c["envFrom"] = env_from
    if mounts:
        c["volumeMounts"] = mounts
    if ports:
        c["ports"] = [{"name": n, "containerPort": p, "protocol": "TCP"} for n, p in ports]
    if probes:
        probe = {"httpGet": {"port": "http-dashboard", "path": "/health"}}
        c["readinessProbe"] = {**probe, "initialDelaySeconds": 5, "periodSeconds": 10}
        c["livenessProbe"] = {**probe, "initialDelaySeconds": 15, "periodSeconds": 20}
    return c


def cluster_spec(*, name: str, workers: int, image: str, memory: str = "4Gi", cpu: str = "1",
                 pvc: str | None = "dmp-data", storage_secret: str | None = None) -> dict:
    """The ``spec`` of a DaskCluster (also the ``spec.cluster.spec`` of a DaskJob)."""
    if int(workers) < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    memory = _quantity(memory, "memory")
    cpu = _quantity(cpu, "cpu")
    volumes, mounts = _data_volume(pvc)
    env, env_from = _env(storage_secret)
    worker = _container(
        "worker", image,
        ["dask", "worker", "--name", "$(DASK_WORKER_NAME)", "--nthreads", "1",
         "--memory-limit", "auto", "--dashboard-address", ":8788"],
        cpu=cpu, memory=memory, limit_memory=memory, env=env, env_from=env_from,
        mounts=mounts, ports=[("http-dashboard", 8788)])
    scheduler = _container(
        "scheduler", image,
        ["dask", "scheduler", "--preload", "dmp.monitor.preload", "--port", "8786",
         "--dashboard-address", ":8787"],
        cpu="500m", memory="1Gi", limit_memory="2Gi", env=[], env_from=[], mounts=[],
        ports=[("tcp-comm", 8786), ("http-dashboard", 8787)], probes=True)
    worker_pod = {"containers": [worker]}
    if volumes:
        worker_pod["volumes"] = volumes
    return {
        "worker": {"replicas": int(workers), "spec": worker_pod},
        "scheduler": {
            "spec": {"containers": [scheduler]},
            "service": {
                "type": "ClusterIP",
                "selector": {"dask.org/cluster-name": name, "dask.org/component": "scheduler"},
                "ports": [
                    {"name": "tcp-comm", "protocol": "TCP", "port": 8786,
                     "targetPort": "tcp-comm"},
                    {"name": "http-dashboard", "protocol": "TCP", "port": 8787,
                     "targetPort": "http-dashboard"}]}},
    }


def render_job(pipeline, *, workers: int = 2, image: str = DEFAULT_IMAGE, memory: str = "4Gi",
               cpu: str = "1", pvc: str | None = "dmp-data", storage_secret: str | None = None,
               name: str | None = None, namespace: str | None = None) -> dict:
    """A DaskJob that runs ``dmp run <pipeline>`` on an operator-made cluster.

    Parameters
    ----------
    pipeline : str or path
        Pipeline YAML inside the repository (it is in the image under ``/opt/dmp``).
    workers : int
        Worker pods (one partition-holding ``dask worker`` each).
    memory, cpu : str
        Per-worker request; memory is also the pod's limit, which ``--memory-limit auto`` makes
        the Dask worker's memory limit.
    pvc : str or None
        ReadWriteMany claim mounted at ``/data`` (dataset cache, checkpoints, outputs) in the
        job and worker pods; None for object-store-only pipelines.
    storage_secret : str, optional
        Secret whose keys become environment variables of job and workers (e.g.
        ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL``).
    """
    from .pipeline import load_pipeline

    spec = load_pipeline(str(pipeline))   # validates the pipeline (and that it exists)
    path = Path(pipeline).resolve()
    # the image copies a checkout's pipelines/ folder; the package's own location says nothing
    # about it once dmp is installed from a wheel
    if path.parent.name != "pipelines":
        raise ValueError(f"{pipeline}: the image holds the pipelines of the checkout it was built "
                         f"from, in {WORKDIR}/pipelines; put the file in that checkout's "
                         f"pipelines/ folder (and rebuild the image) to run it on Kubernetes")
    rel = f"pipelines/{path.name}"
    job_name = _name(name or f"dmp-{spec['name']}")
    volumes, mounts = _data_volume(pvc)
    env, env_from = _env(storage_secret)
    out_dir = f"{DATA_MOUNT}/runs/{_name(spec['name'])}" if pvc else f"runs/{_name(spec['name'])}"
    job = _container(
        "job", image,
        ["dmp", "run", rel, "--scheduler", "$(DASK_SCHEDULER_ADDRESS)", "--resume",
         "--no-progress", "--output", out_dir],
        cpu="500m", memory="2Gi", limit_memory="4Gi", env=env, env_from=env_from,
        mounts=mounts)
    job_pod = {"restartPolicy": "OnFailure", "containers": [job]}
    if volumes:
        job_pod["volumes"] = volumes
    metadata = {"name": job_name, "labels": {"app.kubernetes.io/name": "dmp",
                                              "app.kubernetes.io/component": "job",
                                              "dmp/pipeline": _name(spec["name"])}}
    if namespace:
        metadata["namespace"] = namespace
    return {
        "apiVersion": API_VERSION, "kind": "DaskJob", "metadata": metadata,
        "spec": {"job": {"spec": job_pod},
                 "cluster": {"spec": cluster_spec(name=job_name, workers=workers, image=image,
                                                  memory=memory, cpu=cpu, pvc=pvc,
                                                  storage_secret=storage_secret)}},
    }


def render_cluster(*, name: str = "dmp", workers: int = 2, image: str = DEFAULT_IMAGE,
                   memory: str = "4Gi", cpu: str = "1", pvc: str | None = "dmp-data") -> dict:
    """A long-lived DaskCluster for interactive use (``Client("tcp://dmp-scheduler:8786")``)."""
    name = _name(name)
    return {"apiVersion": API_VERSION, "kind": "DaskCluster",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "dmp"}},
            "spec": cluster_spec(name=name, workers=workers, image=image, memory=memory,
                                 cpu=cpu, pvc=pvc)}


class _PlainDumper(yaml.SafeDumper):
    """Writes an object used twice (the scheduler's two probes share one dict) in full both
    times: users read and edit these manifests, and ``&id001`` / ``*id001`` only confuse."""

    def ignore_aliases(self, data):
        return True


def to_yaml(docs) -> str:
    """One or more manifests as plain YAML documents (no anchors or aliases)."""
    if isinstance(docs, dict):
        docs = [docs]
    return yaml.dump_all(docs, Dumper=_PlainDumper, sort_keys=False, default_flow_style=False,
                         width=100)


def autoscaler(*, cluster: str = "dmp", minimum: int = 2, maximum: int = 8) -> dict:
    """A DaskAutoscaler for the interactive cluster.

    Keep ``minimum`` at least the number of workers a fit uses: the scheduler's dmp monitor
    already keeps workers that hold partitions out of every graceful downscaling
    (`DMPMonitor.valid_workers_downscaling`), and the minimum keeps the operator from asking.
    """
    if not 1 <= int(minimum) <= int(maximum):
        raise ValueError(f"need 1 <= minimum <= maximum, got {minimum}, {maximum}")
    return {"apiVersion": API_VERSION, "kind": "DaskAutoscaler",
            "metadata": {"name": _name(cluster), "labels": {"app.kubernetes.io/name": "dmp"}},
            "spec": {"cluster": _name(cluster), "minimum": int(minimum),
                     "maximum": int(maximum)}}


def data_claim(name: str = "dmp-data", size: str = "50Gi") -> dict:
    """The ReadWriteMany claim shared by job and worker pods (dataset cache, checkpoints,
    outputs)."""
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "dmp"}},
            "spec": {"accessModes": ["ReadWriteMany"],
                     "resources": {"requests": {"storage": _quantity(size, "size")}}}}


def write_base(directory) -> list[Path]:
    """(Re)write the committed manifests of ``k8s/base`` and ``k8s/jobs`` (``python -m
    dmp.k8s k8s``); a test checks that the committed files equal this output."""
    root = Path(directory)
    written = []
    base = {"data-pvc.yaml": data_claim(), "daskcluster.yaml": render_cluster(),
            "autoscaler.yaml": autoscaler()}
    jobs = {f"{p.stem}.yaml": render_job(p) for p in sorted(PIPELINES_DIR.glob("*.yaml"))}
    for sub, docs in (("base", base), ("jobs", jobs)):
        (root / sub).mkdir(parents=True, exist_ok=True)
        for fname, doc in docs.items():
            path = root / sub / fname
            path.write_text("# generated by `python -m dmp.k8s k8s`; edit dmp/k8s.py instead\n"
                            + to_yaml(doc))
            written.append(path)
        kust = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                "resources": sorted(docs)}
        (root / sub / "kustomization.yaml").write_text(to_yaml(kust))
        written.append(root / sub / "kustomization.yaml")
    return written


if __name__ == "__main__":  # pragma: no cover
    import sys

    for p in write_base(sys.argv[1] if len(sys.argv) > 1 else "k8s"):
        print(p)
