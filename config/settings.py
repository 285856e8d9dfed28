"""Typed, validated stack settings: the only place stack config becomes Python values.

``load_settings(raw, stack=..., region=...)`` takes the project's config as a mapping of
top-level key (without the ``training-platform:`` prefix) to value and returns :class:`Settings`,
or raises one :class:`~config.schema.ConfigErrors` that lists every problem (one line each)
before anything is registered. Components receive these objects; none of them reads config.

The settings classes are frozen pydantic models (:class:`~config.schema.Section`): the
same classes give the README's config reference (``tools/config_docs.py``) and the editors'
JSON Schema of a stack file (``tools/config_json_schema.py``).
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar, cast

from pydantic import ConfigDict, Field, RootModel, model_serializer

import versions
from config import aws_facts, catalog
from config.efa import efa_layouts, efa_pool_of
from config.namespaces import AGENT_NAMESPACE, KARPENTER_NAMESPACE, KUEUE_NAMESPACE, MONITORING_NAMESPACE, OPS_NAMESPACE, STORAGE_NAMESPACE, TRAINER_NAMESPACE
from config.schema import Bool, ConfigError, ConfigErrors, Float, Int, SchemaCheck, Section, camel, opt, problems_of, repaired_section, to_raw, unknown_key_hint, validate_section

# --- value checks (return the "allowed" text when the value is bad) -------------------------

_INSTANCE_TYPE_RE = re.compile(r"^([a-z]+)(\d+)([a-z-]*)\.(nano|micro|small|medium|large|\d*xlarge|metal(-\d+xl)?)$", re.ASCII)
_K8S_QUANTITY_RE = re.compile(r"^(\d+(\.\d+)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$", re.ASCII)
_CLUSTER_NAME_RE = re.compile(r"^[0-9A-Za-z][A-Za-z0-9_-]{0,99}$", re.ASCII)
DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", re.ASCII)
# EKS access entries take an IAM role or user (EKS API CreateAccessEntry, principalArn); a
# session of an assumed role (arn:aws:sts::ACCOUNT:assumed-role/ROLE/SESSION) is no principal
_ARN_PRINCIPAL_RE = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:(role|user)/([A-Za-z0-9+=,.@_-]+/)*[A-Za-z0-9+=,.@_-]{1,64}$", re.ASCII)
_STS_SESSION_RE = re.compile(r"^arn:(aws[a-z-]*):sts::(\d{12}):assumed-role/([A-Za-z0-9+=,.@_-]+)/.+$", re.ASCII)
_KMS_ARN_RE = re.compile(r"^arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:(key|alias)/[\w/-]+$", re.ASCII)
AZ_RE = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d[a-z]$", re.ASCII)
_DURATION_RE = re.compile(r"^(Never|(\d+(s|m|h))+)$", re.ASCII)


def is_graviton(instance_type: str) -> bool:
    """Graviton (ARM64) types carry a 'g' in the suffix after the generation: c7g, m6gd, c6gn, g5g."""
    m = _INSTANCE_TYPE_RE.fullmatch(instance_type)
    if not m:
        return False
    family, _gen, suffix = m.group(1), m.group(2), m.group(3)
    return "g" in suffix or family == "a"


def _instance_type(value: str) -> str | None:
    if not _INSTANCE_TYPE_RE.fullmatch(value) or not aws_facts.is_instance_type(value):
        close = difflib.get_close_matches(value, aws_facts.instance_types(), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return f"{hint}allowed: an EC2 instance type that exists (pulumi_aws.ec2.InstanceType), such as c7g.2xlarge or c6i.2xlarge"
    return None


def _principal_arns(values: list[str]) -> str | None:
    for v in values:
        if _ARN_PRINCIPAL_RE.fullmatch(v):
            continue
        if m := _STS_SESSION_RE.fullmatch(v):
            return f"{v!r} is a session of a role, not a principal EKS accepts; allowed: the role itself, arn:{m[1]}:iam::{m[2]}:role/{m[3]}"
        return f"{v!r} is not valid; allowed: IAM role or user ARNs such as arn:aws:iam::123456789012:role/Admin"
    return None


_PRINCIPAL_ARNS = SchemaCheck(_principal_arns, {"pattern": _ARN_PRINCIPAL_RE.pattern})


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


WIDEST_PUBLIC_CIDR = 8
"""The widest block a public endpoint may allow without ``allowPublicAccessFromAnywhere``: a /8 is
16.7 million addresses, one of the largest single allocations; anything wider is most of the internet."""


def too_open(cidrs: list[str]) -> str | None:
    """Why a list of CIDRs opens the endpoint to the internet, judged by the address space they
    cover and not by the literal ``0.0.0.0/0`` (``[0.0.0.0/1, 128.0.0.0/1]`` is all of it); None if not."""
    nets = []
    for c in cidrs:
        try:
            nets.append(ipaddress.IPv4Network(c, strict=False))
        except ValueError:
            continue
    covered = sum(n.num_addresses for n in ipaddress.collapse_addresses(nets))
    if covered >= 2**32:
        return "0.0.0.0/0 is all of IPv4" if "0.0.0.0/0" in cidrs else f"{', '.join(cidrs)} cover all of IPv4 (the same as 0.0.0.0/0)"
    wide = [str(n) for n in nets if n.prefixlen < WIDEST_PUBLIC_CIDR]
    if wide:
        return f"{', '.join(wide)} {'is' if len(wide) == 1 else 'are'} wider than /{WIDEST_PUBLIC_CIDR} (a large part of the internet)"
    return None


def _cidr_list(values: list[str]) -> str | None:
    for v in values:
        if _public_cidr(v):
            return f"{v!r} is not an IPv4 CIDR block; allowed: IPv4 CIDR blocks such as 203.0.113.0/24"
    return None


def _pattern(regex: re.Pattern, allowed: str) -> SchemaCheck:
    def check(value: Any) -> str | None:
        items = value if isinstance(value, list) else [value]
        for v in items:
            if not regex.fullmatch(v):
                return f"{v!r} is not valid; allowed: {allowed}" if isinstance(value, list) else f"allowed: {allowed}"
        return None

    return SchemaCheck(check, {"pattern": regex.pattern})


_QUANTITY_FACTORS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def quantity_bytes(value: str) -> float:
    """Bytes of a Kubernetes quantity such as ``64Gi`` (one already checked by :func:`_quantity`)."""
    m = _K8S_QUANTITY_RE.fullmatch(value)
    assert m is not None
    return float(m.group(1)) * _QUANTITY_FACTORS[m.group(3) or ""]


def _quantity(value: str) -> str | None:
    if not _K8S_QUANTITY_RE.fullmatch(value) or quantity_bytes(value) <= 0:
        return "allowed: a positive Kubernetes quantity such as 64Gi or 512Mi"
    return None


# /dev/shm carries PyTorch's DataLoader worker batches and NCCL's intra-node transport buffers
# (NCCL's SHM transport; Docker's 64 MiB default is the classic cause of "unable to write to
# /dev/shm"): below 1 GiB a GPU job fails at its first batches or collective
SMALLEST_SHM = "1Gi"


def _shm_size(value: str) -> str | None:
    if problem := _quantity(value):
        return problem
    if quantity_bytes(value) < quantity_bytes(SMALLEST_SHM):
        return f"allowed: at least {SMALLEST_SHM} (DataLoader workers and NCCL's shared-memory transport use /dev/shm), such as 64Gi"
    return None


def _range(lo: int, hi: int | None = None) -> SchemaCheck:
    def check(value: int) -> str | None:
        if value < lo or (hi is not None and value > hi):
            return f"allowed: an integer from {lo} to {hi}" if hi is not None else f"allowed: an integer >= {lo}"
        return None

    return SchemaCheck(check, {"minimum": lo} | ({"maximum": hi} if hi is not None else {}))


def _in_catalog(value: list[str] | str) -> str | None:
    items = value if isinstance(value, list) else [value]
    for v in items:
        if v not in catalog.catalog():
            return f"{v!r} is not in the GPU instance catalog; allowed: " + ", ".join(sorted(catalog.catalog()))
    return None


def _unique(values: list) -> str | None:
    return None if len(set(values)) == len(values) else "allowed: a list without duplicates"


_IN_CATALOG = SchemaCheck(_in_catalog, {"enum": sorted(catalog.catalog())})
_FLOW_LOG_RETENTION = (0, 1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653)
_SUBNET_ID = _pattern(re.compile(r"^subnet-[0-9a-f]{8,17}$", re.ASCII), "subnet ids such as subnet-0abc1234")


# --- network ---------------------------------------------------------------------------------


def subnet_plan(cidr: str, az_count: int) -> tuple[list[str], list[str]]:
    """Split the VPC CIDR: the first half holds the private subnets (pods and nodes need room),
    a quarter of the second half the (small) public subnets for load balancers and NAT."""
    vpc = ipaddress.IPv4Network(cidr)
    bits = math.ceil(math.log2(az_count))
    private_half, public_half = vpc.subnets(prefixlen_diff=1)
    private = list(private_half.subnets(prefixlen_diff=bits))[:az_count]
    public_quarter = next(public_half.subnets(prefixlen_diff=2))
    public = list(public_quarter.subnets(prefixlen_diff=bits))[:az_count]
    return [str(n) for n in private], [str(n) for n in public]


# A subnet's block is /16 to /28 (Amazon VPC User Guide, "Subnet CIDR blocks"), and AWS keeps 5
# addresses of each. The VPC CNI gives every pod an address of its node's subnet: a private
# subnet is sized for a GPU cluster's zone at /24 or larger (251 addresses: the system nodes, GPU
# nodes and their pods, Karpenter's surge during replacement).
SMALLEST_SUBNET_PREFIX = 28
SMALLEST_PRIVATE_SUBNET_PREFIX = 24


class NetworkSettings(Section):
    cidr: str = opt("10.0.0.0/16", "VPC CIDR block (new VPC only)", check=_cidr)
    az_count: Int = opt(2, "availability zones to spread subnets over (new VPC only)", check=_range(2, 6))
    availability_zones: list[str] = opt([], "explicit AZ names; empty = the region's first azCount zones", check=_pattern(AZ_RE, "AZ names such as us-west-2a"))
    nat_gateways: str = opt("single", "one shared NAT gateway, or one per AZ", choices=("single", "perAz"))
    vpc_id: str | None = opt(None, "bring your own VPC: its id (then give the subnet ids)", check=_pattern(re.compile(r"^vpc-[0-9a-f]{8,17}$", re.ASCII), "a VPC id such as vpc-0abc12345def67890"))
    flow_log_retention_days: Int = opt(
        30,
        "VPC flow logs (all traffic) kept this many days in CloudWatch; 0 turns them off (new VPC only)",
        check=SchemaCheck(lambda v: None if v in _FLOW_LOG_RETENTION else "allowed: 0 (off) or a CloudWatch retention: " + ", ".join(map(str, _FLOW_LOG_RETENTION[1:])), {"enum": list(_FLOW_LOG_RETENTION)}),
    )
    private_subnet_ids: list[str] = opt([], "existing private subnets (with vpcId)", check=_SUBNET_ID)
    public_subnet_ids: list[str] = opt([], "existing public subnets (with vpcId)", check=_SUBNET_ID)

    def problems(self, path: str) -> Iterator[ConfigError]:
        if self.vpc_id:
            if len(self.private_subnet_ids) < 2:
                yield ConfigError(f"{path}.privateSubnetIds", self.private_subnet_ids, "with vpcId set, allowed: at least 2 private subnet ids in different AZs")
        else:
            for key, val in (("privateSubnetIds", self.private_subnet_ids), ("publicSubnetIds", self.public_subnet_ids)):
                if val:
                    yield ConfigError(f"{path}.{key}", val, "subnet ids are only allowed together with network.vpcId")
            if self.availability_zones and len(self.availability_zones) != self.az_count:
                yield ConfigError(f"{path}.availabilityZones", self.availability_zones, f"allowed: exactly azCount ({self.az_count}) distinct zone names")
        if len(set(self.availability_zones)) != len(self.availability_zones):
            yield ConfigError(f"{path}.availabilityZones", self.availability_zones, "allowed: distinct zone names")
        for key, ids in (("privateSubnetIds", self.private_subnet_ids), ("publicSubnetIds", self.public_subnet_ids)):
            if len(set(ids)) != len(ids):
                yield ConfigError(f"{path}.{key}", ids, "allowed: distinct subnet ids (a subnet listed twice is one subnet)")
        if both := sorted(set(self.private_subnet_ids) & set(self.public_subnet_ids)):
            yield ConfigError(f"{path}.publicSubnetIds", self.public_subnet_ids, f"{', '.join(both)} also listed as private; allowed: a subnet is either private or public")
        if self.create_vpc:
            yield from self._subnet_size_problems(path)

    def _subnet_size_problems(self, path: str) -> Iterator[ConfigError]:
        private, public = subnet_plan(self.cidr, self.az_count)
        private_prefix, public_prefix = ipaddress.IPv4Network(private[0]).prefixlen, ipaddress.IPv4Network(public[0]).prefixlen
        # private: half the VPC split azCount ways; public: an eighth split azCount ways (subnet_plan)
        bits = math.ceil(math.log2(self.az_count))
        widest = min(SMALLEST_PRIVATE_SUBNET_PREFIX - 1 - bits, SMALLEST_SUBNET_PREFIX - 3 - bits)
        if private_prefix > SMALLEST_PRIVATE_SUBNET_PREFIX or public_prefix > SMALLEST_SUBNET_PREFIX:
            yield ConfigError(
                f"{path}.cidr", self.cidr,
                f"split over {self.az_count} zones it gives private subnets of /{private_prefix} and public subnets of /{public_prefix}; "
                f"private subnets need /{SMALLEST_PRIVATE_SUBNET_PREFIX} or larger (every pod takes an address) and AWS's smallest subnet is /{SMALLEST_SUBNET_PREFIX}; "
                f"allowed: a VPC CIDR of /{widest} or larger for azCount {self.az_count}",
            )

    @property
    def create_vpc(self) -> bool:
        return self.vpc_id is None


# --- cluster ---------------------------------------------------------------------------------


class ClusterSettings(Section):
    name: str | None = opt(None, "EKS cluster name (physical); unset = training-platform-<stack>", check=_pattern(_CLUSTER_NAME_RE, "1-100 letters, digits, '-' or '_', starting with a letter or digit"))
    version: str = opt(versions.DEFAULT_KUBERNETES_VERSION, "Kubernetes version", choices=versions.KUBERNETES_VERSIONS)
    endpoint_public_access: Bool = opt(False, "also expose the API server publicly, restricted to publicAccessCidrs (the private endpoint is always on)")
    public_access_cidrs: list[str] = opt([], "CIDRs allowed to reach the public endpoint (required when it is on)", check=_cidr_list)
    allow_public_access_from_anywhere: Bool = opt(False, "explicitly allow 0.0.0.0/0 on the public endpoint")
    admin_principal_arns: list[str] = opt([], "IAM roles/users granted cluster-admin through access entries", check=_PRINCIPAL_ARNS)
    secrets_kms_key_arn: str | None = opt(None, "customer KMS key for envelope encryption of Secrets (in the stack's region)", check=_pattern(_KMS_ARN_RE, "a KMS key ARN"))

    def problems(self, path: str) -> Iterator[ConfigError]:
        if self.endpoint_public_access:
            if not self.public_access_cidrs:
                yield ConfigError(f"{path}.publicAccessCidrs", self.public_access_cidrs, "allowed: a non-empty list of CIDRs when endpointPublicAccess is true (or turn the public endpoint off)")
            elif (why := too_open(self.public_access_cidrs)) and not self.allow_public_access_from_anywhere:
                yield ConfigError(f"{path}.publicAccessCidrs", self.public_access_cidrs, f"{why}: refused unless cluster.allowPublicAccessFromAnywhere is true; allowed: your networks' CIDRs")
        elif self.public_access_cidrs:
            yield ConfigError(f"{path}.publicAccessCidrs", self.public_access_cidrs, "allowed only when endpointPublicAccess is true")
        if len(set(self.admin_principal_arns)) != len(self.admin_principal_arns):
            yield ConfigError(f"{path}.adminPrincipalArns", self.admin_principal_arns, "allowed: a list without duplicates")


# --- node groups -----------------------------------------------------------------------------


class NodeGroupSettings(Section):
    """A managed node group; the subclasses fix the architecture (``ARCH``) and AMI type."""

    ARCH: ClassVar[str]
    AMI_TYPE: ClassVar[str]
    instance_type: str = opt("c7g.2xlarge", "instance type", check=_instance_type)
    min_size: Int = opt(2, "minimum nodes", check=_range(0, 100))
    max_size: Int = opt(4, "maximum nodes", check=_range(1, 100))
    desired_size: Int = opt(2, "desired nodes", check=_range(0, 100))
    disk_size_gib: Int = opt(50, "root volume size in GiB", check=_range(20, 2000))

    def problems(self, path: str) -> Iterator[ConfigError]:
        if self.min_size > self.max_size:
            yield ConfigError(f"{path}.minSize", self.min_size, f"allowed: at most maxSize ({self.max_size})")
        elif not self.min_size <= self.desired_size <= self.max_size:
            yield ConfigError(f"{path}.desiredSize", self.desired_size, f"allowed: between minSize ({self.min_size}) and maxSize ({self.max_size})")
        arm = is_graviton(self.instance_type)
        if self.ARCH == "arm64" and not arm:
            yield ConfigError(f"{path}.instanceType", self.instance_type, "allowed: a Graviton (ARM64) instance type such as c7g.2xlarge or m7g.xlarge")
        if self.ARCH == "amd64" and arm:
            yield ConfigError(f"{path}.instanceType", self.instance_type, "allowed: an x86_64 instance type such as c6i.2xlarge or m7i.xlarge")


class ArmNodeGroupSettings(NodeGroupSettings):
    ARCH: ClassVar[str] = "arm64"
    AMI_TYPE: ClassVar[str] = "AL2023_ARM_64_STANDARD"
    instance_type: str = opt("c7g.2xlarge", "Graviton instance type", check=_instance_type)


class X86NodeGroupSettings(NodeGroupSettings):
    ARCH: ClassVar[str] = "amd64"
    AMI_TYPE: ClassVar[str] = "AL2023_x86_64_STANDARD"
    instance_type: str = opt("c6i.2xlarge", "x86_64 instance type", check=_instance_type)


class NodeGroupsSettings(Section):
    arm: ArmNodeGroupSettings = opt(ArmNodeGroupSettings(), "Graviton (ARM64) managed node group")
    x86: X86NodeGroupSettings = opt(X86NodeGroupSettings(), "x86_64 managed node group")

    def problems(self, path: str) -> Iterator[ConfigError]:
        # Karpenter, the Trainer, JobSet, Kueue and CoreDNS run on these groups (GPU nodes are
        # tainted): with both able to shrink to nothing, nothing would launch GPU nodes either
        if self.arm.min_size == 0 and self.x86.min_size == 0:
            yield ConfigError(
                f"{path}.x86.minSize", 0,
                "both managed node groups have minSize 0, which leaves no node for Karpenter, the Trainer, Kueue and CoreDNS; allowed: minSize of at least 1 in one group",
            )


# --- GPU capacity ----------------------------------------------------------------------------

_CAPACITY_RESERVATION_ID_RE = re.compile(r"^cr-[0-9a-f]{17}$", re.ASCII)
_ACCOUNT_ID_RE = re.compile(r"^\d{12}$", re.ASCII)


class CapacityReservationSelectorTerm(Section):
    """One capacity reservation selector term (Karpenter EC2NodeClass): a reservation id, or tags
    (optionally with the owning account)."""

    model_config = ConfigDict(json_schema_extra={"oneOf": [{"required": ["id"]}, {"required": ["tags"]}], "not": {"required": ["id", "ownerId"]}})

    id: str | None = opt(None, "a capacity reservation id", check=_pattern(_CAPACITY_RESERVATION_ID_RE, "a capacity reservation id: cr- and 17 hex digits, such as cr-0123456789abcdef0"))
    tags: dict[str, str] | None = opt(None, "tags every selected reservation carries")
    owner_id: str | None = opt(None, "the AWS account (12 digits) that owns the tagged reservations", check=_pattern(_ACCOUNT_ID_RE, "a 12-digit AWS account id"))

    @model_serializer(mode="wrap")
    def _without_unset(self, handler: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}

    def problems(self, path: str) -> Iterator[ConfigError]:
        if (self.id is None) == (self.tags is None):
            yield ConfigError(path, to_raw(self), "allowed: exactly one of id (a reservation id) or tags (a map of tag name to value)")
        if self.tags is not None and not self.tags:
            yield ConfigError(f"{path}.tags", self.tags, "allowed: at least one tag")
        if self.owner_id is not None and self.id is not None:
            yield ConfigError(f"{path}.ownerId", self.owner_id, "allowed only with tags (an id names one reservation already)")

    def karpenter(self) -> dict[str, Any]:
        """The term as Karpenter's EC2NodeClass spells it (``ownerID``)."""
        term: dict[str, Any] = {"id": self.id} if self.id is not None else {"tags": dict(self.tags or {})}
        if self.owner_id is not None:
            term["ownerID"] = self.owner_id
        return term


