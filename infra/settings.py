"""Typed, validated stack settings: the only place stack config becomes Python values.

``load_settings(raw, stack=...)`` takes the project's config as a mapping of top-level key
(without the ``training-platform:`` prefix) to value and returns :class:`Settings`, or raises one
:class:`~infra.config_schema.ConfigError` before anything is registered. Components receive
these objects; none of them reads config.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import versions
from infra import catalog
from infra.config_schema import ConfigError, camel, opt, parse, unknown_key_hint

# --- value checks (return the "allowed" text when the value is bad) -------------------------

_INSTANCE_TYPE_RE = re.compile(r"^([a-z]+)(\d+)([a-z-]*)\.(nano|micro|small|medium|large|\d*xlarge|metal(-\d+xl)?)$")
_K8S_QUANTITY_RE = re.compile(r"^(\d+(\.\d+)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
_CLUSTER_NAME_RE = re.compile(r"^[0-9A-Za-z][A-Za-z0-9_-]{0,99}$")
_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_ARN_PRINCIPAL_RE = re.compile(r"^arn:aws[a-z-]*:(iam|sts)::\d{12}:(role|user|assumed-role)/[\w+=,.@/-]+$")
_KMS_ARN_RE = re.compile(r"^arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:(key|alias)/[\w/-]+$")
_AZ_RE = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d[a-z]$")
_DURATION_RE = re.compile(r"^(Never|(\d+(s|m|h))+)$")


def is_graviton(instance_type: str) -> bool:
    """Graviton (ARM64) types carry a 'g' in the suffix after the generation: c7g, m6gd, c6gn, g5g."""
    m = _INSTANCE_TYPE_RE.match(instance_type)
    if not m:
        return False
    family, _gen, suffix = m.group(1), m.group(2), m.group(3)
    return "g" in suffix or family == "a"


def _instance_type(value: str) -> str | None:
    if not _INSTANCE_TYPE_RE.match(value):
        return "allowed: an EC2 instance type such as c7g.2xlarge or c6i.2xlarge"
    return None


def _cidr(value: str) -> str | None:
    try:
        net = ipaddress.IPv4Network(value, strict=True)
    except ValueError:
        return "allowed: an IPv4 CIDR block such as 10.0.0.0/16 (host bits zero)"
    if not 16 <= net.prefixlen <= 24:
        return "allowed: a prefix length between /16 and /24 (EKS VPC limits and room for subnets)"
    return None


def _public_cidr(value: str) -> str | None:
    try:
        ipaddress.IPv4Network(value, strict=True)
    except ValueError:
        return "allowed: an IPv4 CIDR block such as 203.0.113.0/24"
    return None


def _cidr_list(values: list[str]) -> str | None:
    for v in values:
        if _public_cidr(v):
            return f"{v!r} is not an IPv4 CIDR block; allowed: IPv4 CIDR blocks such as 203.0.113.0/24"
    return None


def _pattern(regex: re.Pattern, allowed: str):
    def check(value: Any) -> str | None:
        items = value if isinstance(value, list) else [value]
        for v in items:
            if not regex.match(v):
                return f"{v!r} is not valid; allowed: {allowed}" if isinstance(value, list) else f"allowed: {allowed}"
        return None

    return check


def _quantity(value: str) -> str | None:
    if not _K8S_QUANTITY_RE.match(value) or float(re.sub(r"[A-Za-z]+$", "", value) or 0) <= 0:
        return "allowed: a positive Kubernetes quantity such as 64Gi or 512Mi"
    return None


def _range(lo: int, hi: int | None = None):
    def check(value: int) -> str | None:
        if value < lo or (hi is not None and value > hi):
            return f"allowed: an integer from {lo} to {hi}" if hi is not None else f"allowed: an integer >= {lo}"
        return None

    return check


def _in_catalog(value: list[str] | str) -> str | None:
    items = value if isinstance(value, list) else [value]
    for v in items:
        if v not in catalog.catalog():
            return f"{v!r} is not in the GPU instance catalog; allowed: " + ", ".join(sorted(catalog.catalog()))
    return None


def _unique(values: list) -> str | None:
    return None if len(set(values)) == len(values) else "allowed: a list without duplicates"


# --- network ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class NetworkSettings:
    cidr: str = opt("10.0.0.0/16", "VPC CIDR block (new VPC only)", check=_cidr)
    az_count: int = opt(2, "availability zones to spread subnets over (new VPC only)", check=_range(2, 6))
    availability_zones: list[str] = opt(
        [], "explicit AZ names; empty = the region's first azCount zones", check=_pattern(_AZ_RE, "AZ names such as us-west-2a")
    )
    nat_gateways: str = opt("single", "one shared NAT gateway, or one per AZ", choices=("single", "perAz"))
    vpc_id: str | None = opt(None, "bring your own VPC: its id (then give the subnet ids)", check=_pattern(re.compile(r"^vpc-[0-9a-f]{8,17}$"), "a VPC id such as vpc-0abc12345def67890"))
    flow_log_retention_days: int = opt(30, "VPC flow logs (all traffic) kept this many days in CloudWatch; 0 turns them off (new VPC only)", check=lambda v: None if v in (0, 1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653) else "allowed: 0 (off) or a CloudWatch retention: 1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653")
    private_subnet_ids: list[str] = opt([], "existing private subnets (with vpcId)", check=_pattern(re.compile(r"^subnet-[0-9a-f]{8,17}$"), "subnet ids such as subnet-0abc1234"))
    public_subnet_ids: list[str] = opt([], "existing public subnets (with vpcId)", check=_pattern(re.compile(r"^subnet-[0-9a-f]{8,17}$"), "subnet ids such as subnet-0abc1234"))

    def validate(self, path: str) -> None:
        if self.vpc_id:
            if len(self.private_subnet_ids) < 2:
                raise ConfigError(f"{path}.privateSubnetIds", self.private_subnet_ids, "with vpcId set, allowed: at least 2 private subnet ids in different AZs")
        else:
            for key, val in (("privateSubnetIds", self.private_subnet_ids), ("publicSubnetIds", self.public_subnet_ids)):
                if val:
                    raise ConfigError(f"{path}.{key}", val, "subnet ids are only allowed together with network.vpcId")
            if self.availability_zones and len(self.availability_zones) != self.az_count:
                raise ConfigError(f"{path}.availabilityZones", self.availability_zones, f"allowed: exactly azCount ({self.az_count}) distinct zone names")
        if len(set(self.availability_zones)) != len(self.availability_zones):
            raise ConfigError(f"{path}.availabilityZones", self.availability_zones, "allowed: distinct zone names")

    @property
    def create_vpc(self) -> bool:
        return self.vpc_id is None


# --- cluster ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterSettings:
    name: str | None = opt(None, "EKS cluster name (physical); unset = training-platform-<stack>", check=_pattern(_CLUSTER_NAME_RE, "1-100 letters, digits, '-' or '_', starting with a letter or digit"))
    version: str = opt(versions.DEFAULT_KUBERNETES_VERSION, "Kubernetes version", choices=versions.KUBERNETES_VERSIONS)
    endpoint_public_access: bool = opt(False, "also expose the API server publicly, restricted to publicAccessCidrs (the private endpoint is always on)")
    public_access_cidrs: list[str] = opt([], "CIDRs allowed to reach the public endpoint (required when it is on)", check=_cidr_list)
    allow_public_access_from_anywhere: bool = opt(False, "explicitly allow 0.0.0.0/0 on the public endpoint")
    admin_principal_arns: list[str] = opt([], "IAM roles/users granted cluster-admin through access entries", check=_pattern(_ARN_PRINCIPAL_RE, "IAM role or user ARNs such as arn:aws:iam::123456789012:role/Admin"))
    secrets_kms_key_arn: str | None = opt(None, "customer KMS key for envelope encryption of Secrets", check=_pattern(_KMS_ARN_RE, "a KMS key ARN"))

    def validate(self, path: str) -> None:
        if self.endpoint_public_access:
            if not self.public_access_cidrs:
                raise ConfigError(f"{path}.publicAccessCidrs", self.public_access_cidrs, "allowed: a non-empty list of CIDRs when endpointPublicAccess is true (or turn the public endpoint off)")
            if "0.0.0.0/0" in self.public_access_cidrs and not self.allow_public_access_from_anywhere:
                raise ConfigError(f"{path}.publicAccessCidrs", self.public_access_cidrs, "0.0.0.0/0 is refused unless cluster.allowPublicAccessFromAnywhere is true; allowed: your networks' CIDRs")
        elif self.public_access_cidrs:
            raise ConfigError(f"{path}.publicAccessCidrs", self.public_access_cidrs, "allowed only when endpointPublicAccess is true")
        if len(set(self.admin_principal_arns)) != len(self.admin_principal_arns):
            raise ConfigError(f"{path}.adminPrincipalArns", self.admin_principal_arns, "allowed: a list without duplicates")


# --- node groups -----------------------------------------------------------------------------


def _node_group_validate(self, path: str) -> None:
    if self.min_size > self.max_size:
        raise ConfigError(f"{path}.minSize", self.min_size, f"allowed: at most maxSize ({self.max_size})")
    if not self.min_size <= self.desired_size <= self.max_size:
        raise ConfigError(f"{path}.desiredSize", self.desired_size, f"allowed: between minSize ({self.min_size}) and maxSize ({self.max_size})")
    arm = is_graviton(self.instance_type)
    if self.ARCH == "arm64" and not arm:
        raise ConfigError(f"{path}.instanceType", self.instance_type, "allowed: a Graviton (ARM64) instance type such as c7g.2xlarge or m7g.xlarge")
    if self.ARCH == "amd64" and arm:
        raise ConfigError(f"{path}.instanceType", self.instance_type, "allowed: an x86_64 instance type such as c6i.2xlarge or m7i.xlarge")


@dataclass(frozen=True)
class ArmNodeGroupSettings:
    ARCH = "arm64"
    AMI_TYPE = "AL2023_ARM_64_STANDARD"
    instance_type: str = opt("c7g.2xlarge", "Graviton instance type", check=_instance_type)
    min_size: int = opt(2, "minimum nodes", check=_range(0, 100))
    max_size: int = opt(4, "maximum nodes", check=_range(1, 100))
    desired_size: int = opt(2, "desired nodes", check=_range(0, 100))
    disk_size_gib: int = opt(50, "root volume size in GiB", check=_range(20, 2000))
    validate = _node_group_validate


@dataclass(frozen=True)
class X86NodeGroupSettings:
    ARCH = "amd64"
    AMI_TYPE = "AL2023_x86_64_STANDARD"
    instance_type: str = opt("c6i.2xlarge", "x86_64 instance type", check=_instance_type)
    min_size: int = opt(2, "minimum nodes", check=_range(0, 100))
    max_size: int = opt(4, "maximum nodes", check=_range(1, 100))
    desired_size: int = opt(2, "desired nodes", check=_range(0, 100))
    disk_size_gib: int = opt(50, "root volume size in GiB", check=_range(20, 2000))
    validate = _node_group_validate


@dataclass(frozen=True)
class NodeGroupsSettings:
    arm: ArmNodeGroupSettings = opt(ArmNodeGroupSettings(), "Graviton (ARM64) managed node group")
    x86: X86NodeGroupSettings = opt(X86NodeGroupSettings(), "x86_64 managed node group")


# --- GPU capacity ----------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuPoolSettings:
    mode: str = opt("karpenter", "self-managed Karpenter, or EKS Auto Mode", choices=("karpenter", "auto"))
    instance_categories: list[str] = opt(["g", "p"], "instance categories the gpu-pool may launch", choices=tuple(catalog.categories()))
    instance_families: list[str] = opt([], "instance families (empty = any in the categories)", choices=tuple(catalog.families()))
    instance_types: list[str] = opt([], "instance types (empty = any in the families/categories)", check=_in_catalog)
    capacity_types: list[str] = opt(["on-demand"], "capacity types", choices=("on-demand", "spot", "reserved"))
    gpu_limit: int = opt(16, "total GPUs the pool may hold", check=_range(1))
    root_volume_size_gib: int = opt(200, "GPU node root volume (deep-learning images are large)", check=_range(50, 16000))
    consolidate_after: str = opt("10m", "how long an empty GPU node lives before removal", check=_pattern(_DURATION_RE, "a duration such as 30s, 10m or 1h"))
    expire_after: str = opt("Never", "node lifetime (Never keeps nodes under a running job)", check=_pattern(_DURATION_RE, "Never or a duration such as 720h"))

    def validate(self, path: str) -> None:
        for key in ("instance_categories", "instance_families", "instance_types", "capacity_types"):
            problem = _unique(getattr(self, key))
            if problem:
                raise ConfigError(f"{path}.{camel(key)}", getattr(self, key), problem)
        if not self.capacity_types:
            raise ConfigError(f"{path}.capacityTypes", self.capacity_types, "allowed: at least one of on-demand, spot, reserved")
        pool = self.allowed_types()
        if not pool:
            raise ConfigError(f"{path}.instanceTypes", self.instance_types, "no catalog type matches instanceCategories/instanceFamilies/instanceTypes together")
        smallest = min(i.gpus for i in pool)
        if self.gpu_limit < smallest:
            raise ConfigError(f"{path}.gpuLimit", self.gpu_limit, f"allowed: at least one node's GPUs ({smallest} for the smallest type in the pool)")

    def allowed_types(self) -> list[catalog.GpuInstance]:
        return catalog.types_in_pool(self.instance_categories, self.instance_families, self.instance_types)


@dataclass(frozen=True)
class EfaSettings:
    enabled: bool = opt(False, "EFA device plugin and an EFA NodePool for multi-node jobs")
    availability_zone: str | None = opt(None, "the one AZ EFA nodes run in (required when enabled)", check=_pattern(_AZ_RE, "an AZ name such as us-west-2a"))
    instance_types: list[str] = opt(["p5.48xlarge"], "EFA-capable instance types for the EFA pool", check=_in_catalog)

    def validate(self, path: str) -> None:
        for t in self.instance_types:
            if not catalog.lookup(t).efa:
                efa_types = ", ".join(sorted(n for n, i in catalog.catalog().items() if i.efa))
                raise ConfigError(f"{path}.instanceTypes", t, f"{t} has no EFA; allowed: {efa_types}")
        if self.enabled:
            if not self.availability_zone:
                raise ConfigError(f"{path}.availabilityZone", self.availability_zone, "required when efa.enabled is true: one AZ of the cluster")
            if not self.instance_types:
                raise ConfigError(f"{path}.instanceTypes", self.instance_types, "allowed: at least one EFA-capable type when efa.enabled is true")


# --- Trainer ---------------------------------------------------------------------------------

RUNTIME_NAMES = ("torch-distributed-gpu", "deepspeed-distributed-gpu", "tensorflow-distributed")


@dataclass(frozen=True)
class TrainerSettings:
    version: str = opt(versions.DEFAULT_TRAINER_VERSION, "Kubeflow Trainer release", choices=tuple(versions.TRAINER_VERSIONS))
    max_restarts: int = opt(3, "whole-job restarts (JobSet failurePolicy.maxRestarts)", check=_range(0, 100))
    shm_size: str = opt("64Gi", "size of the memory-backed /dev/shm volume", check=_quantity)
    runtimes: list[str] = opt(list(RUNTIME_NAMES), "ClusterTrainingRuntimes to install", choices=RUNTIME_NAMES)
    allow_upgrade_from: str | None = opt(None, "installed Trainer release the docs/trainer-upgrade.md procedure was run for", choices=tuple(versions.TRAINER_VERSIONS))

    def validate(self, path: str) -> None:
        if _unique(self.runtimes):
            raise ConfigError(f"{path}.runtimes", self.runtimes, "allowed: a list without duplicates")


# --- training jobs ---------------------------------------------------------------------------


def _job_validate(self, path: str) -> None:
    if self.gpus_per_node is not None and self.instance_type in catalog.catalog():
        gpus = catalog.lookup(self.instance_type).gpus
        if not 1 <= self.gpus_per_node <= gpus:
            raise ConfigError(f"{path}.gpusPerNode", self.gpus_per_node, f"allowed: 1 to {gpus} ({self.instance_type} has {gpus} GPUs)")
    if self.image.endswith(":latest") or ":" not in self.image.rsplit("/", 1)[-1]:
        raise ConfigError(f"{path}.image", self.image, "allowed: an image with a pinned tag or digest (not latest)")


_IMAGE_CHECK = _pattern(re.compile(r"^[a-z0-9.-]+(:\d+)?(/[a-z0-9._-]+)+(:[\w.-]+|@sha256:[0-9a-f]{64})$"), "an image reference such as registry/org/name:tag")


@dataclass(frozen=True)
class DdpJobSettings:
    enabled: bool = opt(False, "create the DDP (MNIST) TrainJob")
    num_nodes: int = opt(2, "nodes (pods) in the job", check=_range(1, 1000))
    instance_type: str = opt("g5.xlarge", "GPU instance type of each node", check=_in_catalog)
    gpus_per_node: int | None = opt(None, "GPUs (processes) per node; unset = all GPUs of the type", check=_range(1))
    epochs: int = opt(3, "training epochs", check=_range(1, 10000))
    image: str = opt(versions.WORKLOAD_IMAGE, "training image (workloads/Dockerfile)", check=_IMAGE_CHECK)
    availability_zone: str | None = opt(None, "pin the job's nodes to one AZ", check=_pattern(_AZ_RE, "an AZ name such as us-west-2a"))
    extra_args: list[str] = opt([], "extra command-line arguments for the training program")
    validate = _job_validate


@dataclass(frozen=True)
class FsdpJobSettings:
    enabled: bool = opt(False, "create the FSDP (T5) TrainJob")
    num_nodes: int = opt(2, "nodes (pods) in the job", check=_range(1, 1000))
    instance_type: str = opt("g5.12xlarge", "GPU instance type of each node", check=_in_catalog)
    gpus_per_node: int | None = opt(None, "GPUs (processes) per node; unset = all GPUs of the type", check=_range(1))
    epochs: int = opt(1, "training epochs", check=_range(1, 10000))
    image: str = opt(versions.WORKLOAD_IMAGE, "training image (workloads/Dockerfile)", check=_IMAGE_CHECK)
    availability_zone: str | None = opt(None, "pin the job's nodes to one AZ", check=_pattern(_AZ_RE, "an AZ name such as us-west-2a"))
    extra_args: list[str] = opt([], "extra command-line arguments for the training program")
    model: str = opt("google-t5/t5-large", "Hugging Face model id to fine-tune", check=_pattern(re.compile(r"^[\w.-]+(/[\w.-]+)?$"), "a model id such as google-t5/t5-large"))
    validate = _job_validate


@dataclass(frozen=True)
class CheckpointStorageSettings:
    type: str = opt("fsx", "durable RWX checkpoint volume", choices=("fsx", "efs"))
    capacity_gib: int = opt(1200, "FSx for Lustre capacity (1200 or a multiple of 2400)", check=lambda v: None if v == 1200 or (v > 0 and v % 2400 == 0) else "allowed: 1200 or a multiple of 2400")
    throughput_per_tib: int = opt(250, "FSx PERSISTENT_2 throughput per TiB (MB/s)", choices=(125, 250, 500, 1000))


@dataclass(frozen=True)
class TrainJobsSettings:
    namespace: str = opt("training", "namespace for TrainJobs, code and checkpoints", check=_pattern(_DNS_LABEL_RE, "a DNS label such as training"))
    checkpoint_storage: CheckpointStorageSettings = opt(CheckpointStorageSettings(), "checkpoint volume")
    ddp: DdpJobSettings = opt(DdpJobSettings(), "DDP MNIST job")
    fsdp: FsdpJobSettings = opt(FsdpJobSettings(), "FSDP T5 job")

    def jobs(self) -> dict[str, DdpJobSettings | FsdpJobSettings]:
        return {name: job for name, job in (("ddp", self.ddp), ("fsdp", self.fsdp)) if job.enabled}


# --- the whole stack -------------------------------------------------------------------------

SECTIONS: dict[str, type] = {
    "network": NetworkSettings,
    "cluster": ClusterSettings,
    "nodeGroups": NodeGroupsSettings,
    "gpuPool": GpuPoolSettings,
    "efa": EfaSettings,
    "trainer": TrainerSettings,
    "trainjobs": TrainJobsSettings,
}


@dataclass(frozen=True)
class Settings:
    stack: str
    region: str
    network: NetworkSettings = field(default_factory=NetworkSettings)
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    node_groups: NodeGroupsSettings = field(default_factory=NodeGroupsSettings)
    gpu_pool: GpuPoolSettings = field(default_factory=GpuPoolSettings)
    efa: EfaSettings = field(default_factory=EfaSettings)
    trainer: TrainerSettings = field(default_factory=TrainerSettings)
    trainjobs: TrainJobsSettings = field(default_factory=TrainJobsSettings)

    @property
    def cluster_name(self) -> str:
        return self.cluster.name or f"training-platform-{self.stack}"[:100]

    def pinned_zones(self) -> list[str]:
        """Zones the EFA pool and jobs are pinned to: the VPC must span them."""
        zones = [self.efa.availability_zone] if self.efa.enabled and self.efa.availability_zone else []
        zones += [j.availability_zone for j in self.trainjobs.jobs().values() if j.availability_zone]
        return list(dict.fromkeys(zones))


_REGION_RE = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d$")


def load_settings(raw: Mapping[str, Any], *, stack: str, region: str) -> Settings:
    """Validate the whole project config; raise one ConfigError on the first problem."""
    if not _REGION_RE.match(region or ""):
        raise ConfigError("aws:region", region, "allowed: an AWS region such as us-west-2 (set aws:region in the stack file)")
    for key in raw:
        if key not in SECTIONS:
            raise ConfigError(key, raw[key], unknown_key_hint(key, list(SECTIONS)))
    parsed = {key: parse(cls, raw.get(key), key) for key, cls in SECTIONS.items()}
    settings = Settings(
        stack=stack,
        region=region,
        network=parsed["network"],
        cluster=parsed["cluster"],
        node_groups=parsed["nodeGroups"],
        gpu_pool=parsed["gpuPool"],
        efa=parsed["efa"],
        trainer=parsed["trainer"],
        trainjobs=parsed["trainjobs"],
    )
    _cross_checks(settings)
    return settings


def _cross_checks(s: Settings) -> None:
    """Rules that span sections."""
    if s.cluster.name is None and not _CLUSTER_NAME_RE.match(s.cluster_name):
        raise ConfigError("cluster.name", s.cluster_name, "the default name from the stack name is not a valid EKS name; set cluster.name")
    zones = s.network.availability_zones
    for key, zone in [("efa.availabilityZone", s.efa.availability_zone if s.efa.enabled else None)] + [
        (f"trainjobs.{n}.availabilityZone", j.availability_zone) for n, j in s.trainjobs.jobs().items()
    ]:
        if zone is None:
            continue
        if not zone.startswith(s.region):
            raise ConfigError(key, zone, f"allowed: a zone of the cluster's region {s.region}")
        if zones and zone not in zones:
            raise ConfigError(key, zone, "allowed: one of the cluster's zones: " + ", ".join(zones))
    pinned = s.pinned_zones()
    if s.network.create_vpc and not zones and len(pinned) > s.network.az_count:
        raise ConfigError("network.azCount", s.network.az_count, f"jobs and the EFA pool are pinned to {len(pinned)} zones ({', '.join(pinned)}); allowed: at least {len(pinned)}")
    pool_types = {i.name for i in s.gpu_pool.allowed_types()}
    if s.efa.enabled:
        pool_types |= set(s.efa.instance_types)
    for name, job in s.trainjobs.jobs().items():
        key = f"trainjobs.{name}"
        if job.instance_type not in pool_types:
            raise ConfigError(f"{key}.instanceType", job.instance_type, "not allowed by the gpu-pool (gpuPool.instanceCategories/instanceFamilies/instanceTypes); allowed: " + ", ".join(sorted(pool_types)))
        if "torch-distributed-gpu" not in s.trainer.runtimes:
            raise ConfigError(f"{key}.enabled", True, "the job needs runtime torch-distributed-gpu; add it to trainer.runtimes")
        gpus = job_gpus_per_node(job)
        if job.num_nodes * gpus > s.gpu_pool.gpu_limit and not (s.efa.enabled and job.instance_type in s.efa.instance_types):
            raise ConfigError(f"{key}.numNodes", job.num_nodes, f"the job needs {job.num_nodes * gpus} GPUs but gpuPool.gpuLimit is {s.gpu_pool.gpu_limit}; allowed: at most {s.gpu_pool.gpu_limit // gpus} nodes")


def job_gpus_per_node(job: DdpJobSettings | FsdpJobSettings) -> int:
    """GPUs (and processes) per node: configured, else every GPU of the instance type."""
    return job.gpus_per_node if job.gpus_per_node is not None else catalog.lookup(job.instance_type).gpus
