"""Pure builders for the training workloads: namespace, code ConfigMap, checkpoint volume and
TrainJobs. Plain dicts from typed settings; the Trainer version decides the TrainJob's shape
(through ``k8s.builders.trainer_api``), the GPU catalog decides GPUs, EFA devices, CPU and memory."""

from __future__ import annotations

import base64
import hashlib
import pathlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from config import catalog
from config.job_env import env_list
from config.object_size import env_blame, size_problem
from config.schema import UNSHOWN, ConfigError
from config.settings import (
    DEADLINE_INCOMPATIBLE_TRAINERS,
    TF_RUNTIME,
    DdpJobSettings,
    FsdpJobSettings,
    JobBase,
    JobSettings,
    NcclCheckSettings,
    Settings,
    TfJobSettings,
    job_gpus_per_node,
)
from k8s.builders import trainer_api
from k8s.builders.gpu_objects import EFA_LABEL, EFA_POOL, GPU_POOL, POOL_LABEL, efa_devices_per_node
from k8s.builders.images import from_docker_hub
from k8s.builders.kueue import PRIORITY_LABEL
from k8s.builders.runtimes import EFA_ENV, INITIALIZED_KEY_ANNOTATION, INITIALIZED_KEY_ENV, initialized_subpath
from k8s.builders.tenants import CHECKPOINT_CLAIM, CODE_PREFIX, JOB_LABEL, QUEUE_LABEL, TTL_ANNOTATION  # noqa: F401  (JOB_LABEL: part of this module's interface)
from k8s.builders.trainer_api import INITIALIZED_DATASET, INITIALIZED_MODEL
from workloads.builders.job_platform import JobPlatform, of_settings

PROGRAMS_DIR = pathlib.Path(__file__).resolve().parent.parent / "programs"  # the training image's programs
CODE_MOUNT = "/opt/training/code"
CHECKPOINT_MOUNT = "/mnt/checkpoints"
CODE_VOLUME = "training-code"
CHECKPOINT_VOLUME = "checkpoints"
CODE_HASH_ANNOTATION = "training-platform/code-sha256"
DDP_SAMPLES = 60000  # generated digits per epoch: MNIST's training-set size
JOB_NAME_ENV = "TRAINING_JOB_NAME"  # the job label of the programs' metric lines (workloads/programs/trainlib.py)
STALL_ENV = "TRAINING_STALL_TIMEOUT_S"  # the programs' hang watchdog (trainlib.Progress)
CHECKPOINT_DIR_ENV = "TRAINING_CHECKPOINT_DIR"  # trainctl's jobs: /mnt/checkpoints/<job>, kept across resubmits of the name
RESUME_FROM_ENV = "TRAINING_RESUME_FROM"  # trainctl submit --resume-from: another job's checkpoint directory, to read
# A code directory's requirements.txt, installed by the launcher before the command (workloads/programs/launch.py,
# whose names these are): an emptyDir on the node's disk holds pip's cache and the installed packages. Pod Security
# "restricted", which team namespaces enforce, allows emptyDir volumes and refuses hostPath (Kubernetes docs, Pod
# Security Standards: "Restricted ... Volume Types: ... emptyDir" listed, hostPath not; k8s/builders/admission.py ALLOWED_VOLUMES).
DEPS_VOLUME = "training-deps"
DEPS_MOUNT = "/var/cache/training-deps"
DEPS_SIZE_LIMIT = "20Gi"  # a full node disk evicts every pod on it: the kubelet evicts this pod alone past the limit
REQUIREMENTS_FILE = "requirements.txt"
DEFAULT_PIP_INDEX_URL = "https://pypi.org/simple"
DEFAULT_DEPS_TIMEOUT_S = 600


@dataclass(frozen=True)
class Dependencies:
    """How the launcher installs a code directory's requirements.txt: the platform's index (its
    published facts) and the job's time limit (``trainctl submit --deps-timeout``)."""

    index_url: str = DEFAULT_PIP_INDEX_URL
    extra_index_urls: tuple[str, ...] = ()
    timeout_seconds: int = DEFAULT_DEPS_TIMEOUT_S

    def env(self) -> list[dict]:
        extra = [{"name": "TRAINING_PIP_EXTRA_INDEX_URLS", "value": " ".join(self.extra_index_urls)}] if self.extra_index_urls else []
        return [
            {"name": "TRAINING_DEPS_DIR", "value": DEPS_MOUNT}, {"name": "TRAINING_PIP_INDEX_URL", "value": self.index_url}, *extra,
            {"name": "TRAINING_DEPS_TIMEOUT_S", "value": str(self.timeout_seconds)},
        ]


