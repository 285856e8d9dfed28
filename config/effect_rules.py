"""Rules that keep every key meaningful, across sections:

* a key set where it does nothing in this stack (a Kueue key with Kueue off, an FSx key with EFS,
  an alarm receiver with no topic) is refused with the reason, never silently ignored;
* a guard that could not guard (a watchdog the program does not have, a deadline shorter than
  the start the stack itself allows, an alarm window the alarm cannot express) is refused;
* values that would break jobs only at run time (flags the program's own parser refuses, a quota
  below one node's pod, a team without the runtime it submits to) are refused at render.

A key counts as set when the stack file names it (pydantic's ``model_fields_set``): defaults of
keys that do not apply are harmless and stay quiet.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from config import catalog
from config.checks import cpu_cores, quantity_bytes
from config.infra_models import TORCH_RUNTIME, ClusterSettings, EfaSettings, GpuPoolSettings, NetworkSettings, TrainerSettings
from config.job_models import JobBase, TrainJobsSettings, system_namespaces
from config.program_flags import argument_problems
from config.schema import UNSHOWN, ConfigError, known, looks_secret
from config.team_models import KueueSettings, ObservabilitySettings, SmokeChecksSettings, TenantsSettings


class Settings(Protocol):
    """What these rules read of config.settings.Settings (which runs them: no import back)."""

    trainjobs: TrainJobsSettings
    tenants: TenantsSettings
    kueue: KueueSettings
    observability: ObservabilitySettings
    gpu_pool: GpuPoolSettings
    trainer: TrainerSettings
    network: NetworkSettings
    cluster: ClusterSettings
    efa: EfaSettings
    smoke_checks: SmokeChecksSettings

    @property
    def kueue_enabled(self) -> bool: ...

    def start_minutes_needed(self) -> int: ...

# The alarm on idle GPUs averages GPU utilization over 10-minute periods (infra/alarms.py
# alarm_specs: period 600 s, evaluationPeriods = idleMinutes / 10).
IDLE_ALARM_PERIOD_MINUTES = 10
# Below this a hang guard fires on a healthy job: the first step waits for the NCCL/gloo
# rendezvous and communicator set-up of every node, and a blocking checkpoint save of a large
# model (the FSDP job's, on a shared file system) can take minutes without a completed step.
SMALLEST_STALL_TIMEOUT = 300
# What `trainctl submit` runs on unless told otherwise (trainctl/objects.py RUNTIMES["torch"]).
TEAM_DEFAULT_RUNTIME = TORCH_RUNTIME
# Kubernetes reserves the kube- prefix for its own namespaces (Kubernetes docs, "Namespaces":
# "Avoid creating namespaces with the prefix kube-, since it is reserved for Kubernetes system
# namespaces").
RESERVED_NAMESPACE_PREFIX = "kube-"


def _set(section, name: str) -> bool:
    return name in section.model_fields_set


def kueue_off_rules(s: Settings) -> Iterator[ConfigError]:
    """Priorities, the start timeout and requeues are Kueue's: with Kueue off they do nothing."""
    if s.kueue_enabled:
        return
    why = KUEUE_OFF
    for name, job in s.trainjobs.jobs_by_key().items():
        yield from job_priority_problems(f"trainjobs.{name}", job, kueue_enabled=False)
    for key in ("pods_ready_timeout", "requeue_limit"):
        if _set(s.kueue, key):
            yield ConfigError(f"kueue.{'podsReadyTimeout' if key == 'pods_ready_timeout' else 'requeueLimit'}", getattr(s.kueue, key), why)
    for team, t in s.tenants.teams().items():
        if _set(t, "default_priority"):
            yield ConfigError(f"tenants.{team}.defaultPriority", t.default_priority, why)


KUEUE_OFF = "Kueue is off in this stack (kueue.enabled false, or no tenants), and this is a Kueue setting that would do nothing; allowed: unset, or turn Kueue on (kueue.enabled: true, Trainer v2.3.0)"


def job_priority_problems(key: str, job: JobBase, *, kueue_enabled: bool) -> Iterator[ConfigError]:
    """A priority set on a job (config key ``key``) of a platform without Kueue: the platform's jobs
    and a TrainJob stack's run (workloads/builders/job_platform.py) alike."""
    if not kueue_enabled and _set(job, "priority"):
        yield ConfigError(f"{key}.priority", job.priority, KUEUE_OFF)


# EFS backups are AWS Backup's default plan: daily, kept 35 days, nothing to configure but on/off
# (EFS User Guide, "Automatic backups": "the default backup plan ... retention of 35 days").
EFS_BACKUP_DAYS = 35