class GpuPoolSettings(Section):
    mode: str = opt("karpenter", "self-managed Karpenter, or EKS Auto Mode", choices=("karpenter", "auto"))
    instance_categories: list[str] = opt(["g", "p"], "instance categories the gpu-pool may launch", choices=tuple(catalog.categories()))
    instance_families: list[str] = opt([], "instance families (empty = any in the categories)", choices=tuple(catalog.families()))
    instance_types: list[str] = opt([], "instance types (empty = any in the families/categories)", check=_IN_CATALOG)
    capacity_types: list[str] = opt(["on-demand"], "capacity types", choices=("on-demand", "spot", "reserved"))
    capacity_reservation_selector_terms: list[CapacityReservationSelectorTerm] = opt(
        [], "On-Demand Capacity Reservations the pool may use (required with, and only with, capacity type reserved): objects with id, or tags and optional ownerId"
    )
    gpu_limit: Int = opt(16, "total GPUs the pool may hold", check=_range(1))
    root_volume_size_gib: Int = opt(200, "GPU node root volume (deep-learning images are large)", check=_range(50, 16000))
    consolidate_after: str = opt("10m", "how long an empty GPU node lives before removal", check=_pattern(_DURATION_RE, "a duration such as 30s, 10m or 1h"))
    expire_after: str = opt("Never", "node lifetime (Never keeps nodes under a running job)", check=_pattern(_DURATION_RE, "Never or a duration such as 720h"))

    def problems(self, path: str) -> Iterator[ConfigError]:
        for key in ("instance_categories", "instance_families", "instance_types", "capacity_types"):
            problem = _unique(getattr(self, key))
            if problem:
                yield ConfigError(f"{path}.{camel(key)}", getattr(self, key), problem)
        if not self.capacity_types:
            yield ConfigError(f"{path}.capacityTypes", self.capacity_types, "allowed: at least one of on-demand, spot, reserved")
        terms = f"{path}.capacityReservationSelectorTerms"
        if "reserved" in self.capacity_types and not self.capacity_reservation_selector_terms:
            yield ConfigError(terms, [], "required when gpuPool.capacityTypes includes reserved; allowed: a list of {id: cr-...} or {tags: {...}, ownerId: ...} terms")
        if self.capacity_reservation_selector_terms and "reserved" not in self.capacity_types:
            yield ConfigError(terms, to_raw(self.capacity_reservation_selector_terms), "allowed only when gpuPool.capacityTypes includes reserved")
        if self.mode == "auto":
            # Auto Mode's gpu-pool uses its built-in `default` NodeClass (manifests.gpu_objects), which
            # sizes the root volume itself: the key would do nothing
            for key in ("root_volume_size_gib",):
                if key in self.model_fields_set:
                    yield ConfigError(f"{path}.{camel(key)}", getattr(self, key), "does nothing in gpuPool.mode auto (Auto Mode's default NodeClass sizes the root volume); allowed: unset, or gpuPool.mode karpenter")
        if "reserved" in self.capacity_types and self.mode == "auto":
            # the terms live on the node class, and Auto Mode's built-in `default` NodeClass selects none
            yield ConfigError(f"{path}.capacityTypes", self.capacity_types, "reserved needs gpuPool.mode: karpenter (Auto Mode's default NodeClass selects no capacity reservations); allowed: on-demand, spot")
        pool = self.allowed_types()
        if not pool:
            yield ConfigError(f"{path}.instanceTypes", self.instance_types, "no catalog type matches instanceCategories/instanceFamilies/instanceTypes together")
            return
        smallest = min(i.gpus for i in pool)
        if self.gpu_limit < smallest:
            yield ConfigError(f"{path}.gpuLimit", self.gpu_limit, f"allowed: at least one node's GPUs ({smallest} for the smallest type in the pool)")

    def allowed_types(self) -> list[catalog.GpuInstance]:
        return catalog.types_in_pool(self.instance_categories, self.instance_families, self.instance_types)