def _stall_env(job: JobBase) -> list[dict]:
    """The watchdog's limit, for the programs that have one (config: JobBase.STALL_WATCHDOG)."""
    timeout = job.stall_timeout_seconds if type(job).STALL_WATCHDOG else 0
    return [{"name": STALL_ENV, "value": str(timeout)}] if timeout else []


def _preflight_env(job: JobBase, efa_devices: int) -> list[dict]:
    """What the node's preflight checks against (workloads/programs/launch.py)."""
    env = [{"name": "TRAINING_EXPECTED_GPUS", "value": str(job_gpus_per_node(job))}]
    return env + ([{"name": "TRAINING_EXPECTED_EFA", "value": str(efa_devices)}] if efa_devices else [])


@dataclass(frozen=True)
class Workload:
    """A job kind: where its settings live, what it runs and on which runtime.

    ``runtime`` decides how the program is started: on the torch runtime the TrainJob's command
    is ``launch.py torchrun <program>``; on ``tensorflow-distributed`` the TrainJob sets only
    ``args`` (``python3 <program> ...``), so the runtime's TF_CONFIG wrapper command stays (the
    Trainer's JobSet builder replaces the container's command/args only with those the TrainJob
    sets: kubeflow/trainer pkg/runtime/framework/plugins/jobset/builder.go, v2.1.0 and v2.3.0).
    ``tiny_profile``: what the local emulator appends to the rendered arguments (the last value
    of an option wins)."""

    key: str  # config key under trainjobs
    kind: str  # the TrainJob's training-platform/job label and `make emulate JOB=`
    name: str  # TrainJob name
    program: str
    runtime: str  # ClusterTrainingRuntime base name (k8s/builders/runtimes.py BUILDERS)
    settings: type[JobBase]
    tiny_profile: tuple[str, ...]


_TRAIN_TINY = ("--epochs", "1", "--max-steps", "12", "--checkpoint-every", "2", "--log-every", "1")  # a checkpoint every 2 steps
WORKLOADS: dict[str, Workload] = {
    w.key: w
    for w in (
        Workload(
            key="ddp", kind="ddp", name="ddp-mnist", program=DdpJobSettings.PROGRAM, runtime=DdpJobSettings.RUNTIME, settings=DdpJobSettings,
            tiny_profile=("--synthetic-samples", "512", "--batch-size", "16", *_TRAIN_TINY),
        ),
        Workload(
            key="fsdp", kind="fsdp", name="fsdp-t5", program=FsdpJobSettings.PROGRAM, runtime=FsdpJobSettings.RUNTIME, settings=FsdpJobSettings,
            # the real data path: the dataset and model the (emulated) initializers wrote
            tiny_profile=("--source-len", "32", "--target-len", "16", "--batch-size", "4", *_TRAIN_TINY),
        ),
        Workload(
            key="tf", kind="tf", name="tf-mnist", program=TfJobSettings.PROGRAM, runtime=TfJobSettings.RUNTIME, settings=TfJobSettings,
            tiny_profile=("--synthetic-samples", "512", "--batch-size", "16", *_TRAIN_TINY),
        ),
        # small messages and no pass mark: on CPU (gloo) the figure says nothing about a fabric
        Workload(
            key="ncclCheck", kind="nccl-check", name="nccl-check", program=NcclCheckSettings.PROGRAM, runtime=NcclCheckSettings.RUNTIME, settings=NcclCheckSettings,
            tiny_profile=("--min-bytes", "4K", "--max-bytes", "1M", "--warmup", "2", "--iters", "5", "--min-busbw-gbps", "0"),
        ),
    )
}
WORKLOAD_BY_KIND = {w.kind: w for w in WORKLOADS.values()}
TINY_PROFILE = {w.kind: list(w.tiny_profile) for w in WORKLOADS.values()}


def code_files() -> dict[str, str]:
    """The training code shipped in the ConfigMap: every program and its shared library."""
    return {p.name: p.read_text() for p in sorted(PROGRAMS_DIR.glob("*.py"))}


