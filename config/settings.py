"""Typed, validated stack settings: the only place stack config becomes Python values.

``load_settings(raw, stack=..., region=...)`` takes the project's config as a mapping of
top-level key (without the ``training-platform:`` prefix) to value and returns :class:`Settings`,
or raises one :class:`~config.schema.ConfigErrors` that lists every problem (one line each)
before anything is registered. Components receive these objects; none of them reads config.

The settings classes are frozen pydantic models (:class:`~config.schema.Section`): the
same classes give the config reference in docs/reference.md (``tools/config_docs.py``) and the editors'
JSON Schema of a stack file (``tools/config_json_schema.py``).
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any, cast

from pydantic import Field

from config import aws_facts, catalog, effect_rules
from config.checks import (  # noqa: F401
    _ARN_PRINCIPAL_RE,
    _CLUSTER_NAME_RE,
    _DURATION_RE,
    _FLOW_LOG_RETENTION,
    _IN_CATALOG,
    _INSTANCE_TYPE_RE,
    _K8S_QUANTITY_RE,
    _KMS_ARN_RE,
    _PRINCIPAL_ARNS,
    _QUANTITY_FACTORS,
    _STS_SESSION_RE,
    _SUBNET_ID,
    AZ_RE,
    DNS_LABEL_RE,
    SMALLEST_SHM,
    WIDEST_PUBLIC_CIDR,
    _cidr,
    _cidr_list,
    _in_catalog,
    _instance_type,
    _pattern,
    _principal_arns,
    _public_cidr,
    _quantity,
    _range,
    _shm_size,
    _unique,
    is_graviton,
    quantity_bytes,
    regional_arn_problems,
    too_open,
)
from config.efa import efa_layouts, efa_pool_of
from config.infra_models import (  # noqa: F401
    _ACCOUNT_ID_RE,
    _CAPACITY_RESERVATION_ID_RE,
    RUNTIME_NAMES,
    SMALLEST_PRIVATE_SUBNET_PREFIX,
    SMALLEST_SUBNET_PREFIX,
    TF_RUNTIME,
    TORCH_HF_RUNTIME,
    TORCH_RUNTIME,
    ArmNodeGroupSettings,
    CapacityReservationSelectorTerm,
    ClusterSettings,
    EfaSettings,
    GpuPoolSettings,
    NetworkSettings,
    NodeGroupSettings,
    NodeGroupsSettings,
    TrainerSettings,
    X86NodeGroupSettings,
    subnet_plan,
)
from config.job_models import (  # noqa: F401
    _DATASET_CHECK,
    _DATASET_RE,
    _IMAGE_CHECK,
    _MODEL_CHECK,
    _SECRET_NAME_CHECK,
    DDP_PLATFORM_FLAGS,
    FSDP_PLATFORM_FLAGS,
    HF_SCHEME,
    PLATFORM_FLAGS,
    CheckpointStorageSettings,
    DdpJobSettings,
    FsdpJobSettings,
    JobBase,
    JobSettings,
    NcclCheckSettings,
    TfJobSettings,
    TrainJobsSettings,
    _platform_flag,
    hf_uri,
    system_namespaces,
)
from config.portal_models import PortalSettings, plain_secret_problems, portal_rules
from config.schema import UNSHOWN, ConfigError, ConfigErrors, Section, known, problems_of, repaired_section, unknown_key_hint, validate_section
from config.team_models import DOWNLOAD_MIB_PER_S, LOG_RETENTION_DAYS, NODE_LAUNCH_MINUTES, KueueSettings, ObservabilitySettings, SmokeChecksSettings, TenantSettings, TenantsSettings, duration_seconds  # noqa: F401

# --- the whole stack -------------------------------------------------------------------------


class StackConfig(Section):
    """Everything under ``training-platform:`` in a stack file, one field per top-level key."""

    network: NetworkSettings = Field(default_factory=NetworkSettings, description="VPC and subnets")
    cluster: ClusterSettings = Field(default_factory=ClusterSettings, description="EKS cluster")
    node_groups: NodeGroupsSettings = Field(default_factory=NodeGroupsSettings, description="managed node groups for system and CPU workloads")
    gpu_pool: GpuPoolSettings = Field(default_factory=GpuPoolSettings, description="GPU capacity (Karpenter NodePool or Auto Mode)")
    efa: EfaSettings = Field(default_factory=EfaSettings, description="EFA networking for multi-node jobs")
    trainer: TrainerSettings = Field(default_factory=TrainerSettings, description="Kubeflow Trainer")
    trainjobs: TrainJobsSettings = Field(default_factory=TrainJobsSettings, description="training jobs and their checkpoint storage")
    tenants: TenantsSettings = Field(default_factory=lambda: TenantsSettings({}), description="teams: a namespace, quotas, network isolation and namespace-scoped access each (map of team name to settings)")
    kueue: KueueSettings = Field(default_factory=KueueSettings, description="Kueue job queueing (quotas with borrowing, all-or-nothing admission)")
    observability: ObservabilitySettings = Field(default_factory=ObservabilitySettings, description="metrics, logs and the dashboard (CloudWatch, Prometheus or none)")
    smoke_checks: SmokeChecksSettings = Field(default_factory=SmokeChecksSettings, description="deploy-time GPU smoke check")
    portal: PortalSettings = Field(default_factory=PortalSettings, description="the teams' portal: web page and API behind an ALB with OIDC login (off by default)")


SECTIONS: dict[str, type[Section]] = {cast(str, f.alias): cast(type[Section], f.annotation) for f in StackConfig.model_fields.values()}
"""Top-level config key -> its settings class, in the order of :class:`StackConfig`."""
_SECTION_ATTR = {cast(str, f.alias): name for name, f in StackConfig.model_fields.items()}


class Settings(StackConfig):
    stack: str
    region: str

    @property
    def cluster_name(self) -> str:
        return self.cluster.name or f"training-platform-{self.stack}"[:100]

    def pinned_zones(self) -> list[str]:
        """Zones the EFA pool and jobs are pinned to: the VPC must span them."""
        zones = [self.efa.availability_zone] if self.efa.enabled and self.efa.availability_zone else []
        zones += [j.availability_zone for j in self.trainjobs.jobs().values() if j.availability_zone]
        return list(dict.fromkeys(zones))

    def training_namespaces(self) -> list[str]:
        """Where training runs: the stack's own jobs' namespace, then every team's."""
        return [self.trainjobs.namespace, *(self.tenants.namespace_of(t) for t in self.tenants.teams())]

    def fact_gaps(self) -> list[str]:
        """What the config checks could not judge in this Region for want of a fact (warned once
        per run, never refused): the Region's, and each GPU type asked for that the table cannot judge there."""
        return aws_facts.gaps(self.region, _gpu_types_wanted(self))

    def start_minutes_needed(self) -> int:
        """Minutes an admitted job of this stack may need before all its pods run: a node's
        launch plus twice its largest download (see NODE_LAUNCH_MINUTES)."""
        return start_minutes_for(self.trainjobs.jobs().values())

    def pods_ready_timeout(self) -> str:
        """kueue.podsReadyTimeout as set, else sized by :meth:`start_minutes_needed`."""
        return self.kueue.pods_ready_timeout or f"{self.start_minutes_needed()}m"

    @property
    def kueue_enabled(self) -> bool:
        """Kueue as configured, else on when teams exist and the Trainer has ``runtimePatches``."""
        if self.kueue.enabled is not None:
            return self.kueue.enabled
        return bool(self.tenants.root) and self.trainer.version not in KUEUE_INCOMPATIBLE_TRAINERS