def storage_rules(s: Settings) -> Iterator[ConfigError]:
    cfg = s.trainjobs.checkpoint_storage
    if cfg.type != "efs":
        return
    for key, camel in (("capacity_gib", "capacityGib"), ("throughput_per_tib", "throughputPerTib")):
        if _set(cfg, key):
            yield ConfigError(f"trainjobs.checkpointStorage.{camel}", getattr(cfg, key), "an FSx for Lustre setting; EFS grows with its data and bursts its throughput; allowed: unset with type efs")
    if _set(cfg, "backup_retention_days") and cfg.backup_retention_days not in (0, EFS_BACKUP_DAYS):
        yield ConfigError(
            "trainjobs.checkpointStorage.backupRetentionDays", cfg.backup_retention_days,
            f"EFS's automatic backups (AWS Backup's default plan) are kept {EFS_BACKUP_DAYS} days whatever this says; allowed with type efs: 0 (off), {EFS_BACKUP_DAYS} or unset (on)",
        )


def observability_rules(s: Settings) -> Iterator[ConfigError]:
    o = s.observability
    mode = o.mode
    if mode != "cloudwatch" and _set(o, "log_retention_days"):
        yield ConfigError("observability.logRetentionDays", o.log_retention_days, f"observability.mode {mode} keeps no CloudWatch log groups; allowed: unset, or mode cloudwatch")
    a = o.alarms
    if mode == "none":
        for key, camel in (("enabled", "enabled"), ("emails", "emails"), ("https_endpoints", "httpsEndpoints"), ("idle_gpu_percent", "idleGpuPercent"), ("idle_minutes", "idleMinutes")):
            if _set(a, key) and (key != "enabled" or a.enabled):
                yield ConfigError(f"observability.alarms.{camel}", getattr(a, key), "observability.mode none has no alarms; allowed: unset, or mode cloudwatch or prometheus")
    elif not a.enabled:  # no topic, no alarms, no alert rules (__main__.py, k8s/prometheus.py)
        for key, camel in (("emails", "emails"), ("https_endpoints", "httpsEndpoints"), ("idle_gpu_percent", "idleGpuPercent"), ("idle_minutes", "idleMinutes")):
            if _set(a, key):
                yield ConfigError(f"observability.alarms.{camel}", getattr(a, key), "observability.alarms.enabled is false, so this would do nothing; allowed: unset, or alarms.enabled true")
    elif mode == "prometheus":
        for key, camel in (("emails", "emails"), ("https_endpoints", "httpsEndpoints")):
            if getattr(a, key):
                yield ConfigError(
                    f"observability.alarms.{camel}", getattr(a, key),
                    "observability.mode prometheus raises alert rules in Prometheus and has no SNS topic to subscribe to, so nobody would be told; allowed: unset (route the alerts with Alertmanager), or mode cloudwatch",
                )
    if a.idle_minutes % IDLE_ALARM_PERIOD_MINUTES:
        yield ConfigError(
            "observability.alarms.idleMinutes", a.idle_minutes,
            f"the idle-GPU alarm averages {IDLE_ALARM_PERIOD_MINUTES}-minute periods, so this would act as {a.idle_minutes // IDLE_ALARM_PERIOD_MINUTES * IDLE_ALARM_PERIOD_MINUTES}; allowed: a multiple of {IDLE_ALARM_PERIOD_MINUTES}",
        )
    for key, camel, fold in (("emails", "emails", str.lower), ("https_endpoints", "httpsEndpoints", _url_fold)):
        seen: set[str] = set()
        for i, value in enumerate(getattr(a, key)):
            if fold(value) in seen:
                yield ConfigError(f"observability.alarms.{camel}[{i}]", value, "listed twice (one subscription each); allowed: each once")
            seen.add(fold(value))


def _url_fold(url: str) -> str:
    """A URL as the same endpoint compares: scheme and host case-insensitive (RFC 3986 6.2.2.1)."""
    scheme, _, rest = url.partition("://")
    authority, slash, path = rest.partition("/")
    userinfo, at, host = authority.rpartition("@")
    return f"{scheme.lower()}://{userinfo}{at}{host.lower()}{slash}{path}"


def job_guard_rules(s: Settings) -> Iterator[ConfigError]:
    start_s = 60 * s.start_minutes_needed()
    for name, job in s.trainjobs.jobs_by_key().items():
        yield from job_guard_problems(f"trainjobs.{name}", job, start_s)