def code_hash(files: Mapping[str, str | bytes]) -> str:
    """Over names and contents; a file given as bytes (binary) hashes its bytes, text its UTF-8."""
    h = hashlib.sha256()
    for name in sorted(files):
        content = files[name]
        h.update(name.encode() + b"\0" + (content if isinstance(content, bytes) else content.encode()) + b"\0")
    return h.hexdigest()



def code_configmap_name(files: Mapping[str, str | bytes], prefix: str = CODE_PREFIX) -> str:
    """Content-addressed: a code change makes a new ConfigMap, so the TrainJob referencing it
    changes and is replaced (the job rolls). ``prefix``: a TrainJob stack's run has its own (its
    ConfigMap is its own, ended with it)."""
    return f"{prefix}-{code_hash(files)[:10]}"


def namespace(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {"pod-security.kubernetes.io/enforce": "baseline", "pod-security.kubernetes.io/warn": "restricted"}}}


def code_configmap(ns: str, files: Mapping[str, str | bytes], prefix: str = CODE_PREFIX) -> dict:
    """Text files go into ``data``; files given as bytes (not UTF-8) into ``binaryData``, base64
    as the API carries it (the ConfigMap API: values with non-UTF-8 byte sequences must use
    BinaryData)."""
    cm: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": code_configmap_name(files, prefix), "namespace": ns, "annotations": {CODE_HASH_ANNOTATION: code_hash(files)}},
        "immutable": True,
        "data": {k: v for k, v in files.items() if not isinstance(v, bytes)},
    }
    binary = {k: base64.b64encode(v).decode() for k, v in files.items() if isinstance(v, bytes)}
    if binary:
        cm["binaryData"] = binary
    return cm


def initialized_key(job: FsdpJobSettings) -> str:
    """The content key of a job's downloads: a new dataset or model gets a new directory."""
    return hashlib.sha256(f"{job.dataset_uri()}\0{job.model_uri()}".encode()).hexdigest()[:10]


def initialized_dir(trainjob_name: str, key: str) -> str:
    """Where a TrainJob's trainer pods find what its initializers downloaded: the same directory
    of the checkpoint claim (``k8s.builders.runtimes.initialized_subpath``) through the trainer's mount."""
    return f"{CHECKPOINT_MOUNT}/{initialized_subpath(trainjob_name, key)}"


def initializer(job: JobBase, platform: JobPlatform) -> dict[str, Any] | None:
    """TrainJob.spec.initializer for jobs on the runtime with initializers (FSDP: the dataset and
    the model as ``hf://`` URIs; the optional token as a secretRef)."""
    if not isinstance(job, FsdpJobSettings):
        return None
    key = [{"name": INITIALIZED_KEY_ENV, "value": initialized_key(job)}]
    return trainer_api.initializer_spec(dataset_uri=job.dataset_uri(), model_uri=job.model_uri(), token_secret=platform.hf_token_secret, env=key)


def initializer_pod_metadata(init: dict[str, Any] | None) -> dict[str, dict]:
    """Initializer job -> its pods' metadata: the content key as the annotation the initializers'
    init container reads (k8s/builders/runtimes.py: the Trainer gives the key only to the initializer
    container itself)."""
    jobs = {"dataset": trainer_api.DATASET_INITIALIZER, "model": trainer_api.MODEL_INITIALIZER}
    found = {}
    for kind, source in (init or {}).items():
        key = next((e["value"] for e in source.get("env", []) if e["name"] == INITIALIZED_KEY_ENV), None)
        if key is not None:
            found[jobs[kind]] = {"annotations": {INITIALIZED_KEY_ANNOTATION: key}}
    return found


def runtime_key(workload: Workload, job: JobBase, platform: JobPlatform | Settings) -> str:
    """The runtime (key of ``k8s.builders.runtimes.runtimes``) a job runs on: its workload's, or that
    runtime's grace variant when the job has a grace period of its own."""
    default = platform.default_grace if isinstance(platform, JobPlatform) else platform.trainer.termination_grace_seconds
    return JobPlatform.runtime_key_of(workload.runtime, job.termination_grace_seconds, default)


