"""Pure builders for the training workloads: namespace, code ConfigMap, checkpoint volume and
TrainJobs. Plain dicts from typed settings; the Trainer version decides the TrainJob's shape
(through ``k8s.trainer_api``), the GPU catalog decides GPUs, EFA devices, CPU and memory."""

from __future__ import annotations

import hashlib
import pathlib
from dataclasses import dataclass
from typing import Any

from infra import catalog
from infra.settings import DdpJobSettings, FsdpJobSettings, Settings, job_gpus_per_node
from k8s import trainer_api
from k8s.gpu_objects import EFA_LABEL, efa_devices_per_node
from k8s.runtimes import EFA_ENV, runtime_names

PROGRAMS_DIR = pathlib.Path(__file__).with_name("programs")
CODE_MOUNT = "/opt/training/code"
CHECKPOINT_MOUNT = "/mnt/checkpoints"
CODE_VOLUME = "training-code"
CHECKPOINT_VOLUME = "checkpoints"
CHECKPOINT_CLAIM = "checkpoints"
TORCH_RUNTIME = "torch-distributed-gpu"
JOB_LABEL = "training-platform/job"
CODE_HASH_ANNOTATION = "training-platform/code-sha256"


@dataclass(frozen=True)
class Workload:
    kind: str  # config key: ddp | fsdp
    name: str  # TrainJob name
    program: str


WORKLOADS = {"ddp": Workload("ddp", "ddp-mnist", "ddp_mnist.py"), "fsdp": Workload("fsdp", "fsdp-t5", "fsdp_t5.py")}

# The local emulator appends these to the rendered arguments (the last value of an option wins):
# tiny synthetic data, a tiny model, and a checkpoint every 2 steps.
TINY_PROFILE = {
    "ddp": ["--synthetic", "--synthetic-samples", "512", "--batch-size", "16", "--epochs", "1", "--max-steps", "12", "--checkpoint-every", "2", "--log-every", "1"],
    "fsdp": [
        "--synthetic", "--init", "random", "--model-config", "tiny", "--synthetic-samples", "128", "--source-len", "32", "--target-len", "16",
        "--batch-size", "4", "--epochs", "1", "--max-steps", "12", "--checkpoint-every", "2", "--log-every", "1",
    ],
}


def code_files() -> dict[str, str]:
    """The training code shipped in the ConfigMap: every program and its shared library."""
    return {p.name: p.read_text() for p in sorted(PROGRAMS_DIR.glob("*.py"))}


def code_hash(files: dict[str, str]) -> str:
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + files[name].encode() + b"\0")
    return h.hexdigest()


def code_configmap_name(files: dict[str, str]) -> str:
    """Content-addressed: a code change makes a new ConfigMap, so the TrainJob referencing it
    changes and is replaced (the job rolls)."""
    return f"training-code-{code_hash(files)[:10]}"


def namespace(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {"pod-security.kubernetes.io/enforce": "baseline", "pod-security.kubernetes.io/warn": "restricted"}}}


def code_configmap(ns: str, files: dict[str, str]) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": code_configmap_name(files), "namespace": ns, "annotations": {CODE_HASH_ANNOTATION: code_hash(files)}},
        "immutable": True,
        "data": dict(files),
    }


def checkpoint_volume(*, ns: str, storage_type: str, volume_handle: Any, capacity_gib: int, attributes: dict | None = None) -> tuple[dict, dict]:
    """A static PersistentVolume on the program-created file system, and the RWX claim bound to it."""
    pv_name = f"{ns}-checkpoints"
    csi: dict[str, Any] = {"driver": "fsx.csi.aws.com" if storage_type == "fsx" else "efs.csi.aws.com", "volumeHandle": volume_handle}
    if attributes:
        csi["volumeAttributes"] = attributes
    pv_spec: dict[str, Any] = {
        "capacity": {"storage": f"{capacity_gib}Gi"},
        "accessModes": ["ReadWriteMany"],
        "persistentVolumeReclaimPolicy": "Retain",
        "storageClassName": "",
        "csi": csi,
    }
    if storage_type == "fsx":
        pv_spec["mountOptions"] = ["flock"]
    pv = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv_name}, "spec": pv_spec}
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": CHECKPOINT_CLAIM, "namespace": ns},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": pv_name, "resources": {"requests": {"storage": f"{capacity_gib}Gi"}}},
    }
    return pv, pvc


def program_args(workload: Workload, job: DdpJobSettings | FsdpJobSettings) -> list[str]:
    args = ["--epochs", str(job.epochs), "--checkpoint-dir", f"{CHECKPOINT_MOUNT}/{workload.name}"]
    if workload.kind == "ddp":
        args += ["--data-dir", f"{CHECKPOINT_MOUNT}/data/mnist"]
    else:
        assert isinstance(job, FsdpJobSettings), f"workload {workload.kind} needs FSDP job settings"
        args += ["--model", job.model, "--data-file", f"{CHECKPOINT_MOUNT}/data/t5/train.jsonl"]
    return args + list(job.extra_args)