class EfaSettings(Section):
    enabled: Bool = opt(False, "EFA device plugin and an EFA NodePool for multi-node jobs")
    availability_zone: str | None = opt(None, "the one AZ EFA nodes run in (required when enabled): a zone of the cluster", check=_pattern(AZ_RE, "an AZ name such as us-west-2a"))
    instance_types: list[str] = opt(["p5.48xlarge"], "EFA-capable instance types for the EFA pool", check=_IN_CATALOG)

    def problems(self, path: str) -> Iterator[ConfigError]:
        for t in self.instance_types:
            if not catalog.lookup(t).efa:
                efa_types = ", ".join(sorted(n for n, i in catalog.catalog().items() if i.efa))
                yield ConfigError(f"{path}.instanceTypes", t, f"{t} has no EFA; allowed: {efa_types}")
        if self.enabled:
            if not self.availability_zone:
                yield ConfigError(f"{path}.availabilityZone", self.availability_zone, "required when efa.enabled is true: one AZ of the cluster")
            if not self.instance_types:
                yield ConfigError(f"{path}.instanceTypes", self.instance_types, "allowed: at least one EFA-capable type when efa.enabled is true")


# --- Trainer ---------------------------------------------------------------------------------

TORCH_RUNTIME = "torch-distributed-gpu"
TORCH_HF_RUNTIME = "torch-distributed-gpu-hf"  # with the Trainer's dataset and model initializers
TF_RUNTIME = "tensorflow-distributed"
RUNTIME_NAMES = (TORCH_RUNTIME, TORCH_HF_RUNTIME, "deepspeed-distributed-gpu", TF_RUNTIME)


