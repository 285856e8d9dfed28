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
* no EFA environment: a TrainJob adds it only when it really gets EFA devices;
* no ``ttlSecondsAfterFinished`` (it makes TrainJobs recreate their JobSet).

``torch-distributed-gpu-hf`` is the torch runtime plus the Trainer's dataset and model
initializers (:func:`initializer_job`): the node job ``dependsOn`` both (``status: Complete``), so
they download before any GPU pod starts. It is a runtime of its own because the Trainer never
drops a runtime's initializer jobs: on a TrainJob without ``spec.initializer`` they run anyway and
fail on the missing STORAGE_URI (see ``manifests.trainer_api``), so jobs that need no download (the DDP
job, teams' own jobs) stay on ``torch-distributed-gpu``.

Names. Parts of a ClusterTrainingRuntime are immutable (the CRD's CEL rules ``self == oldSelf``
on ``spec.template.spec`` ``failurePolicy``, ``network``, ``startupPolicy``, ``successPolicy``,
``volumeClaimPolicies`` and each replicated job's ``dependsOn``, Trainer v2.1.0 and v2.3.0): an
in-place change is refused with 422. So a runtime is named ``<base>-<hash>``, the hash taken over
exactly those parts; a change to them makes a new runtime, and the TrainJobs that reference it
(``runtimeRef`` is immutable too) are replaced and resume from their checkpoints. Changes to the
mutable rest (image, env, ``/dev/shm`` size, scheduling) update the runtime in place and apply
to JobSets created afterwards; running JobSets keep the pods they were created with. The label
``training-platform/runtime: <base>`` finds the current runtime of a kind. The old runtime is
deleted without waiting (``pulumi.com/skipAwait``): the Trainer keeps it, through its finalizer,
until the last TrainJob that references it is gone, and ``pulumi up`` does not block on that.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
from typing import Any

import versions
from config.labels import NODE_ROLE_LABEL
from config.settings import TrainerSettings
from manifests import trainer_api
from manifests.gpu_objects import GPU_TOLERATION, POOL_LABEL
from manifests.tenants import CHECKPOINT_CLAIM  # the RWX claim every jobs' namespace has

NON_RETRYABLE_EXIT_CODES = [2, 3]
SHM_VOLUME = "dshm"
DO_NOT_DISRUPT = {"karpenter.sh/do-not-disrupt": "true"}
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
FRAMEWORK_LABEL = "trainer.kubeflow.org/framework"

RUNTIME_LABEL = "training-platform/runtime"
# pulumi-kubernetes skips its await logic for an object with this annotation, on delete too (the
# unified delete await of pulumi-kubernetes #3133; #3154 discusses narrowing it to readiness in v5,
# which would need revisiting this). A CustomResource has no readiness await to lose.
SKIP_AWAIT = {"pulumi.com/skipAwait": "true"}
# spec.template.spec fields the CRDs mark immutable (CEL ``self == oldSelf``), both Trainer versions.
IMMUTABLE_TEMPLATE_FIELDS = ("failurePolicy", "network", "startupPolicy", "successPolicy", "volumeClaimPolicies")
IMMUTABLE_REPLICATED_JOB_FIELDS = ("dependsOn",)

# libfabric/NCCL settings for EFA; TrainJobs that get EFA devices add them (manifests/trainjobs.py).
EFA_ENV = [
    {"name": "FI_PROVIDER", "value": "efa"},
    {"name": "FI_EFA_USE_DEVICE_RDMA", "value": "1"},
    {"name": "FI_EFA_FORK_SAFE", "value": "1"},
    {"name": "NCCL_NET_GDR_LEVEL", "value": "SYS"},
]
GRACE_ENV = "TRAINING_TERMINATION_GRACE_S"  # the pod's terminationGracePeriodSeconds, for the programs
BASE_ENV = [
    {"name": "PYTHONUNBUFFERED", "value": "1"},
    {"name": "NCCL_DEBUG", "value": "WARN"},
    # the launcher's preflight (workloads/programs/launch.py): the node's GPUs and EFA devices
    # against what the job requested, and a short GPU check, before training starts
    {"name": "TRAINING_PREFLIGHT", "value": "1"},
    {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
]

# Initializers write under /workspace (manifests.trainer_api.INITIALIZER_WORKSPACE). Their volume is the
# namespace's RWX checkpoint claim, not a per-job scratch claim: it outlives the JobSet, so a
# whole-job restart (which re-creates every replicated job, initializers included) finds the files
# there and the hub client skips what it already has (a ``local_dir`` download keeps per-file
# metadata under ``<local_dir>/.cache/huggingface`` and skips a file whose etag is unchanged:
# huggingface_hub PR #2223, v0.23+; the initializer images pin 0.27 (v2.1.0
# cmd/initializers/*/requirements.txt) and 1.24 (v2.3.0 uv.lock)), and the data sits next to the checkpoints
# it produced. Each TrainJob gets its own directory ``initialized/<TrainJob name>``, through
# ``subPathExpr`` on the pod's JobSet name: the Trainer names the JobSet after the TrainJob
# (kubeflow/trainer pkg/runtime/framework/plugins/jobset/jobset.go ``Build``, v2.1.0 and v2.3.0) and
# JobSet labels every pod with it (kubernetes-sigs/jobset api/jobset/v1alpha2 ``JobSetNameKey``,
# docs/concepts). The trainer pods read the same directory through the TrainJob's mount of the
# claim (manifests/trainjobs.py ``initialized_dir``). Under it, a directory per content: the
# TrainJob passes ``INITIALIZED_KEY`` (a hash of its dataset and model URIs) in
# ``spec.initializer.<kind>.env``, which the Trainer copies into the initializer container
# (builder.go ``Initializer``), so a job re-created under the same name with another dataset or
# model downloads into a fresh directory instead of mixing files with the old one (the hub client
# adds files to a local directory, it never removes any).
INITIALIZED_ROOT = "initialized"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
TRAINJOB_NAME_ENV = "TRAINJOB_NAME"
INITIALIZED_KEY_ENV = "INITIALIZED_KEY"
# small, CPU-only pods on the system node groups (the images are multi-arch): no GPU node is
# started or held for a download
INITIALIZER_RESOURCES = {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "4Gi"}}


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


def trainer_pod_security() -> dict:
    """The trainer pods run as the image's non-root user (``versions.WORKLOAD_UID``; workloads/Dockerfile
    switches to it). Their checkpoint directories are handed to that user before any job starts
    (manifests/volume_setup.py), since the CSI drivers apply no fsGroup to the RWX checkpoint volumes.
    An image without that user still runs (the uid needs no passwd entry; HOME is then /)."""
    uid = int(versions.WORKLOAD_UID)
    return {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": uid, "seccompProfile": {"type": "RuntimeDefault"}}


def immutable_parts(manifest: dict) -> dict:
    """The parts of a runtime the API server refuses to change in place."""
    spec = manifest["spec"]["template"]["spec"]
    return {
        "template": {k: spec[k] for k in IMMUTABLE_TEMPLATE_FIELDS if k in spec},
        "replicatedJobs": {rj["name"]: {k: rj[k] for k in IMMUTABLE_REPLICATED_JOB_FIELDS if k in rj} for rj in spec.get("replicatedJobs", [])},
    }


def content_name(base: str, manifest: dict) -> str:
    digest = hashlib.sha256(json.dumps(immutable_parts(manifest), sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return f"{base}-{digest[:8]}"


def initialized_subpath(trainjob_name: str, key: str) -> str:
    """The claim sub-directory the initializers of a TrainJob write to (``key``: its ``INITIALIZED_KEY``)."""
    return f"{INITIALIZED_ROOT}/{trainjob_name}/{key}"


def initializer_job(*, kind: str, image: str) -> dict:
    """Replicated job ``dataset-initializer`` or ``model-initializer``: the upstream image with its
    own entrypoint, the ancestor label and container name the Trainer looks for, the volume named
    ``initializer`` mounted at /workspace. One pod, no in-place retries: a failed download fails
    the Job and the JobSet failure policy restarts the group (a restart of nothing but downloads)."""
    name = {"dataset": trainer_api.DATASET_INITIALIZER, "model": trainer_api.MODEL_INITIALIZER}[kind]
    container = {
        "name": name,
        "image": image,
        "env": [{"name": TRAINJOB_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{JOBSET_NAME_LABEL}']"}}}],
        "resources": INITIALIZER_RESOURCES,
        "volumeMounts": [{"name": trainer_api.INITIALIZER_VOLUME, "mountPath": trainer_api.INITIALIZER_WORKSPACE, "subPathExpr": initialized_subpath(f"$({TRAINJOB_NAME_ENV})", f"$({INITIALIZED_KEY_ENV})")}],
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }
    pod_spec = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "nodeSelector": {NODE_ROLE_LABEL: "system"},
        "containers": [container],
        "volumes": [{"name": trainer_api.INITIALIZER_VOLUME, "persistentVolumeClaim": {"claimName": CHECKPOINT_CLAIM}}],
    }
    return {
        "name": name,
        "replicas": 1,
        # do-not-disrupt as on every pod of a runtime: an evicted download fails the Job and costs a restart
        "template": {"metadata": {"labels": {ANCESTOR_LABEL: name}}, "spec": {"backoffLimit": 0, "template": {"metadata": {"annotations": dict(DO_NOT_DISRUPT)}, "spec": pod_spec}}},
    }


def runtime(
    *, name: str, framework: str, trainer: TrainerSettings, image: str, ml_policy: dict, command: list[str] | None = None, extra_env: list[dict] | None = None,
    initializers: dict[str, str] | None = None,
) -> dict:
    """A ClusterTrainingRuntime named ``<name>-<hash of its immutable parts>``. ``initializers``:
    kind (``dataset``, ``model``) -> image; the node job then ``dependsOn`` their completion
    (JobSet ``dependsOn`` names earlier replicated jobs: they come first)."""
    # SIGTERM to SIGKILL: the programs save their step in it (workloads/programs/trainlib.py preemption)
    # and warn when their checkpoint does not fit (TRAINING_TERMINATION_GRACE_S)
    env = [*BASE_ENV, {"name": GRACE_ENV, "value": str(trainer.termination_grace_seconds)}, *(extra_env or [])]
    pod_spec = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": trainer.termination_grace_seconds,
        "automountServiceAccountToken": False,  # training code never calls the Kubernetes API
        "securityContext": trainer_pod_security(),
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
    pre_jobs = [initializer_job(kind=kind, image=img) for kind, img in (initializers or {}).items()]
    if pre_jobs:
        job = {"name": job["name"], "dependsOn": [{"name": j["name"], "status": "Complete"} for j in pre_jobs], **{k: v for k, v in job.items() if k != "name"}}
    manifest = {
        "apiVersion": trainer_api.API_VERSION,
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": name, "labels": {FRAMEWORK_LABEL: framework, RUNTIME_LABEL: name}, "annotations": dict(SKIP_AWAIT)},
        "spec": {
            "mlPolicy": {"numNodes": 1, **ml_policy},
            "template": {"spec": {"failurePolicy": failure_policy(trainer.max_restarts), "replicatedJobs": [*pre_jobs, job]}},
        },
    }
    manifest["metadata"]["name"] = content_name(name, manifest)
    return manifest


def torch_runtime(trainer: TrainerSettings) -> dict:
    return runtime(
        name="torch-distributed-gpu", framework="torch", trainer=trainer, image=versions.TORCH_RUNTIME_IMAGE,
        ml_policy={"torch": trainer_api.torch_ml_policy(trainer.version)},
    )


def torch_hf_runtime(trainer: TrainerSettings) -> dict:
    """The torch runtime with the Trainer's Hugging Face dataset and model initializers (images
    of the installed Trainer release); TrainJobs on it set ``spec.initializer`` with both."""
    return runtime(
        name="torch-distributed-gpu-hf", framework="torch", trainer=trainer, image=versions.TORCH_RUNTIME_IMAGE,
        ml_policy={"torch": trainer_api.torch_ml_policy(trainer.version)}, initializers=dict(versions.INITIALIZER_IMAGES[trainer.version]),
    )


def deepspeed_runtime(trainer: TrainerSettings) -> dict:
    """DeepSpeed launched by torchrun (one launcher per node, the Trainer's PET_* rendezvous),
    so it shares the torch runtime's restart semantics instead of an MPI launcher."""
    return runtime(
        name="deepspeed-distributed-gpu", framework="deepspeed", trainer=trainer, image=versions.DEEPSPEED_RUNTIME_IMAGE,
        ml_policy={"torch": trainer_api.torch_ml_policy(trainer.version)},
    )


def tf_config_wrapper() -> list[str]:
    """Container command that sets TF_CONFIG from the injected PET_* env and execs the args."""
    source = (pathlib.Path(__file__).resolve().parent.parent / "incluster" / "tf_config.py").read_text()
    return ["python3", "-c", source, "--"]


def tensorflow_runtime(trainer: TrainerSettings) -> dict:
    """The torch policy is used only for what it injects (node count, rank, node 0's address);
    the TrainJob passes its program as ``trainer.args`` and keeps the wrapper command."""
    return runtime(
        name="tensorflow-distributed", framework="tensorflow", trainer=trainer, image=versions.TENSORFLOW_RUNTIME_IMAGE,
        ml_policy={"torch": trainer_api.torch_ml_policy(trainer.version)}, command=tf_config_wrapper(),
    )


BUILDERS = {"torch-distributed-gpu": torch_runtime, "torch-distributed-gpu-hf": torch_hf_runtime, "deepspeed-distributed-gpu": deepspeed_runtime, "tensorflow-distributed": tensorflow_runtime}


def runtimes(trainer: TrainerSettings) -> dict[str, dict]:
    """Base name (``torch-distributed-gpu``, ...) -> runtime manifest, for the configured runtimes."""
    return {name: BUILDERS[name](trainer) for name in trainer.runtimes}


def runtime_names(trainer: TrainerSettings) -> dict[str, str]:
    """Base name -> the current (content-hashed) object name; TrainJobs reference these."""
    return {base: obj["metadata"]["name"] for base, obj in runtimes(trainer).items()}


def trainer_chart_values(trainer: TrainerSettings) -> dict:
    """The chart's own runtimes stay off (ours are declared); TrainJob progress is on where the
    release has it; v2.1.0's JobSet image is pinned to its release registry because the staging
    image it shipped with no longer resolves."""
    values: dict[str, Any] = {"runtimes": {"defaultEnabled": False}}
    version = trainer.version
    if trainer_api.status_server_on(trainer):  # TrainJob progress from the programs (trainer.progressInStatus)
        values["manager"] = {"config": {"featureGates": {trainer_api.STATUS_FEATURE_GATE: True}}}
    if version == "v2.1.0":
        values["jobset"] = {"image": {"repository": versions.JOBSET_IMAGE_REPOSITORY, "tag": versions.TRAINER_VERSIONS[version]["jobset"]}}
    return values