def job_guard_problems(key: str, job: JobBase, start_s: int) -> Iterator[ConfigError]:
    """A hang guard the program lacks or that fires on a healthy job; a deadline shorter than the
    ``start_s`` seconds the platform allows a job to start."""
    if _set(job, "stall_timeout_seconds"):
        if not type(job).STALL_WATCHDOG:
            yield ConfigError(f"{key}.stallTimeoutSeconds", job.stall_timeout_seconds, f"{type(job).PROGRAM} has no stall watchdog, so this would guard nothing; allowed: unset")
        elif 0 < job.stall_timeout_seconds < SMALLEST_STALL_TIMEOUT:
            yield ConfigError(
                f"{key}.stallTimeoutSeconds", job.stall_timeout_seconds,
                f"shorter than a healthy job's first rendezvous or a checkpoint save, which complete no step; allowed: 0 (off) or at least {SMALLEST_STALL_TIMEOUT}",
            )
    deadline = job.active_deadline_seconds
    if job.enabled and deadline is not None and type(job).STALL_WATCHDOG and _set(job, "stall_timeout_seconds") and job.stall_timeout_seconds >= deadline:
        yield ConfigError(
            f"{key}.stallTimeoutSeconds", job.stall_timeout_seconds,
            f"not shorter than the job's activeDeadlineSeconds ({deadline}), which ends the job first, so the hang guard could never act; allowed: 0 (off) or less than {deadline}",
        )
    if job.enabled and deadline is not None and deadline < start_s:
        yield ConfigError(
            f"{key}.activeDeadlineSeconds", deadline,
            f"shorter than the {start_s} s this stack allows a job to start (a GPU node's launch and the downloads: kueue.podsReadyTimeout), so the job could fail before it trains; allowed: at least {start_s}",
        )


def extra_args_rules(s: Settings) -> Iterator[ConfigError]:
    """``extraArgs`` judged by the program's own parser (config/program_flags.py); secret-looking
    values are refused: they would sit in plain text in the TrainJob and the state."""
    for name, job in s.trainjobs.jobs_by_key().items():
        if job.enabled:
            yield from job_args_problems(f"trainjobs.{name}", job)


def job_args_problems(path: str, job: JobBase) -> Iterator[ConfigError]:
    """``extraArgs`` of one job (config key ``path``) judged by its program's parser; secrets refused."""
    if job.extra_args:
        key = f"{path}.extraArgs"
        secret = [i for i, arg in enumerate(job.extra_args) if looks_secret("extraArgs", arg) or (i > 0 and job.extra_args[i - 1].startswith("-") and looks_secret(job.extra_args[i - 1].lstrip("-"), arg))]
        for i in secret:
            yield ConfigError(
                f"{key}[{i}]", job.extra_args[max(0, i - 1) : i + 1],  # with the flag before it, which may be what says "secret": never printed
                "looks like a credential, which would be stored in plain text in the TrainJob and the stack's state; allowed: a Secret reference (trainjobs.hfTokenSecret for a Hugging Face token) or a value that is no credential",
            )
        platform = {i for i, arg in enumerate(job.extra_args) if type(job).platform_flag_of(arg)}
        for i, problem in argument_problems(type(job).PROGRAM, list(job.extra_args)):
            if i not in platform and i not in secret:
                flag = job.extra_args[i].partition("=")[0]
                yield ConfigError(f"{key}[{i}]", flag if flag.startswith("--") else UNSHOWN, problem)  # a flag's name, never a value


def runtime_rules(s: Settings) -> Iterator[ConfigError]:
    teams = s.tenants.teams()
    if teams and "runtimes" in s.trainer.model_fields_set and TEAM_DEFAULT_RUNTIME not in s.trainer.runtimes:
        yield ConfigError(
            "trainer.runtimes", s.trainer.runtimes, f"the teams submit to {TEAM_DEFAULT_RUNTIME} (trainctl's default runtime), which this list leaves out; allowed: a list with {TEAM_DEFAULT_RUNTIME}",
        )
    ns = s.trainjobs.namespace
    if ns.startswith(RESERVED_NAMESPACE_PREFIX) and ns not in system_namespaces():
        yield ConfigError("trainjobs.namespace", ns, f"the {RESERVED_NAMESPACE_PREFIX} prefix is reserved for Kubernetes' own namespaces; allowed: a namespace of the platform's own such as training")
    for team, t in teams.items():
        ns = s.tenants.namespace_of(team)
        if ns.startswith(RESERVED_NAMESPACE_PREFIX) and ns not in system_namespaces():  # (those: settings._tenant_rules)
            yield ConfigError(f"tenants.{team}.namespace" if t.namespace else f"tenants.{team}", ns, f"the {RESERVED_NAMESPACE_PREFIX} prefix is reserved for Kubernetes' own namespaces; allowed: a namespace of the team's own (set tenants.{team}.namespace)")