class TrainerSettings(Section):
    version: str = opt(versions.DEFAULT_TRAINER_VERSION, "Kubeflow Trainer release", choices=tuple(versions.TRAINER_VERSIONS))
    max_restarts: Int = opt(3, "whole-job restarts (JobSet failurePolicy.maxRestarts)", check=_range(0, 100))
    shm_size: str = opt("64Gi", "size of the memory-backed /dev/shm volume", check=SchemaCheck(_shm_size, {"pattern": _K8S_QUANTITY_RE.pattern}))
    runtimes: list[str] = opt(list(RUNTIME_NAMES), "ClusterTrainingRuntimes to install (the runtimes of enabled jobs are always installed)", choices=RUNTIME_NAMES)
    allow_upgrade_from: str | None = opt(None, "installed Trainer release the docs/trainer-upgrade.md procedure was run for", choices=tuple(versions.TRAINER_VERSIONS))

    def problems(self, path: str) -> Iterator[ConfigError]:
        if _unique(self.runtimes):
            yield ConfigError(f"{path}.runtimes", self.runtimes, "allowed: a list without duplicates")


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

# flags workloads/trainjob.program_args sets: the job's field that sets each, or how the platform sets it
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


class JobBase(Section):
    """What every TrainJob has: nodes, instance type, image, placement, extra arguments.
    ``PLATFORM_FLAGS``: the program's flags the platform sets (refused in ``extraArgs``)."""

    PLATFORM_FLAGS: ClassVar[Mapping[str, str]] = PLATFORM_FLAGS
    enabled: Bool = opt(False, "create the TrainJob")
    num_nodes: Int = opt(2, "nodes (pods) in the job", check=_range(1, 1000))
    instance_type: str = opt("g5.xlarge", "GPU instance type of each node", check=_IN_CATALOG)
    gpus_per_node: Int | None = opt(None, "GPUs (processes) per node; unset = all GPUs of the type", check=_range(1))
    image: str | None = opt(None, "training image; unset = the image the stack builds from workloads/Dockerfile into its own ECR repository (docs/images.md)", check=_IMAGE_CHECK)
    availability_zone: str | None = opt(None, "pin the job's nodes to one AZ (an EFA job: efa.availabilityZone)", check=_pattern(AZ_RE, "an AZ name such as us-west-2a"))
    extra_args: list[str] = opt([], "extra command-line arguments for the training program (not the flags the platform sets: --epochs, --checkpoint-dir; DDP: --data-dir; FSDP: --model, --dataset-dir, --model-dir)")
    active_deadline_seconds: Int | None = opt(
        None, "runaway guard: the TrainJob fails (DeadlineExceeded) this many seconds after it starts; unset = no limit (Trainer v2.3.0 only: docs/runbook.md)", check=_range(1)
    )

    def problems(self, path: str) -> Iterator[ConfigError]:
        if self.gpus_per_node is not None and self.instance_type in catalog.catalog():
            gpus = catalog.lookup(self.instance_type).gpus
            if not 1 <= self.gpus_per_node <= gpus:
                yield ConfigError(f"{path}.gpusPerNode", self.gpus_per_node, f"allowed: 1 to {gpus} ({self.instance_type} has {gpus} GPUs)")
        if self.image is not None and (self.image.endswith(":latest") or ":" not in self.image.rsplit("/", 1)[-1]):
            yield ConfigError(f"{path}.image", self.image, "allowed: an image with a pinned tag or digest (not latest)")
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

    epochs: Int = opt(3, "training epochs", check=_range(1, 10000))


