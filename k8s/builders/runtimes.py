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
fail on the missing STORAGE_URI (see ``k8s.builders.trainer_api``), so jobs that need no download (the DDP
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

Grace variants. A pod's grace period (SIGTERM to SIGKILL) lives in the runtime, never in a
TrainJob: Kueue v0.19.2 admits a TrainJob by a typed update built on Trainer v2.2.1's Go types,
which drops ``terminationGracePeriodSeconds`` from a pod patch (new in v2.3.0;
``k8s.builders.trainer_api.KUEUE_DROPPED_FIELDS``). So each runtime comes with the stack's
``trainer.terminationGraceSeconds`` and, as a runtime of its own named
``<base>-grace<N>-<hash>``, with every other grace period the platform offers
(``trainer.graceClasses``, and each enabled job's ``trainjobs.<job>.terminationGraceSeconds``):
a job with its own grace period references its variant. Labels say which is which:
``training-platform/runtime`` (``<base>`` or ``<base>-grace<N>``), ``training-platform/runtime-family``
(``<base>``) and ``training-platform/grace-seconds``; ``trainctl submit --grace-seconds`` picks the
variant by them.

Pod Security. Every pod of every runtime passes the ``restricted`` profile that team namespaces
enforce (k8s/builders/tenants.py; the rules are checked in tests/test_initializers.py): non-root
(``versions.WORKLOAD_UID``), seccomp ``RuntimeDefault``, no privilege escalation, every capability
dropped, only claim, ConfigMap and emptyDir volumes. The initializers' upstream images have no
``USER`` (root; kubeflow/trainer cmd/initializers/*/Dockerfile, v2.1.0 and v2.3.0), so their pods
set the user, and everything they write is writable by it: ``/workspace`` (see below) and
``HOME``/``HF_HOME`` on an emptyDir (huggingface_hub keeps its token and caches under ``HF_HOME``,
default ``~/.cache/huggingface``: constants.py of 0.27.0 and 1.24.0, the versions the images pin).
"""

from __future__ import annotations

import hashlib
import json
import pathlib
from collections.abc import Iterable, Mapping
from typing import Any

import versions
from config.labels import NODE_ROLE_LABEL
from config.settings import TrainerSettings
from k8s.builders import trainer_api
from k8s.builders.gpu_objects import GPU_TOLERATION, POOL_LABEL
from k8s.builders.tenants import CHECKPOINT_CLAIM  # the RWX claim every jobs' namespace has

NON_RETRYABLE_EXIT_CODES = [2, 3]
SHM_VOLUME = "dshm"
DO_NOT_DISRUPT = {"karpenter.sh/do-not-disrupt": "true"}
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
FRAMEWORK_LABEL = "trainer.kubeflow.org/framework"

RUNTIME_LABEL = "training-platform/runtime"  # the runtime's key: its base name, or <base>-grace<N> for a grace variant
FAMILY_LABEL = "training-platform/runtime-family"  # the base name (torch-distributed-gpu, ...), on every variant too
GRACE_LABEL = "training-platform/grace-seconds"  # its pods' terminationGracePeriodSeconds
# pulumi-kubernetes skips its await logic for an object with this annotation, on delete too (the
# unified delete await of pulumi-kubernetes #3133; #3154 discusses narrowing it to readiness in v5,
# which would need revisiting this). A CustomResource has no readiness await to lose.
SKIP_AWAIT = {"pulumi.com/skipAwait": "true"}
# spec.template.spec fields the CRDs mark immutable (CEL ``self == oldSelf``), both Trainer versions.
IMMUTABLE_TEMPLATE_FIELDS = ("failurePolicy", "network", "startupPolicy", "successPolicy", "volumeClaimPolicies")
IMMUTABLE_REPLICATED_JOB_FIELDS = ("dependsOn",)

# libfabric/NCCL settings for EFA; TrainJobs that get EFA devices add them (workloads/builders/trainjobs.py).
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

# Initializers write under /workspace (k8s.builders.trainer_api.INITIALIZER_WORKSPACE). Their volume is the
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
# claim (workloads/builders/trainjobs.py ``initialized_dir``). Under it, a directory per content: the
# TrainJob passes ``INITIALIZED_KEY`` (a hash of its dataset and model URIs) in
# ``spec.initializer.<kind>.env``, which the Trainer copies into the initializer container
# (builder.go ``Initializer``), so a job re-created under the same name with another dataset or
# model downloads into a fresh directory instead of mixing files with the old one (the hub client
# adds files to a local directory, it never removes any).
# The initializers run as the training user, and the kubelet creates a missing sub-path directory
# as root with the volume root's mode (kubelet ``makeMounts``: ``GetMode`` then ``SafeMakeDir``; see
# k8s/builders/tenants.py), where that user could not write. So an init container of the same image,
# as the same user, first creates ``initialized/<TrainJob>/<key>`` through a mount of the claim's
# root; the sub-path then exists and belongs to the user. The Trainer puts the key only into the
# container named like the initializer (builder.go ``Initializer``: ``Containers``, not
# ``InitContainers``), so the TrainJob also gives it to the initializer pods as the annotation
# ``INITIALIZED_KEY_ANNOTATION`` (a runtime patch on the initializer jobs, workloads/builders/trainjobs.py),
# which both containers read; the Trainer's env entry of the same name replaces the runtime's
# (pkg/apply/apply.go ``upsert``: the whole entry, by name). A TrainJob that sets neither (a team's
# own job through the SDK) gets ``initialized/<TrainJob>``.
INITIALIZED_ROOT = "initialized"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
TRAINJOB_NAME_ENV = "TRAINJOB_NAME"
INITIALIZED_KEY_ENV = "INITIALIZED_KEY"
INITIALIZED_KEY_ANNOTATION = "initialized-key"  # not a platform key (training-platform/...): a team sets it for its own job
WORKSPACE_SETUP = "workspace-setup"  # the initializers' init container
CLAIM_ROOT_MOUNT = "/mnt/claim"  # where it sees the claim's root
SCRATCH_VOLUME = "scratch"
SCRATCH_MOUNT = "/tmp"  # HOME and HF_HOME of the initializers: writable by their user
# small, CPU-only pods on the system node groups (the images are multi-arch): no GPU node is
# started or held for a download
INITIALIZER_RESOURCES = {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "4Gi"}}
WORKSPACE_SETUP_RESOURCES = {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}}
# The init container's program (the initializer images are Python images): the directory, or one
# line saying why not (an ``initialized`` tree made by root-run initializers of an older platform).
WORKSPACE_SETUP_SCRIPT = (
    "import os, sys\n"
    f"d = os.path.join({CLAIM_ROOT_MOUNT!r}, {INITIALIZED_ROOT!r}, os.environ[{TRAINJOB_NAME_ENV!r}], os.environ.get({INITIALIZED_KEY_ENV!r}, ''))\n"
    "try:\n"
    "    os.makedirs(d, exist_ok=True)\n"
    "except OSError as err:\n"
    "    sys.exit(f'workspace-setup: cannot create {d} as uid {os.getuid()}: {err.strerror}; the initializers write there as this user (hand the directory to it)')\n"
    "print(f'workspace-setup: {d} ready', flush=True)\n"
)


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
        "securityContext": restricted_container_security(),
    }
    if command:
        container["command"] = command
    return container


def trainer_pod_security() -> dict:
    """The trainer pods run as the image's non-root user (``versions.WORKLOAD_UID``; workloads/Dockerfile
    switches to it). Their checkpoint directories are handed to that user before any job starts
    (k8s/builders/volume_setup.py), since the CSI drivers apply no fsGroup to the RWX checkpoint volumes.
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


def restricted_container_security() -> dict:
    """What Pod Security ``restricted`` asks of every container that the pod-level context does not
    already give: no privilege escalation, every capability dropped."""
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def initializer_job(*, kind: str, image: str) -> dict:
    """Replicated job ``dataset-initializer`` or ``model-initializer``: the upstream image with its
    own entrypoint, the ancestor label and container name the Trainer looks for, the volume named
    ``initializer`` mounted at /workspace, run as the training user (see the module docstring: the
    init container that makes its directory, the scratch volume). One pod, no in-place retries: a
    failed download fails the Job and the JobSet failure policy restarts the group (a restart of
    nothing but downloads)."""
    name = {"dataset": trainer_api.DATASET_INITIALIZER, "model": trainer_api.MODEL_INITIALIZER}[kind]
    key_env = [
        {"name": TRAINJOB_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{JOBSET_NAME_LABEL}']"}}},
        {"name": INITIALIZED_KEY_ENV, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{INITIALIZED_KEY_ANNOTATION}']"}}},
    ]
    scratch_env = [{"name": "HOME", "value": SCRATCH_MOUNT}, {"name": "HF_HOME", "value": f"{SCRATCH_MOUNT}/huggingface"}]
    setup = {
        "name": WORKSPACE_SETUP,
        "image": image,
        "command": ["python", "-c", WORKSPACE_SETUP_SCRIPT],
        "env": [dict(e) for e in key_env],
        "resources": WORKSPACE_SETUP_RESOURCES,
        "volumeMounts": [{"name": trainer_api.INITIALIZER_VOLUME, "mountPath": CLAIM_ROOT_MOUNT}],
        "securityContext": restricted_container_security(),
    }
    container = {
        "name": name,
        "image": image,
        "env": [*key_env, *scratch_env],
        "resources": INITIALIZER_RESOURCES,
        "volumeMounts": [
            {"name": trainer_api.INITIALIZER_VOLUME, "mountPath": trainer_api.INITIALIZER_WORKSPACE, "subPathExpr": initialized_subpath(f"$({TRAINJOB_NAME_ENV})", f"$({INITIALIZED_KEY_ENV})")},
            {"name": SCRATCH_VOLUME, "mountPath": SCRATCH_MOUNT},
        ],
        "securityContext": restricted_container_security(),
    }
    pod_spec = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "securityContext": trainer_pod_security(),
        "nodeSelector": {NODE_ROLE_LABEL: "system"},
        "initContainers": [setup],
        "containers": [container],
        "volumes": [
            {"name": trainer_api.INITIALIZER_VOLUME, "persistentVolumeClaim": {"claimName": CHECKPOINT_CLAIM}},
            {"name": SCRATCH_VOLUME, "emptyDir": {}},
        ],
    }
    return {
        "name": name,
        "replicas": 1,
        # do-not-disrupt as on every pod of a runtime: an evicted download fails the Job and costs a restart
        "template": {"metadata": {"labels": {ANCESTOR_LABEL: name}}, "spec": {"backoffLimit": 0, "template": {"metadata": {"annotations": dict(DO_NOT_DISRUPT)}, "spec": pod_spec}}},
    }


def variant_key(base: str, grace: int | None, trainer: TrainerSettings) -> str:
    """The key (label ``training-platform/runtime``) of the runtime of kind ``base`` whose pods get
    ``grace`` seconds: ``base`` itself for the stack's ``trainer.terminationGraceSeconds`` (or None),
    else ``<base>-grace<N>``."""
    return variant_key_for(base, grace, trainer.termination_grace_seconds)


def variant_key_for(base: str, grace: int | None, default_grace: int) -> str:
    """:func:`variant_key` given the stack's default grace period (a run stack has only that fact)."""
    return base if grace is None or grace == default_grace else f"{base}-grace{grace}"


def runtime(
    *, name: str, framework: str, trainer: TrainerSettings, image: str, ml_policy: dict, command: list[str] | None = None, extra_env: list[dict] | None = None,
    initializers: dict[str, str] | None = None, grace: int | None = None,
) -> dict:
    """A ClusterTrainingRuntime of kind ``name`` named ``<key>-<hash of its immutable parts>``
    (``key``: :func:`variant_key` for ``grace``, default the stack's). ``initializers``:
    kind (``dataset``, ``model``) -> image; the node job then ``dependsOn`` their completion
    (JobSet ``dependsOn`` names earlier replicated jobs: they come first)."""
    grace = trainer.termination_grace_seconds if grace is None else grace
    key = variant_key(name, grace, trainer)
    # SIGTERM to SIGKILL: the programs save their step in it (workloads/programs/trainlib.py preemption)
    # and warn when their checkpoint does not fit (TRAINING_TERMINATION_GRACE_S)
    env = [*BASE_ENV, {"name": GRACE_ENV, "value": str(grace)}, *(extra_env or [])]
    pod_spec = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": grace,
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
        "metadata": {"name": key, "labels": {FRAMEWORK_LABEL: framework, RUNTIME_LABEL: key, FAMILY_LABEL: name, GRACE_LABEL: str(grace)}, "annotations": dict(SKIP_AWAIT)},
        "spec": {
            "mlPolicy": {"numNodes": 1, **ml_policy},
            "template": {"spec": {"failurePolicy": failure_policy(trainer.max_restarts), "replicatedJobs": [*pre_jobs, job]}},
        },
    }
    manifest["metadata"]["name"] = content_name(key, manifest)
    return manifest


def torch_runtime(trainer: TrainerSettings, grace: int | None = None) -> dict:
    return runtime(
        name="torch-distributed-gpu", framework="torch", trainer=trainer, image=versions.TORCH_RUNTIME_IMAGE,
        ml_policy={"torch": trainer_api.torch_ml_policy(trainer.version)}, grace=grace,
    )


def torch_hf_runtime(trainer: TrainerSettings, grace: int | None = None) -> dict:
    """The torch runtime with the Trainer's Hugging Face dataset and model initializers (images
    of the installed Trainer release); TrainJobs on it set ``spec.initializer`` with both."""
    return runtime(
        name="torch-distributed-gpu-hf", framework="torch", trainer=trainer, image=versions.TORCH_RUNTIME_IMAGE,
        ml_policy={"torch": trainer_api.torch_ml_policy(trainer.version)}, initializers=dict(versions.INITIALIZER_IMAGES[trainer.version]), grace=grace,
    )


def deepspeed_runtime(trainer: TrainerSettings, grace: int | None = None) -> dict:
    """DeepSpeed launched by torchrun (one launcher per node, the Trainer's PET_* rendezvous),
    so it shares the torch runtime's restart semantics instead of an MPI launcher."""
    return runtime(
        name="deepspeed-distributed-gpu", framework="deepspeed", trainer=trainer, image=versions.DEEPSPEED_RUNTIME_IMAGE,
        ml_policy={"torch": trainer_api.torch_ml_policy(trainer.version)}, grace=grace,
    )


def tf_config_wrapper() -> list[str]:
    """Container command that sets TF_CONFIG from the injected PET_* env and execs the args."""
    source = (pathlib.Path(__file__).resolve().parent.parent / "pods" / "tf_config.py").read_text()
    return ["python3", "-c", source, "--"]


def tensorflow_runtime(trainer: TrainerSettings, grace: int | None = None) -> dict:
    """The torch policy is used only for what it injects (node count, rank, node 0's address);
    the TrainJob passes its program as ``trainer.args`` and keeps the wrapper command."""
    return runtime(
        name="tensorflow-distributed", framework="tensorflow", trainer=trainer, image=versions.TENSORFLOW_RUNTIME_IMAGE,
        ml_policy={"torch": trainer_api.torch_ml_policy(trainer.version)}, command=tf_config_wrapper(), grace=grace,
    )


BUILDERS = {"torch-distributed-gpu": torch_runtime, "torch-distributed-gpu-hf": torch_hf_runtime, "deepspeed-distributed-gpu": deepspeed_runtime, "tensorflow-distributed": tensorflow_runtime}


def grace_variants(trainer: TrainerSettings, base: str, job_graces: Mapping[str, Iterable[int]] | None = None) -> list[int]:
    """The grace periods the runtime of kind ``base`` gets a variant for: every one the platform
    offers (``trainer.graceClasses``) and those of the stack's jobs on it (``job_graces``: base ->
    seconds, config.settings.job_grace_periods), less the stack's own (the base runtime has it)."""
    wanted = set(trainer.grace_classes) | set((job_graces or {}).get(base, ()))
    return sorted(wanted - {trainer.termination_grace_seconds})


def runtimes(trainer: TrainerSettings, job_graces: Mapping[str, Iterable[int]] | None = None) -> dict[str, dict]:
    """Key -> runtime manifest, for the configured runtimes: each base name (``torch-distributed-gpu``,
    ...) and each of its grace variants (``<base>-grace<N>``, :func:`grace_variants`)."""
    found: dict[str, dict] = {}
    for base in trainer.runtimes:
        found[base] = BUILDERS[base](trainer)
        for grace in grace_variants(trainer, base, job_graces):
            found[variant_key(base, grace, trainer)] = BUILDERS[base](trainer, grace)
    return found


def runtime_names(trainer: TrainerSettings, job_graces: Mapping[str, Iterable[int]] | None = None) -> dict[str, str]:
    """Key (base name or grace variant) -> the current (content-hashed) object name; TrainJobs reference these."""
    return {key: obj["metadata"]["name"] for key, obj in runtimes(trainer, job_graces).items()}


def trainer_chart_values(trainer: TrainerSettings) -> dict:
    """The chart's own runtimes stay off (ours are declared); TrainJob progress is on where the
    release has it; v2.1.0's JobSet image is pinned to its release registry because the staging
    image it shipped with no longer resolves."""
    version = trainer.version
    # only v2.3.0's chart installs runtimes of its own (its templated runtimes and their hook Job);
    # v2.1.0's chart has no `runtimes` key (its values.yaml), and the chart refuses unknown keys
    # (tools/cluster/charts.py renders it with these values on the local control plane)
    values: dict[str, Any] = {} if version == "v2.1.0" else {"runtimes": {"defaultEnabled": False}}
    if trainer_api.status_server_on(trainer):  # TrainJob progress from the programs (trainer.progressInStatus)
        values["manager"] = {"config": {"featureGates": {trainer_api.STATUS_FEATURE_GATE: True}}}
    if version == "v2.1.0":
        values["jobset"] = {"image": {"repository": versions.JOBSET_IMAGE_REPOSITORY, "tag": versions.TRAINER_VERSIONS[version]["jobset"]}}
    return values