def program_args(workload: Workload, job: JobBase) -> list[str]:
    if not isinstance(job, workload.settings):
        raise TypeError(f"workload {workload.key} needs {workload.settings.__name__}, not {type(job).__name__}")
    if isinstance(job, NcclCheckSettings):
        mark = job.pass_mark_gbps()
        if mark is None:  # config refuses this (trainjobs.ncclCheck.minBusBwGBps is required then)
            raise ValueError(f"TrainJob {workload.name}: no pass mark for {job.instance_type}; set trainjobs.ncclCheck.minBusBwGBps")
        return ["--min-busbw-gbps", f"{mark:g}"] + list(job.extra_args)
    assert isinstance(job, JobSettings)
    args = ["--epochs", str(job.epochs), "--checkpoint-dir", f"{CHECKPOINT_MOUNT}/{workload.name}"]
    if workload.kind == "ddp":
        args += ["--synthetic", "--synthetic-samples", str(DDP_SAMPLES)]
    elif workload.kind == "fsdp":
        assert isinstance(job, FsdpJobSettings), f"workload {workload.kind} needs FSDP job settings"
        workspace = initialized_dir(workload.name, initialized_key(job))
        args += ["--model", job.model, "--dataset-dir", f"{workspace}/{INITIALIZED_DATASET}", "--model-dir", f"{workspace}/{INITIALIZED_MODEL}"]
    return args + list(job.extra_args)


def trainer_entry(workload: Workload, job: JobBase) -> dict[str, Any]:
    """The TrainJob trainer's ``command``/``args`` and processes per node, by runtime."""
    args = program_args(workload, job)
    if workload.runtime == TF_RUNTIME:
        # one TensorFlow worker per node (MultiWorkerMirroredStrategy drives every local GPU); the
        # runtime's wrapper command sets TF_CONFIG and execs these args: the launcher (the node's
        # preflight, the exit codes) running the one worker, as trainctl runs a user's TF code
        launcher = f"{CODE_MOUNT}/launch.py"
        return {"args": ["python3", launcher, "python3", launcher, "--worker", "python3", f"{CODE_MOUNT}/{workload.program}", *args], "numProcPerNode": 1}
    # launch.py keeps the workers' non-retryable exit codes visible to the failure policy
    return {"command": ["python3", f"{CODE_MOUNT}/launch.py", "torchrun", f"{CODE_MOUNT}/{workload.program}"], "args": args, "numProcPerNode": job_gpus_per_node(job)}