class DdpJobSettings(JobSettings):
    """MNIST-shaped classification on generated digits (``--synthetic``): the job needs no
    download at all, so it runs on the runtime without initializers. (MNIST on the hub is
    PNG images inside parquet, which would need an image decoder in the training image.)"""
    RUNTIME: ClassVar[str] = TORCH_RUNTIME

    PLATFORM_FLAGS: ClassVar[Mapping[str, str]] = DDP_PLATFORM_FLAGS
    enabled: Bool = opt(False, "create the DDP (MNIST) TrainJob")


class FsdpJobSettings(JobSettings):
    RUNTIME: ClassVar[str] = TORCH_HF_RUNTIME
    enabled: Bool = opt(False, "create the FSDP (T5) TrainJob")
    instance_type: str = opt("g5.12xlarge", "GPU instance type of each node", check=_IN_CATALOG)
    epochs: Int = opt(1, "training epochs", check=_range(1, 10000))
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
        check=_range(1, 100_000),
    )

    def dataset_uri(self) -> str:
        return hf_uri(self.dataset)

    def model_uri(self) -> str:
        return hf_uri(self.model)


class TfJobSettings(JobSettings):
    """TensorFlow MultiWorkerMirroredStrategy MNIST on the tensorflow-distributed runtime: one
    TensorFlow worker per node driving all the node's GPUs."""
    RUNTIME: ClassVar[str] = TF_RUNTIME

    PLATFORM_FLAGS: ClassVar[Mapping[str, str]] = {f: PLATFORM_FLAGS[f] for f in ("--epochs", "--checkpoint-dir")}
    enabled: Bool = opt(False, "create the TensorFlow (MNIST, MultiWorkerMirroredStrategy) TrainJob")
    gpus_per_node: Int | None = opt(None, "GPUs per node (one TensorFlow worker per node uses them all); unset = all GPUs of the type", check=_range(1))
    image: str | None = opt(versions.TENSORFLOW_RUNTIME_IMAGE, "TensorFlow image (the program needs only TensorFlow); default: the tensorflow-distributed runtime's pinned image", check=_IMAGE_CHECK)
    extra_args: list[str] = opt([], "extra command-line arguments for tf_mnist.py (not the flags the platform sets: --epochs, --checkpoint-dir)")

    def problems(self, path: str) -> Iterator[ConfigError]:
        yield from super().problems(path)
        if self.image is None:  # the stack's own image is a PyTorch image
            yield ConfigError(f"{path}.image", None, "allowed: a TensorFlow image with a pinned tag or digest (the stack's built image has no TensorFlow)")


