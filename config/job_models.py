"""The settings models of the stack's TrainJobs and their checkpoint storage."""


from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import ClassVar, Literal

import versions
from config import catalog, job_env
from config.checks import _DURATION_RE, _IN_CATALOG, AZ_RE, DNS_LABEL_RE, _pattern
from config.infra_models import TF_RUNTIME, TORCH_HF_RUNTIME, TORCH_RUNTIME
from config.namespaces import AGENT_NAMESPACE, KARPENTER_NAMESPACE, KUEUE_NAMESPACE, MONITORING_NAMESPACE, OPS_NAMESPACE, PORTAL_NAMESPACE, STORAGE_NAMESPACE, TRAINER_NAMESPACE
from config.schema import Bool, ConfigError, Float, Int, SchemaCheck, Section, camel, known, opt
from config.secrets import UNSHOWN

# --- training jobs ---------------------------------------------------------------------------

_IMAGE_CHECK = _pattern(re.compile(r"^[a-z0-9.-]+(:\d+)?(/[a-z0-9._-]+)+(:[\w.-]+|@sha256:[0-9a-f]{64})$", re.ASCII), "an image reference such as registry/org/name:tag")
_MODEL_CHECK = _pattern(re.compile(r"^[\w.-]+(/[\w.-]+)?$", re.ASCII), "a model id such as google-t5/t5-large")
HF_SCHEME = "hf://"
# The Trainer's Hugging Face dataset initializer downloads repo ``<netloc>/<first path segment>``
# of STORAGE_URI (kubeflow/trainer pkg/initializers/dataset/huggingface.py, v2.1.0 and v2.3.0): an
# id without an owner has no path segment and fails there, a longer path is silently cut; so an
# ``owner/name`` id, with or without ``hf://``.
_DATASET_RE = re.compile(r"^(hf://)?[\w.-]+/[\w.-]+$", re.ASCII)
_DATASET_CHECK = _pattern(_DATASET_RE, "a Hugging Face dataset id owner/name such as FiscalNote/billsum, or its URI hf://FiscalNote/billsum")
# Secret names are DNS subdomains (Kubernetes API conventions)
_SECRET_NAME_CHECK = _pattern(re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$", re.ASCII), "the name of a Secret in the jobs' namespace, such as hf-token")


def hf_uri(repo: str) -> str:
    """``hf://<repo id>`` for an id or an ``hf://`` URI (the initializers' STORAGE_URI form)."""
    return repo if repo.startswith(HF_SCHEME) else HF_SCHEME + repo

# flags workloads/builders/trainjobs.py program_args sets: the job's field that sets each, or how the platform sets it
PLATFORM_FLAGS: dict[str, str] = {
    "--epochs": "epochs",
    "--model": "model",
    "--checkpoint-dir": "to the job's directory on the checkpoint volume (trainjobs.checkpointStorage)",
}
# DDP: generated digits (workloads/programs/ddp_mnist.py --synthetic, which the platform passes; a
# stack that also lists --synthetic in extraArgs, as one had to before, keeps working); the job
# never downloads MNIST
DDP_PLATFORM_FLAGS: dict[str, str] = {
    **PLATFORM_FLAGS,
    "--data-dir": "(the DDP job trains on generated digits; it never downloads MNIST)",
}
# FSDP: the dataset and model the Trainer's initializers put on the checkpoint volume
FSDP_PLATFORM_FLAGS: dict[str, str] = {
    **PLATFORM_FLAGS,
    "--dataset-dir": "to the dataset the dataset initializer downloaded (trainjobs.fsdp.dataset)",
    "--model-dir": "to the model the model initializer downloaded (trainjobs.fsdp.model)",
}


def _platform_flag(arg: str, flags: Mapping[str, str] = PLATFORM_FLAGS) -> str | None:
    """The platform flag ``arg`` sets: ``--flag``, ``--flag=value`` or an abbreviation argparse expands."""
    name = arg.split("=", 1)[0]
    if not name.startswith("--") or len(name) < 3:
        return None
    if name in flags:
        return name
    matches = [f for f in flags if f.startswith(name)]
    return matches[0] if len(matches) == 1 else None


RETENTION_MAX_DEFAULT = "720h"  # trainjobs.finishedJobRetentionMax when unset


def retention_seconds(text: str) -> int | None:
    """Seconds of a retention such as ``168h`` or ``1h30m`` (``_DURATION_RE``), None for ``Never``."""
    if text == "Never":
        return None
    return sum(int(n) * {"s": 1, "m": 60, "h": 3600}[u] for n, u in re.findall(r"(\d+)([smh])", text))


class JobBase(Section):
    """What every TrainJob has: nodes, instance type, image, placement, extra arguments.
    ``PLATFORM_FLAGS``: the program's flags the platform sets (refused in ``extraArgs``)."""
    RUNTIME: ClassVar[str]  # the ClusterTrainingRuntime (base name) the job runs on
    PROGRAM: ClassVar[str] = ""  # its program in workloads/programs ("" for user code: trainctl)
    STALL_WATCHDOG: ClassVar[bool] = True  # the program stops on stallTimeoutSeconds (trainlib.Progress)

    PLATFORM_FLAGS: ClassVar[Mapping[str, str]] = PLATFORM_FLAGS
    enabled: Bool = opt(False, "create the TrainJob")
    num_nodes: Int = opt(2, "nodes (pods) in the job", ge=1, le=1000)
    instance_type: str = opt("g5.xlarge", "GPU instance type of each node", check=_IN_CATALOG)
    gpus_per_node: Int | None = opt(None, "GPUs (processes) per node; unset = all GPUs of the type", ge=1)
    image: str | None = opt(None, "training image; unset = the image the stack builds from workloads/Dockerfile into its own ECR repository (docs/images.md)", check=_IMAGE_CHECK)
    availability_zone: str | None = opt(None, "pin the job's nodes to one AZ (an EFA job: efa.availabilityZone)", check=_pattern(AZ_RE, "an AZ name such as us-west-2a"))
    extra_args: list[str] = opt([], "extra command-line arguments for the training program (not the flags the platform sets: --epochs, --checkpoint-dir; DDP: --data-dir; FSDP: --model, --dataset-dir, --model-dir)")
    active_deadline_seconds: Int | None = opt(
        None, "runaway guard: the TrainJob fails (DeadlineExceeded) this many seconds after it starts; unset = no limit (Trainer v2.3.0 only: docs/runbook.md)", ge=1
    )
    termination_grace_seconds: Int | None = opt(
        None, "this job's time from SIGTERM to SIGKILL to finish its step and save (raise it when the program warns that its checkpoint does not fit); unset = trainer.terminationGraceSeconds; the job runs on its runtime's variant with this grace period (<runtime>-grace<N>)", ge=30, le=3600,
    )
    priority: Literal["low", "normal", "high"] = opt("normal", "Kueue priority (WorkloadPriorityClass): a higher one may preempt lower ones within the cohort; the preempted job saves and resumes")
    stall_timeout_seconds: Int = opt(
        1800, "hang guard: a node whose program completes no step for this long stops (exit 124, saying so) and the job restarts (a hung collective holds every GPU of the job); 0 = off", ge=0, le=86400
    )
    env: dict[str, str] = opt(
        {}, "environment variables of the training container (NAME: value), such as NCCL_DEBUG: INFO; not the platform's own (PET_*, TRAINING_*, MASTER_*, NVIDIA_*, ...) and no credentials: those go in secretEnv (docs/env-and-secrets.md)"
    )
    secret_env: dict[str, str] = opt(
        {}, "environment variables read from a Secret of the jobs' namespace (NAME: <secret>/<key>, a secretKeyRef), such as WANDB_API_KEY: wandb/api-key; the stack never holds the value (docs/env-and-secrets.md)"
    )

    @classmethod
    def platform_flag_of(cls, arg: str) -> str | None:
        """The flag the platform sets that ``arg`` names (abbreviations included), if any."""
        return _platform_flag(arg, cls.PLATFORM_FLAGS)

    def problems(self, path: str) -> Iterator[ConfigError]:
        # independent rules, each on its own: one that reads a value which failed its check stops alone (schema.known)
        yield from known(self._env_problems(path))
        yield from known(self._gpu_problems(path))
        yield from known(self._image_problems(path))
        yield from known(self._args_problems(path))

    def _env_problems(self, path: str) -> Iterator[ConfigError]:
        for which, name, why in job_env.problems(self.env, self.secret_env):  # no value shown: it may be a secret
            yield ConfigError(f"{path}.{which}.{name}", UNSHOWN, why)

    def _gpu_problems(self, path: str) -> Iterator[ConfigError]:
        if self.gpus_per_node is not None and self.instance_type in catalog.catalog():
            gpus = catalog.lookup(self.instance_type).gpus
            if not 1 <= self.gpus_per_node <= gpus:
                yield ConfigError(f"{path}.gpusPerNode", self.gpus_per_node, f"allowed: 1 to {gpus} ({self.instance_type} has {gpus} GPUs)")

    def _image_problems(self, path: str) -> Iterator[ConfigError]:
        if self.image is not None and (self.image.endswith(":latest") or ":" not in self.image.rsplit("/", 1)[-1]):
            yield ConfigError(f"{path}.image", self.image, "allowed: an image with a pinned tag or digest (not latest)")

    def _args_problems(self, path: str) -> Iterator[ConfigError]:
        for i, arg in enumerate(self.extra_args):
            flag = _platform_flag(arg, self.PLATFORM_FLAGS)
            if flag is None:
                continue
            name = arg.split("=", 1)[0]
            what = flag if name == flag else f"{name} (argparse reads it as {flag})"
            setter = self.PLATFORM_FLAGS[flag]
            if setter in type(self).model_fields:
                how = f"from {path}.{camel(setter)}; allowed: other flags of the training program (set {path}.{camel(setter)} instead)"
            elif flag == "--model":
                how = "(FSDP jobs: from trainjobs.fsdp.model); allowed: other flags of the training program"
            else:
                how = f"{setter}; allowed: other flags of the training program"
            yield ConfigError(f"{path}.extraArgs[{i}]", arg, f"{what} is set by the platform {how}")


class JobSettings(JobBase):
    """A training job; :class:`DdpJobSettings`, :class:`FsdpJobSettings` and
    :class:`TfJobSettings` change defaults and descriptions (and FSDP adds ``model`` and ``dataset``)."""

    epochs: Int = opt(3, "training epochs", ge=1, le=10000)


class DdpJobSettings(JobSettings):
    """MNIST-shaped classification on generated digits (``--synthetic``): the job needs no
    download at all, so it runs on the runtime without initializers. (MNIST on the hub is
    PNG images inside parquet, which would need an image decoder in the training image.)"""
    RUNTIME: ClassVar[str] = TORCH_RUNTIME
    PROGRAM: ClassVar[str] = "ddp_mnist.py"

    PLATFORM_FLAGS: ClassVar[Mapping[str, str]] = DDP_PLATFORM_FLAGS
    enabled: Bool = opt(False, "create the DDP (MNIST) TrainJob")


class FsdpJobSettings(JobSettings):
    RUNTIME: ClassVar[str] = TORCH_HF_RUNTIME
    PROGRAM: ClassVar[str] = "fsdp_t5.py"
    enabled: Bool = opt(False, "create the FSDP (T5) TrainJob")
    instance_type: str = opt("g5.12xlarge", "GPU instance type of each node", check=_IN_CATALOG)
    epochs: Int = opt(1, "training epochs", ge=1, le=10000)
    PLATFORM_FLAGS: ClassVar[Mapping[str, str]] = FSDP_PLATFORM_FLAGS
    model: str = opt("google-t5/t5-large", "Hugging Face model id to fine-tune; the Trainer's model initializer downloads hf://<model> before the job starts", check=_MODEL_CHECK)
    dataset: str = opt(
        "FiscalNote/billsum",
        "Hugging Face dataset (owner/name or hf://owner/name) the Trainer's dataset initializer downloads before the job starts; parquet or JSON lines with text and summary columns",
        check=_DATASET_CHECK,
    )

    download_gib: Int = opt(
        16,
        "estimated GiB the initializers download (the model repository and the dataset); sizes the time an admitted job may take to start (kueue.podsReadyTimeout): the default covers t5-large's repository with every weight format",
        ge=1, le=100_000,
    )

    def dataset_uri(self) -> str:
        return hf_uri(self.dataset)

    def model_uri(self) -> str:
        return hf_uri(self.model)


class TfJobSettings(JobSettings):
    """TensorFlow MultiWorkerMirroredStrategy MNIST on the tensorflow-distributed runtime: one
    TensorFlow worker per node driving all the node's GPUs."""
    RUNTIME: ClassVar[str] = TF_RUNTIME
    PROGRAM: ClassVar[str] = "tf_mnist.py"
    STALL_WATCHDOG: ClassVar[bool] = False  # tf_mnist.py has none

    PLATFORM_FLAGS: ClassVar[Mapping[str, str]] = {f: PLATFORM_FLAGS[f] for f in ("--epochs", "--checkpoint-dir")}
    enabled: Bool = opt(False, "create the TensorFlow (MNIST, MultiWorkerMirroredStrategy) TrainJob")
    gpus_per_node: Int | None = opt(None, "GPUs per node (one TensorFlow worker per node uses them all); unset = all GPUs of the type", ge=1)
    image: str | None = opt(versions.TENSORFLOW_RUNTIME_IMAGE, "TensorFlow image (the program needs only TensorFlow); unset: the stack's ECR copy of this pinned image (the tensorflow-distributed runtime's), made at deploy: the nodes never pull from Docker Hub", check=_IMAGE_CHECK)
    extra_args: list[str] = opt([], "extra command-line arguments for tf_mnist.py (not the flags the platform sets: --epochs, --checkpoint-dir)")

    def problems(self, path: str) -> Iterator[ConfigError]:
        yield from super().problems(path)
        if self.image is None:  # the stack's own image is a PyTorch image
            yield ConfigError(f"{path}.image", None, "allowed: a TensorFlow image with a pinned tag or digest (the stack's built image has no TensorFlow)")


class NcclCheckSettings(JobBase):
    """The all-reduce bandwidth check (workloads/programs/allreduce_check.py): fails (exit 3, not
    retried) when the bus bandwidth at its largest message size is below the pass mark."""
    RUNTIME: ClassVar[str] = TORCH_RUNTIME
    PROGRAM: ClassVar[str] = "allreduce_check.py"
    STALL_WATCHDOG: ClassVar[bool] = False  # allreduce_check.py has none

    PLATFORM_FLAGS: ClassVar[Mapping[str, str]] = {"--min-busbw-gbps": "min_bus_bw_g_bps"}
    enabled: Bool = opt(False, "create the all-reduce bandwidth check TrainJob (run it before big jobs)")
    num_nodes: Int = opt(2, "nodes (pods) the all-reduce spans (at least 2: the check is of the network between nodes)", ge=2, le=1000)
    instance_type: str = opt("p5.48xlarge", "GPU instance type of each node", check=_IN_CATALOG)
    min_bus_bw_g_bps: Float | None = opt(
        None,
        "pass mark: bus bandwidth (GB/s, as nccl-tests' busbw) the all-reduce must reach at its largest message size; unset = the GPU catalog's figure for the type (p5.48xlarge: 400)",
        check=SchemaCheck(lambda v: None if v >= 0 else "allowed: a bandwidth in GB/s >= 0", {"minimum": 0}),
    )
    extra_args: list[str] = opt([], "extra command-line arguments for allreduce_check.py such as --max-bytes 4G (not --min-busbw-gbps: set minBusBwGBps)")

    def problems(self, path: str) -> Iterator[ConfigError]:
        yield from super().problems(path)
        if self.enabled and self.min_bus_bw_g_bps is None and self.instance_type in catalog.catalog() and self.pass_mark_gbps() is None:
            known = ", ".join(f"{n} ({i.min_allreduce_busbw_gbps:g})" for n, i in catalog.catalog().items() if i.min_allreduce_busbw_gbps is not None)
            yield ConfigError(
                f"{path}.minBusBwGBps", None,
                f"required for {self.instance_type}: the GPU catalog has no published all-reduce figure for it (it has: {known}); allowed: a bus bandwidth in GB/s such as 50",
            )

    def pass_mark_gbps(self) -> float | None:
        """The configured pass mark, else the catalog's figure for the instance type."""
        if self.min_bus_bw_g_bps is not None:
            return self.min_bus_bw_g_bps
        return catalog.lookup(self.instance_type).min_allreduce_busbw_gbps


class CheckpointStorageSettings(Section):
    type: Literal["fsx", "efs"] = opt("fsx", "durable RWX checkpoint volume")
    capacity_gib: Int = opt(1200, "FSx for Lustre capacity (1200 or a multiple of 2400)", check=lambda v: None if v == 1200 or (v > 0 and v % 2400 == 0) else "allowed: 1200 or a multiple of 2400")
    throughput_per_tib: Int = opt(250, "FSx PERSISTENT_2 throughput per TiB (MB/s)", choices=(125, 250, 500, 1000))
    backup_retention_days: Int = opt(
        7, "daily automatic backups of the checkpoint file system, kept this many days (FSx automaticBackupRetentionDays, at most 90; EFS: AWS Backup's daily plan, kept 35 days, on when not 0); FSx also keeps a final backup when the file system is deleted", ge=0, le=90
    )
    protect: Bool = opt(False, "Pulumi refuses to delete or replace the checkpoint file system (resource protection) until this is turned off")


def system_namespaces() -> dict[str, str]:
    """Namespaces TrainJobs may not use, and what runs there."""
    reserved = {"kube-system": "Kubernetes system components", "kube-public": "cluster-wide public data", "kube-node-lease": "node heartbeats", "default": "the namespace of everything unplaced"}
    reserved[KARPENTER_NAMESPACE] = (reserved.get(KARPENTER_NAMESPACE, "") + " and Karpenter").removeprefix(" and ")
    reserved[TRAINER_NAMESPACE] = "the Kubeflow Trainer controller"
    reserved[KUEUE_NAMESPACE] = "the Kueue controller"
    reserved[STORAGE_NAMESPACE] = "the job that creates the teams' checkpoint directories"
    reserved[AGENT_NAMESPACE] = "the CloudWatch agent and Fluent Bit (observability add-on)"
    reserved[MONITORING_NAMESPACE] = "Prometheus, Grafana and dcgm-exporter (observability.mode prometheus)"
    reserved[OPS_NAMESPACE] = "the GPU smoke check and the finished-TrainJob cleanup"
    reserved[PORTAL_NAMESPACE] = "the teams' portal (portal.enabled)"
    return reserved


class TrainJobsSettings(Section):
    namespace: str = opt("training", "namespace for TrainJobs, code and checkpoints (not a system namespace)", check=_pattern(DNS_LABEL_RE, "a DNS label such as training"))
    checkpoint_storage: CheckpointStorageSettings = opt(CheckpointStorageSettings(), "checkpoint volume")
    ddp: DdpJobSettings = opt(DdpJobSettings(), "DDP MNIST job")
    fsdp: FsdpJobSettings = opt(FsdpJobSettings(), "FSDP T5 job")
    tf: TfJobSettings = opt(TfJobSettings(), "TensorFlow MNIST job")
    nccl_check: NcclCheckSettings = opt(NcclCheckSettings(), "all-reduce bandwidth check")
    hf_token_secret: str | None = opt(
        None,
        "name of a Secret in the jobs' namespace holding a Hugging Face token under the key ACCESS_TOKEN (for gated or private repos); the initializers get it as a secretRef, the stack never holds the token",
        check=_SECRET_NAME_CHECK,
    )
    finished_job_retention: str = opt(
        "168h",
        "finished (Complete or Failed) TrainJobs that the stack does not manage (trainctl's, the teams') are deleted this long after they finish, by a CronJob every 10 minutes; Never keeps them "
        "(unless a job asks for less: finishedJobRetentionMax)",
        check=_pattern(_DURATION_RE, "Never or a duration such as 168h or 30m"),
    )
    finished_job_retention_max: str | None = opt(
        None,
        "the longest a job may ask to be kept after it finishes (trainctl submit --ttl, the portal's ttl_seconds_after_finished), instead of finishedJobRetention; its checkpoints stay; "
        f"Never: no limit; unset: {RETENTION_MAX_DEFAULT}, or finishedJobRetention where that is longer",
        check=_pattern(_DURATION_RE, "Never or a duration such as 720h"),
    )

    def problems(self, path: str) -> Iterator[ConfigError]:
        default = retention_seconds(self.finished_job_retention)
        most = retention_seconds(self.finished_job_retention_max) if self.finished_job_retention_max is not None else None
        if most is not None and default is not None and default > most:  # Never by default: jobs that ask are still held to the maximum
            yield ConfigError(f"{path}.finishedJobRetention", self.finished_job_retention, f"longer than finishedJobRetentionMax ({self.finished_job_retention_max}); allowed: at most that")
        reserved = system_namespaces()
        if self.namespace in reserved:
            yield ConfigError(f"{path}.namespace", self.namespace, f"a system namespace ({reserved[self.namespace]}); allowed: a namespace of the platform's own such as training, not {', '.join(sorted(reserved))}")

    def retention_max(self) -> str:
        """``finishedJobRetentionMax`` as it applies: as set, else the default or, when longer (or
        Never), ``finishedJobRetention`` (a stack that kept jobs longer keeps its meaning)."""
        if self.finished_job_retention_max is not None:
            return self.finished_job_retention_max
        default = retention_seconds(self.finished_job_retention)
        return self.finished_job_retention if default is None or default > retention_seconds(RETENTION_MAX_DEFAULT) else RETENTION_MAX_DEFAULT  # type: ignore[operator]

    def jobs_by_key(self) -> dict[str, JobBase]:
        """Every job, enabled or not, by config key (ddp, fsdp, tf, ncclCheck)."""
        return {"ddp": self.ddp, "fsdp": self.fsdp, "tf": self.tf, "ncclCheck": self.nccl_check}

    def jobs(self) -> dict[str, JobBase]:
        """The enabled jobs by config key (ddp, fsdp, tf, ncclCheck)."""
        return {name: job for name, job in self.jobs_by_key().items() if job.enabled}