def efa_devices(job: JobBase, platform: JobPlatform) -> int:
    """EFA devices for one node of the job: what the EFA pool's nodes of this type expose
    (``efa_devices_per_node``, the same function the node class is built from), in proportion
    to the GPUs used. 0 when the type does not land in the EFA pool: then it gets no EFA devices
    and no EFA environment either."""
    if not (platform.efa_enabled and job.instance_type in platform.efa_types):
        return 0
    per_node = efa_devices_per_node(job.instance_type)
    if not per_node:
        return 0
    info = catalog.lookup(job.instance_type)
    return max(1, per_node * job_gpus_per_node(job) // info.gpus)


def job_env(job: JobBase, platform: JobPlatform) -> list[dict]:
    """The trainer container's env: libfabric/NCCL EFA settings only for jobs that get EFA
    devices (a job told ``FI_PROVIDER=efa`` on a node without EFA fails to initialise NCCL's
    network plugin instead of falling back to sockets)."""
    env: list[dict] = []
    if efa_devices(job, platform):
        env += [dict(e) for e in EFA_ENV]
    return env


def resources_per_node(job: JobBase, platform: JobPlatform) -> dict:
    info = catalog.lookup(job.instance_type)
    gpus = job_gpus_per_node(job)
    cpu, memory = catalog.node_pod_request(info, gpus)
    limits: dict[str, Any] = {"nvidia.com/gpu": gpus}
    efa = efa_devices(job, platform)
    if efa:
        limits["vpc.amazonaws.com/efa"] = efa
    return {"requests": {"cpu": str(cpu), "memory": f"{memory}Gi"}, "limits": {**limits, "memory": f"{memory}Gi"}}


RUNTIME_IMAGE = object()
"""``trainjob(image=RUNTIME_IMAGE)``: the TrainJob names no image, so the Trainer runs its runtime's
(trainctl without ``--image``: whatever image that cluster's runtime names, one its nodes can pull)."""


def trainjob(
    workload: Workload, job: JobBase, platform: JobPlatform | Settings, *, code_configmap: str, image: Any = None, runtime_name: str | None = None, queue: str | None = None, entry: dict[str, Any] | None = None,
    priority: str | None = None, deps: Dependencies | None = None, env: list[dict] | None = None, ttl_seconds: int | None = None,
) -> dict:
    """The TrainJob of a workload on its runtime (``runtime_name``: the runtime's current
    content-hashed name; computed from the settings when not given). ``image``: the trainer image
    (a string or an Output, e.g. the stack's built image by digest); when not given, the job's
    own ``image`` setting, which must then be set. ``queue``: the Kueue LocalQueue the job waits in
    (with Kueue on); the job then also names its GPU pool, so Kueue picks that pool's flavor.
    ``entry``: the trainer's ``command``/``args``/``numProcPerNode`` (``trainctl`` passes the
    user's command); default :func:`trainer_entry` of the workload. ``platform``: the facts of the
    platform it runs on (:mod:`workloads.builders.job_platform`; a stack's settings are taken as theirs).
    ``deps``: the code ships a requirements.txt: the launcher's volume and settings (:class:`Dependencies`).
    ``env``: more variables for the trainer (trainctl's checkpoint directory). ``ttl_seconds``: the
    job asks to be deleted that long after it finishes (trainctl's and the portal's jobs)."""
    if not isinstance(platform, JobPlatform):
        platform = of_settings(platform, queue=queue is not None)
    image = image if image is not None else job.image
    if image is None:
        raise ValueError(f"TrainJob {workload.name}: no image (trainjobs.{workload.key}.image is unset and no built image was passed)")
    if runtime_name is None:
        key = runtime_key(workload, job, platform)
        if key not in platform.runtime_names:  # config refuses this (trainjobs.<job>.enabled; a run stack: job_platform.run_problems)
            raise ValueError(f"TrainJob {workload.name}: runtime {workload.runtime} is not in trainer.runtimes")
        runtime_name = platform.runtime_names[key]
    ns = platform.namespace
    node_selector = {"node.kubernetes.io/instance-type": job.instance_type}
    zone = job.availability_zone
    if efa_devices(job, platform):
        node_selector[EFA_LABEL] = "true"
        # exactly the EFA pool of this type (every EFA flavor carries the EFA label: see efa_pool_of)
        node_selector[POOL_LABEL] = platform.efa_pool_of(job.instance_type) or EFA_POOL
        zone = zone or platform.efa_zone  # EFA nodes live in that one AZ (config refuses another)
    elif queue is not None:
        node_selector[POOL_LABEL] = GPU_POOL  # else Kueue may place it in an EFA pool, whose types differ
    if zone:
        node_selector["topology.kubernetes.io/zone"] = zone
    pod_spec = {
        "nodeSelector": node_selector,
        "volumes": [
            {"name": CODE_VOLUME, "configMap": {"name": code_configmap}},
            {"name": CHECKPOINT_VOLUME, "persistentVolumeClaim": {"claimName": platform.checkpoint_claim}},
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
    if deps is not None:
        pod_spec["volumes"].append({"name": DEPS_VOLUME, "emptyDir": {"sizeLimit": DEPS_SIZE_LIMIT}})
        pod_spec["containers"][0]["volumeMounts"].append({"name": DEPS_VOLUME, "mountPath": DEPS_MOUNT})
    # a job's own grace period is its runtime's (runtime_key), never a pod patch: Kueue drops that
    init = initializer(job, platform) if entry is None else None  # trainctl's own commands bring no initializer
    field, value = trainer_api.pod_customization(platform.trainer_version, metadata=None, pod_spec=pod_spec, job_metadata=initializer_pod_metadata(init))
    lifecycle: dict[str, Any] = {}
    if job.active_deadline_seconds is not None:  # a TrainJob field from Trainer v2.2 (config refuses it on v2.1.0)
        if platform.trainer_version in DEADLINE_INCOMPATIBLE_TRAINERS:
            raise ValueError(f"TrainJob {workload.name}: Trainer {platform.trainer_version} has no activeDeadlineSeconds")
        lifecycle["activeDeadlineSeconds"] = job.active_deadline_seconds
    manifest = {
        "apiVersion": trainer_api.API_VERSION,
        "kind": "TrainJob",
        "metadata": {"name": workload.name, "namespace": ns, "labels": {JOB_LABEL: workload.kind, **({QUEUE_LABEL: queue, PRIORITY_LABEL: priority or getattr(job, "priority", "normal")} if queue else {})},
                     **({"annotations": {TTL_ANNOTATION: str(ttl_seconds)}} if ttl_seconds is not None else {})},
        "spec": {
            "runtimeRef": {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime", "name": runtime_name},
            "trainer": {
                **({} if image is RUNTIME_IMAGE else {"image": image}),
                **(entry if entry is not None else trainer_entry(workload, job)),
                "numNodes": job.num_nodes,
                "resourcesPerNode": resources_per_node(job, platform),
                # with initializers the program reads data and models from disk: never the hub
                "env": [*job_env(job, platform), *([{"name": "HF_HUB_OFFLINE", "value": "1"}] if init else []), {"name": JOB_NAME_ENV, "value": workload.name}, *_stall_env(job), *_preflight_env(job, efa_devices(job, platform)),
                        *(deps.env() if deps is not None else []), *(env or [])],
            },
            **({"initializer": init} if init else {}),
            field: value,
            **lifecycle,
        },
    }
    # the job's own env and Secret references, after the platform's (config/job_env.py: never one of its names)
    manifest["spec"]["trainer"]["env"] += env_list(job.env, job.secret_env)
    dropped = trainer_api.dropped_by_kueue(manifest) if queue else []
    if dropped:  # a builder change that Kueue's admission would undo (k8s/builders/trainer_api.py KUEUE_DROPPED_FIELDS)
        raise ValueError(f"TrainJob {workload.name}: Kueue's Trainer {trainer_api.KUEUE_TRAINER_TYPES} types drop {', '.join(dropped)} at admission; put it in the runtime")
    return manifest


def run_image(job: JobBase, platform_image: Any, copy: Callable[[str], Any] | None) -> Any:
    """The trainer image of a run: the image the config names (as given when the stack file names it;
    a default that is a Docker Hub image: the platform's ECR copy of it, by ``copy``), else the
    platform's built image."""
    if job.image is None:
        return platform_image
    if copy is not None and "image" not in job.model_fields_set and from_docker_hub(job.image):
        return copy(job.image)
    return job.image


def run_objects(
    workload: Workload, job: JobBase, platform: JobPlatform, *, files: Mapping[str, str | bytes], image: Any = None, runtime_name: str | None = None, entry: dict[str, Any] | None = None,
    priority: str | None = None, code_prefix: str = CODE_PREFIX, deps: Dependencies | None = None, env: list[dict] | None = None, ttl_seconds: int | None = None,
) -> tuple[dict, dict]:
    """The one function that builds a run's objects, its code ConfigMap and its TrainJob, from the
    job model and the facts of the platform it runs on: the platform's ``trainjobs.<job>``
    (workloads/trainjobs.py), a TrainJob stack (workloads/__main__.py) and ``trainctl submit``
    (trainctl/objects.py) all call it. ``code_prefix``: the ConfigMap's name before its content hash
    (a TrainJob stack's run: ``<its TrainJob>-code``, so it never shares the platform's). ``deps`` and
    ``env`` and ``ttl_seconds``: as :func:`trainjob` takes them (trainctl's jobs)."""
    configmap = code_configmap(platform.namespace, files, code_prefix)
    manifest = trainjob(
        workload, job, platform, code_configmap=configmap["metadata"]["name"], image=image, runtime_name=runtime_name, queue=platform.queue, entry=entry, priority=priority, deps=deps, env=env,
        ttl_seconds=ttl_seconds,
    )
    return configmap, manifest


def size_problems(key: str, job: JobBase, objects: Iterable[dict]) -> Iterator[ConfigError]:
    """A line for each of a run's objects (``run_objects``: its code ConfigMap, its TrainJob) that
    the API server cannot store (config/object_size.py, the check trainctl makes too), named by
    the job's config key ``key``, or by its largest environment variable (never its value)."""
    for obj in objects:
        if (why := size_problem(obj)) is None:
            continue
        # the variable whose value alone makes the difference names the line; else the job
        culprit, largest = env_blame(obj, job.env)
        where = f"{key}.env.{culprit}" if culprit else key
        yield ConfigError(where, UNSHOWN, f"{why}{largest}; allowed: values that fit (a large value belongs in a file the job reads: its image, the checkpoint volume, S3)")