class NcclCheckSettings(JobBase):
    """The all-reduce bandwidth check (workloads/programs/allreduce_check.py): fails (exit 3, not
    retried) when the bus bandwidth at its largest message size is below the pass mark."""
    RUNTIME: ClassVar[str] = TORCH_RUNTIME

    PLATFORM_FLAGS: ClassVar[Mapping[str, str]] = {"--min-busbw-gbps": "min_bus_bw_g_bps"}
    enabled: Bool = opt(False, "create the all-reduce bandwidth check TrainJob (run it before big jobs)")
    num_nodes: Int = opt(2, "nodes (pods) the all-reduce spans (at least 2: the check is of the network between nodes)", check=_range(2, 1000))
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
    type: str = opt("fsx", "durable RWX checkpoint volume", choices=("fsx", "efs"))
    capacity_gib: Int = opt(1200, "FSx for Lustre capacity (1200 or a multiple of 2400)", check=lambda v: None if v == 1200 or (v > 0 and v % 2400 == 0) else "allowed: 1200 or a multiple of 2400")
    throughput_per_tib: Int = opt(250, "FSx PERSISTENT_2 throughput per TiB (MB/s)", choices=(125, 250, 500, 1000))
    backup_retention_days: Int = opt(
        7, "daily automatic backups of the checkpoint file system, kept this many days (FSx automaticBackupRetentionDays, at most 90; EFS: AWS Backup's daily plan, kept 35 days, on when not 0); FSx also keeps a final backup when the file system is deleted", check=_range(0, 90)
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
        "finished (Complete or Failed) TrainJobs that the stack does not manage (trainctl's, the teams') are deleted this long after they finish, by an hourly CronJob; Never keeps them",
        check=_pattern(_DURATION_RE, "Never or a duration such as 168h or 30m"),
    )

    def problems(self, path: str) -> Iterator[ConfigError]:
        reserved = system_namespaces()
        if self.namespace in reserved:
            yield ConfigError(f"{path}.namespace", self.namespace, f"a system namespace ({reserved[self.namespace]}); allowed: a namespace of the platform's own such as training, not {', '.join(sorted(reserved))}")

    def jobs_by_key(self) -> dict[str, JobBase]:
        """Every job, enabled or not, by config key (ddp, fsdp, tf, ncclCheck)."""
        return {"ddp": self.ddp, "fsdp": self.fsdp, "tf": self.tf, "ncclCheck": self.nccl_check}

    def jobs(self) -> dict[str, JobBase]:
        """The enabled jobs by config key (ddp, fsdp, tf, ncclCheck)."""
        return {name: job for name, job in self.jobs_by_key().items() if job.enabled}


# --- teams (tenants) and Kueue --------------------------------------------------------------


class TenantSettings(Section):
    """One team: its namespace, GPU quota and the IAM principals that act in its namespace."""

    gpu_quota: Int | None = opt(
        None, "GPUs the team is guaranteed in each GPU pool (required): its ClusterQueue's nominal quota with Kueue, its namespace's ResourceQuota without", check=_range(1)
    )
    principal_arns: list[str] = opt(
        [], "IAM roles/users of the team: an access entry each, in a Kubernetes group bound to the team's Role in its namespace only", check=_PRINCIPAL_ARNS
    )
    cpu_quota: str | None = opt(None, "CPU the team may request; unset = what its GPUs bring on the pools' nodes (vCPUs per GPU of the largest ratio)", check=_quantity)
    memory_quota: str | None = opt(None, "memory the team may request; unset = what its GPUs bring on the pools' nodes", check=_quantity)
    namespace: str | None = opt(None, "the team's namespace; unset = the team name", check=_pattern(DNS_LABEL_RE, "a DNS label such as vision"))
    namespace_view_policy: Bool = opt(
        False, "also associate the AWS-managed AmazonEKSViewPolicy, scoped to the team's namespace: read access to every object there except Secrets (more than the team's Role grants)"
    )

    def problems(self, path: str) -> Iterator[ConfigError]:
        if self.gpu_quota is None:
            yield ConfigError(f"{path}.gpuQuota", None, "required: the GPUs the team is guaranteed, an integer >= 1")
        if _unique(self.principal_arns):
            yield ConfigError(f"{path}.principalArns", self.principal_arns, "allowed: a list without duplicates")


class TenantsSettings(RootModel[dict[str, TenantSettings]]):
    """``training-platform:tenants``: team name -> :class:`TenantSettings`."""

    model_config = ConfigDict(frozen=True)
    KEY_NAME: ClassVar[str] = "<team>"

    def problems(self, path: str) -> Iterator[ConfigError]:
        for team, tenant in self.root.items():
            if not DNS_LABEL_RE.fullmatch(team):
                yield ConfigError(f"{path}.{team}", team, "a team name must be a DNS label (it names the team's Kubernetes objects and default namespace); allowed: lower-case letters, digits and '-', such as vision")
            yield from problems_of(tenant, f"{path}.{team}")

    def teams(self) -> dict[str, TenantSettings]:
        return dict(self.root)

    def namespace_of(self, team: str) -> str:
        return self.root[team].namespace or team


# What an admitted job waits for before all its pods run: Karpenter's launch of a GPU node, its
# boot and device plugins, and the pull of a training image of several GB (15 min); then the
# initializers' download, at a single Hugging Face stream's rate we assume (50 MiB/s), doubled.
NODE_LAUNCH_MINUTES = 15
DOWNLOAD_MIB_PER_S = 50


def duration_seconds(text: str) -> int:
    """Seconds of a duration such as ``1h30m`` (the form kueue.podsReadyTimeout takes)."""
    return sum(int(n) * {"s": 1, "m": 60, "h": 3600}[u] for n, u in re.findall(r"(\d+)([smh])", text))