def efa_devices(job: DdpJobSettings | FsdpJobSettings, settings: Settings) -> int:
    """EFA devices for one node of the job: what the EFA pool's nodes of this type expose
    (``efa_devices_per_node``, the same function the node class is built from), in proportion
    to the GPUs used. 0 when the type does not land in the EFA pool: then it gets no EFA devices
    and no EFA environment either."""
    if not (settings.efa.enabled and job.instance_type in settings.efa.instance_types):
        return 0
    per_node = efa_devices_per_node(job.instance_type)
    if not per_node:
        return 0
    info = catalog.lookup(job.instance_type)
    return max(1, per_node * job_gpus_per_node(job) // info.gpus)


def job_env(job: DdpJobSettings | FsdpJobSettings, settings: Settings) -> list[dict]:
    """The trainer container's env: libfabric/NCCL EFA settings only for jobs that get EFA
    devices (a job told ``FI_PROVIDER=efa`` on a node without EFA fails to initialise NCCL's
    network plugin instead of falling back to sockets)."""
    env = [{"name": "HF_HOME", "value": f"{CHECKPOINT_MOUNT}/hf-cache"}]
    if efa_devices(job, settings):
        env += [dict(e) for e in EFA_ENV]
    return env


def resources_per_node(job: DdpJobSettings | FsdpJobSettings, settings: Settings) -> dict:
    info = catalog.lookup(job.instance_type)
    gpus = job_gpus_per_node(job)
    share = gpus / info.gpus
    # leave room for the kubelet, system reserve and daemonsets (device plugins, CNI)
    cpu = max(1, int((info.vcpu - 2) * share * 0.9))
    memory = max(2, int((info.memory_gib - 4) * share * 0.85))
    limits: dict[str, Any] = {"nvidia.com/gpu": gpus}
    efa = efa_devices(job, settings)
    if efa:
        limits["vpc.amazonaws.com/efa"] = efa
    return {"requests": {"cpu": str(cpu), "memory": f"{memory}Gi"}, "limits": {**limits, "memory": f"{memory}Gi"}}


def trainjob(workload: Workload, job: DdpJobSettings | FsdpJobSettings, settings: Settings, *, code_configmap: str, image: Any = None, runtime_name: str | None = None) -> dict:
    """The TrainJob of a workload on the torch runtime (``runtime_name``: its current content-hashed
    name; computed from the settings when not given). ``image``: the trainer image (a string or
    an Output, e.g. the stack's built image by digest); when not given, the job's own
    ``image`` setting, which must then be set."""
    image = image if image is not None else job.image
    if image is None:
        raise ValueError(f"TrainJob {workload.name}: no image (trainjobs.{workload.kind}.image is unset and no built image was passed)")
    ns = settings.trainjobs.namespace
    node_selector = {"node.kubernetes.io/instance-type": job.instance_type}
    zone = job.availability_zone
    if efa_devices(job, settings):
        node_selector[EFA_LABEL] = "true"
        zone = zone or settings.efa.availability_zone  # EFA nodes live in that one AZ (config refuses another)
    if zone:
        node_selector["topology.kubernetes.io/zone"] = zone
    pod_spec = {
        "nodeSelector": node_selector,
        "volumes": [
            {"name": CODE_VOLUME, "configMap": {"name": code_configmap}},
            {"name": CHECKPOINT_VOLUME, "persistentVolumeClaim": {"claimName": CHECKPOINT_CLAIM}},
        ],
        "containers": [
            {
                "name": trainer_api.TRAINER_JOB,
                "volumeMounts": [
                    {"name": CODE_VOLUME, "mountPath": CODE_MOUNT, "readOnly": True},
                    {"name": CHECKPOINT_VOLUME, "mountPath": CHECKPOINT_MOUNT},
                ],
            }
        ],
    }
    field, value = trainer_api.pod_customization(settings.trainer.version, metadata=None, pod_spec=pod_spec)
    gpus = job_gpus_per_node(job)
    return {
        "apiVersion": trainer_api.API_VERSION,
        "kind": "TrainJob",
        "metadata": {"name": workload.name, "namespace": ns, "labels": {JOB_LABEL: workload.kind}},
        "spec": {
            "runtimeRef": {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime", "name": runtime_name or runtime_names(settings.trainer)[TORCH_RUNTIME]},
            "trainer": {
                "image": image,
                # launch.py keeps the workers' non-retryable exit codes visible to the failure policy
                "command": ["python3", f"{CODE_MOUNT}/launch.py", "torchrun", f"{CODE_MOUNT}/{workload.program}"],
                "args": program_args(workload, job),
                "numNodes": job.num_nodes,
                "numProcPerNode": gpus,
                "resourcesPerNode": resources_per_node(job, settings),
                "env": job_env(job, settings),
            },
            field: value,
        },
    }
