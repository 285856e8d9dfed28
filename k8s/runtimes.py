"""ClusterTrainingRuntimes, built from typed settings (no hand-written YAML).

Every runtime shares the same policies:

* JobSet ``failurePolicy``: ``maxRestarts`` from ``trainer.maxRestarts``, ``BlockingRecreate``
  (all old pods are gone before the group restarts, so rendezvous never sees stale peers), and
  rules that fail at once on exit codes that mean "this can never succeed" (2: bad arguments,
  3: bad config or data) and restart without burning a retry when a node was taken away;
* the Job fails on its first pod failure (``backoffLimit: 0``): a distributed step needs every
  rank, so recovery is always a whole-group restart from the last checkpoint;
* a memory-backed ``/dev/shm`` sized by ``trainer.shmSize`` (the pod default is 64 MB);
* ``karpenter.sh/do-not-disrupt`` on pods, the GPU taint tolerated, GPU-pool nodes required;
* NCCL/EFA environment when EFA is on;
* no ``ttlSecondsAfterFinished`` (it makes TrainJobs recreate their JobSet).
"""

from __future__ import annotations

import pathlib
from typing import Any

import versions
from infra.settings import TrainerSettings
from k8s import trainer_api
from k8s.gpu_objects import GPU_TOLERATION, POOL_LABEL

NON_RETRYABLE_EXIT_CODES = [2, 3]
SHM_VOLUME = "dshm"
DO_NOT_DISRUPT = {"karpenter.sh/do-not-disrupt": "true"}
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
FRAMEWORK_LABEL = "trainer.kubeflow.org/framework"

EFA_ENV = [
    {"name": "FI_PROVIDER", "value": "efa"},
    {"name": "FI_EFA_USE_DEVICE_RDMA", "value": "1"},
    {"name": "FI_EFA_FORK_SAFE", "value": "1"},
    {"name": "NCCL_NET_GDR_LEVEL", "value": "SYS"},
]
BASE_ENV = [{"name": "PYTHONUNBUFFERED", "value": "1"}, {"name": "NCCL_DEBUG", "value": "WARN"}]


def failure_policy(max_restarts: int) -> dict:
    return {
        "maxRestarts": max_restarts,
        "restartStrategy": "BlockingRecreate",
        "rules": [
            {
                "name": "NonRetryableExit",
                "action": "FailJobSet",
                "onJobFailureReasons": ["PodFailurePolicy"],
                "onJobFailureMessagePatterns": [f"exit code ({'|'.join(map(str, NON_RETRYABLE_EXIT_CODES))}) matching FailJob rule"],
            },
            {
                "name": "NodeDisruption",
                "action": "RestartJobSetAndIgnoreMaxRestarts",
                "onJobFailureReasons": ["PodFailurePolicy"],
                "onJobFailureMessagePatterns": ["condition DisruptionTarget matching FailJob rule"],
            },
        ],
    }


def pod_failure_policy() -> dict:
    return {
        "rules": [
            {"action": "FailJob", "onExitCodes": {"containerName": trainer_api.TRAINER_JOB, "operator": "In", "values": list(NON_RETRYABLE_EXIT_CODES)}},
            {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        ]
    }


def _node_container(image: str, env: list[dict], command: list[str] | None) -> dict:
    container: dict[str, Any] = {
        "name": trainer_api.TRAINER_JOB,
        "image": image,
        "env": env,
        "volumeMounts": [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}],
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }
    if command:
        container["command"] = command
    return container


def runtime(*, name: str, framework: str, trainer: TrainerSettings, efa_enabled: bool, image: str, ml_policy: dict, command: list[str] | None = None, extra_env: list[dict] | None = None) -> dict:
    env = BASE_ENV + (EFA_ENV if efa_enabled else []) + (extra_env or [])
    pod_spec = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,  # training code never calls the Kubernetes API
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "tolerations": [dict(GPU_TOLERATION)],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": POOL_LABEL, "operator": "Exists"}]}]}}},
        "containers": [_node_container(image, env, command)],
        "volumes": [{"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": trainer.shm_size}}],
    }
    job = {
        "name": trainer_api.TRAINER_JOB,
        "replicas": 1,
        "template": {
            "metadata": {"labels": {ANCESTOR_LABEL: "trainer"}},
            "spec": {
                "backoffLimit": 0,
                "podFailurePolicy": pod_failure_policy(),
                "template": {"metadata": {"annotations": dict(DO_NOT_DISRUPT)}, "spec": pod_spec},
            },
        },
    }
    return {
        "apiVersion": trainer_api.API_VERSION,
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": name, "labels": {FRAMEWORK_LABEL: framework}},
        "spec": {
            "mlPolicy": {"numNodes": 1, **ml_policy},
            "template": {"spec": {"failurePolicy": failure_policy(trainer.max_restarts), "replicatedJobs": [job]}},
        },
    }


def torch_runtime(trainer: TrainerSettings, efa_enabled: bool) -> dict:
    return runtime(
        name="torch-distributed-gpu", framework="torch", trainer=trainer, efa_enabled=efa_enabled, image=versions.TORCH_RUNTIME_IMAGE,
        ml_policy={"torch": trainer_api.torch_ml_policy(trainer.version)},
    )


def deepspeed_runtime(trainer: TrainerSettings, efa_enabled: bool) -> dict:
    """DeepSpeed launched by torchrun (one launcher per node, the Trainer's PET_* rendezvous),
    so it shares the torch runtime's restart semantics instead of an MPI launcher."""
    return runtime(
        name="deepspeed-distributed-gpu", framework="deepspeed", trainer=trainer, efa_enabled=efa_enabled, image=versions.DEEPSPEED_RUNTIME_IMAGE,
        ml_policy={"torch": trainer_api.torch_ml_policy(trainer.version)},
    )


def tf_config_wrapper() -> list[str]:
    """Container command that sets TF_CONFIG from the injected PET_* env and execs the args."""
    source = (pathlib.Path(__file__).with_name("tf_config.py")).read_text()
    return ["python3", "-c", source, "--"]


def tensorflow_runtime(trainer: TrainerSettings, efa_enabled: bool) -> dict:
    """The torch policy is used only for what it injects (node count, rank, node 0's address);
    the TrainJob passes its program as ``trainer.args`` and keeps the wrapper command."""
    return runtime(
        name="tensorflow-distributed", framework="tensorflow", trainer=trainer, efa_enabled=efa_enabled, image=versions.TENSORFLOW_RUNTIME_IMAGE,
        ml_policy={"torch": trainer_api.torch_ml_policy(trainer.version)}, command=tf_config_wrapper(),
    )


BUILDERS = {"torch-distributed-gpu": torch_runtime, "deepspeed-distributed-gpu": deepspeed_runtime, "tensorflow-distributed": tensorflow_runtime}


def runtimes(trainer: TrainerSettings, efa_enabled: bool) -> list[dict]:
    return [BUILDERS[name](trainer, efa_enabled) for name in trainer.runtimes]


def trainer_chart_values(version: str) -> dict:
    """The chart's own runtimes stay off (ours are declared); v2.1.0's JobSet image is pinned to
    its release registry because the staging image it shipped with no longer resolves."""
    values: dict[str, Any] = {"runtimes": {"defaultEnabled": False}}
    if version == "v2.1.0":
        values["jobset"] = {"image": {"repository": versions.JOBSET_IMAGE_REPOSITORY, "tag": versions.TRAINER_VERSIONS[version]["jobset"]}}
    return values