class KueueSettings(Section):
    enabled: Bool | None = opt(
        None, "Kueue queues every TrainJob (teams' and the stack's) in one cohort; unset = on when tenants are configured and trainer.version supports it (not v2.1.0)"
    )
    pods_ready_timeout: str | None = opt(
        None,
        "an admitted TrainJob whose pods are not all running by then is suspended and requeued (all-or-nothing: waitForPodsReady.timeout); Kueue counts the initializers' downloads inside it; "
        f"unset = sized by the stack: {NODE_LAUNCH_MINUTES} min for a GPU node's launch and image pull, plus twice the largest download (trainjobs.<job>.downloadGib) at {DOWNLOAD_MIB_PER_S} MiB/s",
        check=_pattern(re.compile(r"^(\d+(s|m|h))+$", re.ASCII), "a duration such as 30m or 1h"),
    )
    requeue_limit: Int = opt(
        3, "times a job that timed out waiting for its pods is requeued before Kueue deactivates it (waitForPodsReady.requeuingStrategy.backoffLimitCount): it then ends with reason RequeuingLimitExceeded instead of holding quota in a loop", check=_range(0, 100)
    )


# --- observability and smoke checks ---------------------------------------------------------

# CloudWatch Logs retention periods: the values PutRetentionPolicy accepts for retentionInDays
# (CloudWatch Logs API Reference, PutRetentionPolicy; the same list as network.flowLogRetentionDays).
LOG_RETENTION_DAYS = _FLOW_LOG_RETENTION[1:]


class ObservabilitySettings(Section):
    mode: str = opt(
        "cloudwatch",
        "metrics and logs: the amazon-cloudwatch-observability EKS add-on (Container Insights with GPU/EFA metrics, Fluent Bit logs) and a CloudWatch dashboard; prometheus: dcgm-exporter and kube-prometheus-stack; none: neither",
        choices=("cloudwatch", "prometheus", "none"),
    )
    log_retention_days: Int = opt(
        30,
        "days CloudWatch keeps the Container Insights log groups (application, dataplane, host, performance); cloudwatch mode",
        check=SchemaCheck(lambda v: None if v in LOG_RETENTION_DAYS else "allowed: a CloudWatch Logs retention: " + ", ".join(map(str, LOG_RETENTION_DAYS)), {"enum": list(LOG_RETENTION_DAYS)}),
    )