def quota_rules(s: Settings) -> Iterator[ConfigError]:
    """A team's CPU and memory quotas below what one node's pod requests (the pools' smallest GPU
    node, one GPU): without Kueue they are its namespace's ResourceQuota, so no job of the team can
    ever start; with Kueue they are its ClusterQueue's nominal quota in each pool, so its guarantee
    can never be used (a job would start only by borrowing what other teams leave idle)."""
    types = s.gpu_pool.allowed_types()
    if not types:
        return
    smallest = min((catalog.node_pod_request(t, 1) for t in types), key=lambda r: (r[1], r[0]))
    cpu, memory_gib = smallest
    why = "so the team's guaranteed quota could never run a job (it would start only by borrowing idle capacity)" if s.kueue_enabled else "so no job of the team could start"
    for team, t in s.tenants.teams().items():
        if t.memory_quota and quantity_bytes(t.memory_quota) < memory_gib * 2**30:
            yield ConfigError(f"tenants.{team}.memoryQuota", t.memory_quota, f"below the {memory_gib}Gi one node's pod requests (the pool's smallest GPU node, one GPU), {why}; allowed: at least {memory_gib}Gi")
        if t.cpu_quota and cpu_cores(t.cpu_quota) < cpu:
            yield ConfigError(f"tenants.{team}.cpuQuota", t.cpu_quota, f"below the {cpu} CPUs one node's pod requests (the pool's smallest GPU node, one GPU), {why}; allowed: at least {cpu}")


def unused_section_rules(s: Settings) -> Iterator[ConfigError]:
    """Keys of a feature that is off, or of a path the stack does not take, do nothing."""
    if not s.smoke_checks.enabled and _set(s.smoke_checks, "instance_type"):
        yield ConfigError("smokeChecks.instanceType", s.smoke_checks.instance_type, "smokeChecks.enabled is false, so no check runs; allowed: unset, or smokeChecks.enabled true")
    if not s.efa.enabled:
        for key, camel in (("availability_zone", "availabilityZone"), ("instance_types", "instanceTypes")):
            if _set(s.efa, key):
                yield ConfigError(f"efa.{camel}", getattr(s.efa, key), "efa.enabled is false, so there is no EFA pool; allowed: unset, or efa.enabled true")
    if not s.network.create_vpc:  # only a VPC the stack creates reads them (infra/network.py)
        for key, camel in (("cidr", "cidr"), ("az_count", "azCount"), ("nat_gateways", "natGateways"), ("flow_log_retention_days", "flowLogRetentionDays")):
            if _set(s.network, key):
                yield ConfigError(f"network.{camel}", getattr(s.network, key), "network.vpcId names an existing VPC, and this applies only to a VPC the stack creates; allowed: unset with vpcId")
    if not s.cluster.endpoint_public_access and _set(s.cluster, "allow_public_access_from_anywhere") and s.cluster.allow_public_access_from_anywhere:
        yield ConfigError("cluster.allowPublicAccessFromAnywhere", True, "cluster.endpointPublicAccess is false, so there is no public endpoint to open; allowed: unset, or endpointPublicAccess true")


RULES = (unused_section_rules, kueue_off_rules, storage_rules, observability_rules, job_guard_rules, extra_args_rules, runtime_rules, quota_rules)


def all_problems(s: Settings) -> Iterator[ConfigError]:
    for rule in RULES:  # each on its own: one that reads a value which failed its check stops alone
        yield from known(rule(s))


# Amazon EC2 User Guide, "Spot Instance interruption notices": the notice comes two minutes before
# Amazon EC2 stops or terminates the instance. Karpenter (karpenter-provider-aws v1.14.1
# pkg/controllers/interruption: CordonAndDrain) deletes the NodeClaim on the notice, but its drain
# evicts only pods without an active karpenter.sh/do-not-disrupt (karpenter v1.14.1
# pkg/utils/pod/scheduling.go IsEvictable, node/termination/terminator), and every training pod
# carries it (k8s/builders/runtimes.py DO_NOT_DISRUPT); the NodeClaim's terminationGracePeriod
# (k8s/builders/gpu_objects.py) is far beyond the notice. So no grace period applies on spot.
SPOT_NOTICE_S = 120


def spot_advice(s: Settings) -> list[str]:
    """What is kept but said (a render warning, never a refusal): with spot in the GPU pools'
    capacity types, an interruption ends a training pod without its grace period."""
    if "spot" not in s.gpu_pool.capacity_types:
        return []
    return [
        f"gpuPool.capacityTypes includes spot: a spot interruption ends the node {SPOT_NOTICE_S} s after its notice, and Karpenter's drain skips "
        "training pods (they carry karpenter.sh/do-not-disrupt), so they get no grace period to save: the job restarts from its last "
        "checkpoint and the steps since are lost (checkpoint often, or leave spot out)"
    ]