def start_minutes_for(jobs: Iterable[JobBase]) -> int:
    """Minutes an admitted job among ``jobs`` may need before all its pods run: a node's launch
    plus twice the largest download (see NODE_LAUNCH_MINUTES)."""
    download = max((getattr(j, "download_gib", 0) for j in jobs), default=0)
    return NODE_LAUNCH_MINUTES + math.ceil(2 * download * 1024 / DOWNLOAD_MIB_PER_S / 60)


def load_settings(raw: Mapping[str, Any], *, stack: str, region: str, secret_keys: Collection[str] | None = None) -> Settings:
    """Validate the whole project config; raise one ConfigErrors listing every problem.
    ``secret_keys``: the top-level keys Pulumi holds as secrets (infra/project_config.py
    secret_config_keys); given, a secret in plain text is refused (None: not known, not judged)."""
    # a section given without a value (``portal:``, ``~``) reaches the program as "" from Pulumi
    # (a null config value is the empty text): the empty section, every value at its default
    raw = {k: None if k in SECTIONS and v == "" else v for k, v in raw.items()}
    errors: list[ConfigError] = []
    if secret_keys is not None:
        errors += plain_secret_problems(raw.get("portal"), "portal" in secret_keys)
    is_region = aws_facts.is_region(region or "")
    if not is_region:
        close = difflib.get_close_matches(region or "", aws_facts.all_regions(), n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        errors.append(ConfigError("aws:region", region, f"{hint}allowed: an AWS Region (pulumi_aws.Region), such as us-west-2 or ap-northeast-2; set aws:region in the stack file"))
    facts_for = {None: True, "region": is_region, "zones": aws_facts.is_known_region(region or "")}
    for key in raw:
        if key not in SECTIONS:
            value = raw[key] if isinstance(raw[key], bool | int | float) or raw[key] is None else UNSHOWN  # never judged: not shown
            errors.append(ConfigError(key, value, unknown_key_hint(key, list(SECTIONS))))
    sections: dict[str, Section] = {}
    usable: set[str] = set()
    for key, cls in SECTIONS.items():
        obj, found = validate_section(cls, raw.get(key), key)
        errors += found
        if obj is None and found:
            obj = repaired_section(cls, raw.get(key))  # its invalid values left at their defaults
            if obj is not None:  # the section's own rules on the values that parsed (not on what was reported,
                # nor beside a misspelt key, whose value the rule would miss; a refused value is a Failed marker
                # in the repaired section, which stops any rule that reads it: config/failed.py)
                misspelt = {r.key.rsplit(".", 1)[0] for r in found if r.allowed.startswith("unknown key")}
                errors += [e for e in problems_of(obj, key) if not any(_within(e.key, r.key) for r in found) and e.key.rsplit(".", 1)[0] not in misspelt]
        sections[_SECTION_ATTR[key]] = obj if obj is not None else cls()
        if obj is not None:
            usable.add(key)
    settings = Settings.model_validate({"stack": stack, "region": region, **sections})
    # rules across sections, also beside field errors elsewhere (one run names every problem);
    # a rule's finding on a key already reported (or inside it) is left out (no follow-on errors); one
    # on a key around it is kept: a rule that read the failed value stopped there (config/failed.py, _within)
    reported = [e.key for e in errors]
    for needs, needs_facts, rule in _RULES:
        if set(needs) <= usable and facts_for[needs_facts]:
            # a rule that reads a value which failed its own check stops there (schema.Failed): it
            # never judges that value's default in its place
            errors += [e for e in known(rule(settings)) if not any(_within(e.key, r) for r in reported)]
    if errors:
        raise ConfigErrors(errors)
    return _with_job_runtimes(settings)


def _with_job_runtimes(settings: Settings) -> Settings:
    """``trainer.runtimes`` plus the runtimes the enabled jobs run on: a stack file that lists
    runtimes and enables a job whose runtime it does not list (an FSDP job, which now runs on the
    runtime with initializers) keeps working."""
    needed = [job_runtime(name) for name in settings.trainjobs.jobs()]
    missing = [r for r in dict.fromkeys(needed) if r not in settings.trainer.runtimes]
    if not missing:
        return settings
    trainer = settings.trainer.model_copy(update={"runtimes": [*settings.trainer.runtimes, *missing]})
    return settings.model_copy(update={"trainer": trainer})


def _within(key: str, reported: str) -> bool:
    """``key`` is ``reported``, lies inside it (``a.b[0]`` or ``a.b.c`` in ``a.b``), or is the list
    whose item was reported (``a.b`` for ``a.b[0]``: one key, one line). Not a key around it in
    another way (``a`` for ``a.b[0]``): a rule that read the failed value stopped there."""
    return key == reported or key.startswith(reported + ".") or key.startswith(reported + "[") or re.fullmatch(re.escape(key) + r"(\[\d+\])+", reported) is not None


# --- rules across sections -------------------------------------------------------------------


def _cluster_name_rule(s: Settings) -> Iterator[ConfigError]:
    if s.cluster.name is None and not _CLUSTER_NAME_RE.fullmatch(s.cluster_name):
        yield ConfigError("cluster.name", s.cluster_name, "the default name from the stack name is not a valid EKS name; set cluster.name")


def _arn_rules(s: Settings) -> Iterator[ConfigError]:
    part = aws_facts.partition(s.region)
    for i, arn in enumerate(s.cluster.admin_principal_arns):
        if arn.split(":")[1] != part:
            yield ConfigError(f"cluster.adminPrincipalArns[{i}]", arn, f"allowed: an ARN of the region's partition ({s.region} is in {part}: arn:{part}:iam::...)")
    for key, role in (("previewRoleArn", s.cluster.ci.preview_role_arn), ("deployRoleArn", s.cluster.ci.deploy_role_arn)):
        if role is not None and role.split(":")[1] != part:
            yield ConfigError(f"cluster.ci.{key}", role, f"allowed: an ARN of the region's partition ({s.region} is in {part}: arn:{part}:iam::...)")


def _zone_rules(s: Settings) -> Iterator[ConfigError]:
    region_zones = aws_facts.zones(s.region)
    explicit = s.network.availability_zones
    in_region = f"allowed: a zone of the stack's region {s.region}: {', '.join(region_zones)}"
    for i, zone in enumerate(explicit):
        if zone not in region_zones:
            yield ConfigError(f"network.availabilityZones[{i}]", zone, in_region)
    efa_zone = s.efa.availability_zone if s.efa.enabled else None
    pinned = [("efa.availabilityZone", efa_zone)] + [(f"trainjobs.{n}.availabilityZone", j.availability_zone) for n, j in s.trainjobs.jobs().items()]
    for key, zone in pinned:
        if zone is None:
            continue
        if zone not in region_zones:
            yield ConfigError(key, zone, in_region)
        elif explicit and zone not in explicit:
            yield ConfigError(key, zone, "allowed: one of the cluster's zones (network.availabilityZones): " + ", ".join(explicit))
    for name, job in s.trainjobs.jobs().items():
        yield from job_efa_zone_problems(f"trainjobs.{name}", job, efa_zone, s.efa.instance_types)
    zones = s.pinned_zones()
    if not s.network.create_vpc and zones and not explicit:
        # the given subnets' zones are not known before deploy: nodes pinned to a zone without a
        # subnet would stay Pending, so the zones must be named
        yield ConfigError(
            "network.availabilityZones", [], f"required with network.vpcId when jobs or the EFA pool are pinned to zones ({', '.join(zones)}): the zones of network.privateSubnetIds"
        )
    if s.network.create_vpc and not explicit and len(zones) > s.network.az_count:
        yield ConfigError("network.azCount", s.network.az_count, f"jobs and the EFA pool are pinned to {len(zones)} zones ({', '.join(zones)}); allowed: at least {len(zones)}")


def _job_rules(s: Settings) -> Iterator[ConfigError]:
    pool_types = {i.name for i in s.gpu_pool.allowed_types()}
    if s.efa.enabled:
        pool_types |= set(s.efa.instance_types)
    for name, job in s.trainjobs.jobs().items():
        key = f"trainjobs.{name}"
        limit, limit_key = s.gpu_pool.gpu_limit, "gpuPool.gpuLimit"
        if s.efa.enabled and job.instance_type in s.efa.instance_types:
            # the job's EFA pool holds at least one node of each of its types (k8s.builders.gpu_objects.efa_node_pool)
            efa_types = efa_layouts(s.efa)[efa_pool_of(s.efa, job.instance_type) or ""]
            limit = max(limit, sum(catalog.lookup(t).gpus for t in efa_types))
            limit_key = f"the EFA pool's limit (gpuPool.gpuLimit, at least one node of each of {', '.join(efa_types)})"
        yield from job_capacity_problems(key, job, sorted(pool_types), limit, limit_key)


def job_capacity_problems(key: str, job: JobBase, pool_types: Sequence[str], limit: int, limit_key: str) -> Iterator[ConfigError]:
    """A job (config key ``key``) whose instance type no GPU pool launches, or that needs more GPUs
    than its pool may hold (``limit``, named ``limit_key``): the platform's jobs and a TrainJob
    stack's run (workloads/builders/job_platform.py) are judged by this one rule."""
    if job.instance_type not in pool_types:
        yield ConfigError(f"{key}.instanceType", job.instance_type, "not allowed by the gpu-pool (gpuPool.instanceCategories/instanceFamilies/instanceTypes); allowed: " + ", ".join(sorted(pool_types)))
        return
    gpus = job_gpus_per_node(job)
    if job.num_nodes * gpus > limit:
        yield ConfigError(f"{key}.numNodes", job.num_nodes, f"the job needs {job.num_nodes * gpus} GPUs but {limit_key} is {limit}; allowed: at most {limit // gpus} nodes")


def job_efa_zone_problems(key: str, job: JobBase, efa_zone: str | None, efa_types: Sequence[str]) -> Iterator[ConfigError]:
    """A job in the EFA pool (its type is an EFA type) pinned to another zone than the pool's."""
    if efa_zone is not None and job.instance_type in efa_types and job.availability_zone not in (None, efa_zone):
        yield ConfigError(
            f"{key}.availabilityZone", job.availability_zone, f"the job runs in the EFA pool ({job.instance_type} is in efa.instanceTypes); allowed: efa.availabilityZone ({efa_zone})"
        )


# Kueue 0.19 records its admission (node selectors, tolerations) in TrainJob.spec.runtimePatches
# (kubernetes-sigs/kueue v0.19.2 pkg/controller/jobs/trainjob/trainjob_controller.go,
# RunWithPodSetsInfo; its webhook adds the entry, trainjob_webhook.go Default), a field
# Trainer v2.1.0's TrainJob does not have (it has podTemplateOverrides): there Kueue cannot start jobs.
KUEUE_INCOMPATIBLE_TRAINERS = ("v2.1.0",)


def _principal_key(arn: str) -> tuple[str, str, str]:
    """(account, role or user, name) of an IAM principal ARN, its path aside."""
    parts = arn.split(":", 5)
    resource = parts[5] if len(parts) == 6 else arn
    return (parts[4] if len(parts) == 6 else "", resource.split("/", 1)[0], resource.rsplit("/", 1)[-1])


def _tenant_rules(s: Settings) -> Iterator[ConfigError]:
    tenants = s.tenants.teams()
    version = s.trainer.version
    if s.kueue.enabled and version in KUEUE_INCOMPATIBLE_TRAINERS:
        yield ConfigError(
            "kueue.enabled", True,
            f"Kueue 0.19 writes its placement into TrainJob.spec.runtimePatches, which Trainer {version} lacks (it has podTemplateOverrides); "
            "allowed: false (teams then get a namespace ResourceQuota only: a hard GPU cap, no queueing or borrowing), or trainer.version v2.3.0",
        )
    if not tenants:
        return
    if s.gpu_pool.mode == "auto":
        # the VPC CNI network-policy agent is switched on through the vpc-cni add-on (karpenter mode);
        # Auto Mode nodes enforce policies only with a NodeClass that enables them (EKS User Guide,
        # "Use Network Policies with EKS Auto Mode"), and the gpu-pool uses Auto Mode's default one
        yield ConfigError("tenants", sorted(tenants), "teams are isolated by NetworkPolicy, which EKS Auto Mode's default NodeClass does not enforce; allowed: gpuPool.mode karpenter, or no tenants")
    reserved = system_namespaces()
    owner: dict[str, str] = {}
    # IAM names a role or user uniquely in its account whatever its path, and EKS matches the
    # principal (config/infra_models.py _role_key): the admins' and the CI roles' entries count too
    admins = {_principal_key(a) for a in [*s.cluster.admin_principal_arns, *filter(None, (s.cluster.ci.preview_role_arn, s.cluster.ci.deploy_role_arn))]}
    part = aws_facts.partition(s.region) if aws_facts.is_region(s.region) else None
    principals: dict[tuple[str, str, str], str] = {}
    for team, t in tenants.items():
        ns = s.tenants.namespace_of(team)
        key = f"tenants.{team}.namespace" if t.namespace else f"tenants.{team}"
        if ns in reserved:
            yield ConfigError(key, ns, f"a system namespace ({reserved[ns]}); allowed: a namespace of the team's own (set tenants.{team}.namespace)")
        elif ns == s.trainjobs.namespace:
            # the training namespace mounts the whole checkpoint file system (every team's directory)
            yield ConfigError(key, ns, "the stack's own training namespace (trainjobs.namespace), whose checkpoint claim is the whole file system; allowed: a namespace of the team's own")
        elif ns in owner:
            yield ConfigError(key, ns, f"already the namespace of team {owner[ns]}; allowed: one namespace per team")
        owner.setdefault(ns, team)
        for i, arn in enumerate(t.principal_arns):
            pkey = f"tenants.{team}.principalArns[{i}]"
            if _principal_key(arn) in admins:
                # one access entry per principal and cluster: a cluster admin's entry already grants everything
                yield ConfigError(pkey, arn, "already a cluster admin or CI role (cluster.adminPrincipalArns, cluster.ci), path aside; allowed: a principal that is not (EKS allows one access entry per principal)")
            elif _principal_key(arn) in principals:
                yield ConfigError(pkey, arn, f"already a principal of team {principals[_principal_key(arn)]}, path aside; allowed: each principal in one team (EKS allows one access entry per principal)")
            elif part is not None and arn.split(":")[1] != part:
                yield ConfigError(pkey, arn, f"allowed: an ARN of the region's partition ({s.region} is in {part}: arn:{part}:iam::...)")
            principals.setdefault(_principal_key(arn), team)
    # Nominal quotas are guarantees: Kueue admits against quota, not against nodes, so quotas
    # above what a pool may launch (gpuPool.gpuLimit caps each NodePool) would admit jobs whose
    # pods wait for nodes that never come. Idle guaranteed GPUs are still lent (one cohort).
    total = sum(t.gpu_quota or 0 for t in tenants.values())
    if total > s.gpu_pool.gpu_limit:
        quotas = {team: t.gpu_quota for team, t in tenants.items()}
        yield ConfigError(
            "tenants", quotas,
            f"the teams' GPU quotas add up to {total}, more than a GPU pool may hold (gpuPool.gpuLimit {s.gpu_pool.gpu_limit}); allowed: quotas that add up to at most gpuPool.gpuLimit (or raise it)",
        )


# (sections the rule reads, the facts it needs: None, "region" (a real AWS Region: its
# partition) or "zones" (the facts table's zones for it), the rule)
_RULES: list[tuple[tuple[str, ...], str | None, Callable[[Settings], Iterator[ConfigError]]]] = [
    (("cluster",), None, _cluster_name_rule),
    (("cluster",), "region", _arn_rules),
    ((), "region", lambda s: regional_arn_problems(s, s.region, aws_facts.partition(s.region))),  # each reads its own section only
    (("network", "efa", "trainjobs"), "zones", _zone_rules),
    (("gpuPool", "efa", "trainer", "trainjobs"), None, _job_rules),
    (("gpuPool", "efa", "trainjobs", "smokeChecks"), "region", lambda s: _offer_rules(s)),
    (("cluster", "gpuPool", "trainer", "trainjobs", "tenants", "kueue"), None, _tenant_rules),
    (("tenants", "portal"), None, lambda s: portal_rules(list(s.tenants.teams()), s.portal, region=s.region, partition=aws_facts.partition(s.region) if aws_facts.is_region(s.region) else "aws")),
    (("trainer", "trainjobs", "gpuPool", "smokeChecks"), None, lambda s: _lifecycle_rules(s)),
    (("trainjobs", "kueue"), None, lambda s: _start_time_rule(s)),
    # keys that would do nothing, guards that would guard nothing, values that break jobs at run time
    (("network", "cluster", "gpuPool", "efa", "smokeChecks", "trainer", "trainjobs", "tenants", "kueue", "observability"), None, effect_rules.all_problems),
]


def _gpu_types_wanted(s: Settings) -> dict[str, list[str]]:
    """Each GPU instance type the config launches, with the keys that ask for it."""
    wanted: dict[str, list[str]] = {}
    for name, job in s.trainjobs.jobs().items():
        wanted.setdefault(job.instance_type, []).append(f"trainjobs.{name}.instanceType")
    if s.efa.enabled:
        for i, t in enumerate(s.efa.instance_types):
            wanted.setdefault(t, []).append(f"efa.instanceTypes[{i}]")
    if s.smoke_checks.enabled and s.smoke_checks.instance_type:
        wanted.setdefault(s.smoke_checks.instance_type, []).append("smokeChecks.instanceType")
    return wanted


def _offer_rules(s: Settings) -> Iterator[ConfigError]:
    """A GPU type the facts table knows the Region does not sell on demand can never launch
    (aws_facts.offers: False); where the table cannot say, aws_facts.gaps warns instead."""
    for t, keys in _gpu_types_wanted(s).items():
        if aws_facts.offers(s.region, t) is False:
            for key in keys:
                offered = sorted(aws_facts.facts(s.region).offered or ())
                yield ConfigError(key, t, f"not sold on demand in {s.region} (config/aws_facts.yaml); allowed: a GPU type the region offers: {', '.join(offered)}")


def _start_time_rule(s: Settings) -> Iterator[ConfigError]:
    """A podsReadyTimeout shorter than a job's launch and download evicts every attempt: the job
    requeues until kueue.requeueLimit and ends without ever starting."""
    timeout = s.kueue.pods_ready_timeout
    if s.kueue_enabled and timeout and duration_seconds(timeout) < 60 * s.start_minutes_needed():
        yield ConfigError(
            "kueue.podsReadyTimeout", timeout,
            f"shorter than the {s.start_minutes_needed()} min this stack's jobs may need to start ({NODE_LAUNCH_MINUTES} min for a GPU node, plus twice the largest trainjobs.<job>.downloadGib at {DOWNLOAD_MIB_PER_S} MiB/s), "
            "so every attempt would be evicted; allowed: unset (sized by the stack) or at least that",
        )


# TrainJob.spec.activeDeadlineSeconds exists from Trainer v2.2.0 (kubeflow/trainer #3258) and is in
# the v2.3.0 CRD (trainer.kubeflow.org_trainjobs.yaml: int64, minimum 1, immutable); the v2.1.0 CRD
# has no such field, and the API server would drop it silently.
DEADLINE_INCOMPATIBLE_TRAINERS = ("v2.1.0",)


def job_grace_periods(s: Settings) -> dict[str, list[int]]:
    """Runtime (base name) -> the grace periods the stack's enabled jobs on it ask for
    (``trainjobs.<job>.terminationGraceSeconds``): each runs on that runtime's grace variant
    (k8s/builders/runtimes.py; a TrainJob cannot carry it past Kueue), on either Trainer release."""
    found: dict[str, set[int]] = {}
    for job in s.trainjobs.jobs().values():
        if job.termination_grace_seconds is not None:
            found.setdefault(type(job).RUNTIME, set()).add(job.termination_grace_seconds)
    return {base: sorted(graces) for base, graces in found.items()}


def _lifecycle_rules(s: Settings) -> Iterator[ConfigError]:
    for name, job in s.trainjobs.jobs().items():
        yield from job_lifecycle_problems(f"trainjobs.{name}", job, s.trainer.version)
    check_type = s.smoke_checks.instance_type
    if s.smoke_checks.enabled and check_type is not None:
        pool = {i.name for i in s.gpu_pool.allowed_types()}
        if check_type not in pool:
            yield ConfigError("smokeChecks.instanceType", check_type, "not allowed by the gpu-pool; allowed: " + ", ".join(sorted(pool)))


def job_lifecycle_problems(key: str, job: JobBase, trainer_version: str) -> Iterator[ConfigError]:
    """A field the job sets that the Trainer release's TrainJob lacks."""
    if trainer_version in DEADLINE_INCOMPATIBLE_TRAINERS and job.active_deadline_seconds is not None:
        yield ConfigError(
            f"{key}.activeDeadlineSeconds", job.active_deadline_seconds,
            f"Trainer {trainer_version}'s TrainJob has no activeDeadlineSeconds (it came with v2.2.0); allowed: unset, or trainer.version v2.3.0 "
            "(on v2.1.0 stop a runaway job by hand: docs/runbook.md, 'Runaway jobs')",
        )


def job_runtime(kind: str) -> str:
    """The ClusterTrainingRuntime (base name) the job of config key ``kind`` runs on (its settings
    class says: ``RUNTIME``)."""
    job = TrainJobsSettings().jobs_by_key()[kind]
    return type(job).RUNTIME


def job_gpus_per_node(job: JobBase) -> int:
    """GPUs (and processes) per node: configured, else every GPU of the instance type."""
    return job.gpus_per_node if job.gpus_per_node is not None else catalog.lookup(job.instance_type).gpus