class SmokeChecksSettings(Section):
    enabled: Bool = opt(False, "run a one-shot GPU check at deploy (nvidia-smi and a small CUDA matmul on a gpu-pool node); pulumi up waits for it to pass")
    instance_type: str | None = opt(None, "GPU instance type for the check; unset = the gpu-pool's type with the fewest GPUs", check=_IN_CATALOG)


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
        per run, never refused)."""
        return aws_facts.gaps(self.region)

    def start_minutes_needed(self) -> int:
        """Minutes an admitted job of this stack may need before all its pods run: a node's
        launch plus twice its largest download (see NODE_LAUNCH_MINUTES)."""
        download = max((getattr(j, "download_gib", 0) for j in self.trainjobs.jobs().values()), default=0)
        return NODE_LAUNCH_MINUTES + math.ceil(2 * download * 1024 / DOWNLOAD_MIB_PER_S / 60)

    def pods_ready_timeout(self) -> str:
        """kueue.podsReadyTimeout as set, else sized by :meth:`start_minutes_needed`."""
        return self.kueue.pods_ready_timeout or f"{self.start_minutes_needed()}m"

    @property
    def kueue_enabled(self) -> bool:
        """Kueue as configured, else on when teams exist and the Trainer has ``runtimePatches``."""
        if self.kueue.enabled is not None:
            return self.kueue.enabled
        return bool(self.tenants.root) and self.trainer.version not in KUEUE_INCOMPATIBLE_TRAINERS


def load_settings(raw: Mapping[str, Any], *, stack: str, region: str) -> Settings:
    """Validate the whole project config; raise one ConfigErrors listing every problem."""
    errors: list[ConfigError] = []
    is_region = aws_facts.is_region(region or "")
    if not is_region:
        close = difflib.get_close_matches(region or "", aws_facts.all_regions(), n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        errors.append(ConfigError("aws:region", region, f"{hint}allowed: an AWS Region (pulumi_aws.Region), such as us-west-2 or ap-northeast-2; set aws:region in the stack file"))
    facts_for = {None: True, "region": is_region, "zones": aws_facts.is_known_region(region or "")}
    for key in raw:
        if key not in SECTIONS:
            errors.append(ConfigError(key, raw[key], unknown_key_hint(key, list(SECTIONS))))
    sections: dict[str, Section] = {}
    usable: set[str] = set()
    for key, cls in SECTIONS.items():
        obj, found = validate_section(cls, raw.get(key), key)
        errors += found
        if obj is None and found:
            obj = repaired_section(cls, raw.get(key))  # its invalid values left at their defaults
        sections[_SECTION_ATTR[key]] = obj if obj is not None else cls()
        if obj is not None:
            usable.add(key)
    settings = Settings.model_validate({"stack": stack, "region": region, **sections})
    # rules across sections, also beside field errors elsewhere (one run names every problem);
    # a rule's finding on a key already reported is left out (no follow-on errors)
    reported = [e.key for e in errors]
    for needs, needs_facts, rule in _RULES:
        if set(needs) <= usable and facts_for[needs_facts]:
            errors += [e for e in rule(settings) if not any(_same_or_within(e.key, r) for r in reported)]
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


def _same_or_within(key: str, reported: str) -> bool:
    """``key`` is ``reported`` or lies inside it / around it (``a.b`` vs ``a.b[0]`` or ``a.b.c``)."""
    for a, b in ((key, reported), (reported, key)):
        if a == b or b.startswith(a + ".") or b.startswith(a + "["):
            return True
    return False


# --- rules across sections -------------------------------------------------------------------


def _cluster_name_rule(s: Settings) -> Iterator[ConfigError]:
    if s.cluster.name is None and not _CLUSTER_NAME_RE.fullmatch(s.cluster_name):
        yield ConfigError("cluster.name", s.cluster_name, "the default name from the stack name is not a valid EKS name; set cluster.name")


def _arn_rules(s: Settings) -> Iterator[ConfigError]:
    part = aws_facts.partition(s.region)
    for i, arn in enumerate(s.cluster.admin_principal_arns):
        if arn.split(":")[1] != part:
            yield ConfigError(f"cluster.adminPrincipalArns[{i}]", arn, f"allowed: an ARN of the region's partition ({s.region} is in {part}: arn:{part}:iam::...)")
    kms = s.cluster.secrets_kms_key_arn
    if kms is not None:
        _, arn_part, _, arn_region, *_ = kms.split(":")
        if (arn_part, arn_region) != (part, s.region):
            yield ConfigError("cluster.secretsKmsKeyArn", kms, f"allowed: a KMS key of the stack's region and partition (arn:{part}:kms:{s.region}:...); EKS cannot use a key of another region")


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
    if efa_zone is not None:
        for name, job in s.trainjobs.jobs().items():
            if job.instance_type in s.efa.instance_types and job.availability_zone not in (None, efa_zone):
                yield ConfigError(
                    f"trainjobs.{name}.availabilityZone", job.availability_zone, f"the job runs in the EFA pool ({job.instance_type} is in efa.instanceTypes); allowed: efa.availabilityZone ({efa_zone})"
                )
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
        if job.instance_type not in pool_types:
            yield ConfigError(f"{key}.instanceType", job.instance_type, "not allowed by the gpu-pool (gpuPool.instanceCategories/instanceFamilies/instanceTypes); allowed: " + ", ".join(sorted(pool_types)))
            continue
        gpus = job_gpus_per_node(job)
        limit, limit_key = s.gpu_pool.gpu_limit, "gpuPool.gpuLimit"
        if s.efa.enabled and job.instance_type in s.efa.instance_types:
            # the job's EFA pool holds at least one node of each of its types (manifests.gpu_objects.efa_node_pool)
            efa_types = efa_layouts(s.efa)[efa_pool_of(s.efa, job.instance_type) or ""]
            limit = max(limit, sum(catalog.lookup(t).gpus for t in efa_types))
            limit_key = f"the EFA pool's limit (gpuPool.gpuLimit, at least one node of each of {', '.join(efa_types)})"
        if job.num_nodes * gpus > limit:
            yield ConfigError(f"{key}.numNodes", job.num_nodes, f"the job needs {job.num_nodes * gpus} GPUs but {limit_key} is {limit}; allowed: at most {limit // gpus} nodes")


# Kueue 0.19 records its admission (node selectors, tolerations) in TrainJob.spec.runtimePatches
# (kubernetes-sigs/kueue v0.19.2 pkg/controller/jobs/trainjob/trainjob_controller.go,
# RunWithPodSetsInfo; its webhook adds the entry, trainjob_webhook.go Default), a field
# Trainer v2.1.0's TrainJob does not have (it has podTemplateOverrides): there Kueue cannot start jobs.
KUEUE_INCOMPATIBLE_TRAINERS = ("v2.1.0",)


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
    admins = set(s.cluster.admin_principal_arns)
    part = aws_facts.partition(s.region) if aws_facts.is_region(s.region) else None
    principals: dict[str, str] = {}
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
            if arn in admins:
                # one access entry per principal and cluster: a cluster admin's entry already grants everything
                yield ConfigError(pkey, arn, "already a cluster admin (cluster.adminPrincipalArns); allowed: a principal that is not (EKS allows one access entry per principal)")
            elif arn in principals:
                yield ConfigError(pkey, arn, f"already a principal of team {principals[arn]}; allowed: each principal in one team (EKS allows one access entry per principal)")
            elif part is not None and arn.split(":")[1] != part:
                yield ConfigError(pkey, arn, f"allowed: an ARN of the region's partition ({s.region} is in {part}: arn:{part}:iam::...)")
            principals.setdefault(arn, team)
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
    (("network", "efa", "trainjobs"), "zones", _zone_rules),
    (("gpuPool", "efa", "trainer", "trainjobs"), None, _job_rules),
    (("gpuPool", "efa", "trainjobs", "smokeChecks"), "region", lambda s: _offer_rules(s)),
    (("cluster", "gpuPool", "trainer", "trainjobs", "tenants", "kueue"), None, _tenant_rules),
    (("trainer", "trainjobs", "gpuPool", "smokeChecks"), None, lambda s: _lifecycle_rules(s)),
    (("trainjobs", "kueue"), None, lambda s: _start_time_rule(s)),
]


def _offer_rules(s: Settings) -> Iterator[ConfigError]:
    """A GPU type the facts table knows the Region does not sell on demand can never launch
    (aws_facts.offers: False); where the table cannot say, aws_facts.gaps warns instead."""
    wanted: dict[str, list[str]] = {}
    for name, job in s.trainjobs.jobs().items():
        wanted.setdefault(job.instance_type, []).append(f"trainjobs.{name}.instanceType")
    if s.efa.enabled:
        for i, t in enumerate(s.efa.instance_types):
            wanted.setdefault(t, []).append(f"efa.instanceTypes[{i}]")
    if s.smoke_checks.enabled and s.smoke_checks.instance_type:
        wanted.setdefault(s.smoke_checks.instance_type, []).append("smokeChecks.instanceType")
    for t, keys in wanted.items():
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


def _lifecycle_rules(s: Settings) -> Iterator[ConfigError]:
    if s.trainer.version in DEADLINE_INCOMPATIBLE_TRAINERS:
        for name, job in s.trainjobs.jobs().items():
            if job.active_deadline_seconds is not None:
                yield ConfigError(
                    f"trainjobs.{name}.activeDeadlineSeconds", job.active_deadline_seconds,
                    f"Trainer {s.trainer.version}'s TrainJob has no activeDeadlineSeconds (it came with v2.2.0); allowed: unset, or trainer.version v2.3.0 "
                    "(on v2.1.0 stop a runaway job by hand: docs/runbook.md, 'Runaway jobs')",
                )
    check_type = s.smoke_checks.instance_type
    if s.smoke_checks.enabled and check_type is not None:
        pool = {i.name for i in s.gpu_pool.allowed_types()}
        if check_type not in pool:
            yield ConfigError("smokeChecks.instanceType", check_type, "not allowed by the gpu-pool; allowed: " + ", ".join(sorted(pool)))


def job_runtime(kind: str) -> str:
    """The ClusterTrainingRuntime (base name) the job of config key ``kind`` runs on (its settings
    class says: ``RUNTIME``)."""
    job = TrainJobsSettings().jobs_by_key()[kind]
    return type(job).RUNTIME


def job_gpus_per_node(job: JobBase) -> int:
    """GPUs (and processes) per node: configured, else every GPU of the instance type."""
    return job.gpus_per_node if job.gpus_per_node is not None else catalog.lookup(job.instance_type).gpus
