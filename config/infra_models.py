"""The settings models of the AWS side: network, cluster, managed node groups, GPU capacity, EFA and the Trainer."""


from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, model_serializer

import versions
from config import catalog
from config.checks import (
    _CLUSTER_NAME_RE,
    _DURATION_RE,
    _FLOW_LOG_RETENTION,
    _IN_CATALOG,
    _K8S_QUANTITY_RE,
    _KMS_ARN_RE,
    _PRINCIPAL_ARNS,
    _SUBNET_ID,
    AZ_RE,
    _cidr,
    _cidr_list,
    _instance_type,
    _pattern,
    _shm_size,
    duplicate_errors,
    is_graviton,
    too_open,
)
from config.schema import Bool, ConfigError, Int, SchemaCheck, Section, camel, known, opt, to_raw

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
    az_count: Int = opt(2, "availability zones to spread subnets over (new VPC only)", ge=2, le=6)
    availability_zones: list[str] = opt([], "explicit AZ names; empty = the region's first azCount zones", check=_pattern(AZ_RE, "AZ names such as us-west-2a"))
    nat_gateways: Literal["single", "perAz"] = opt("single", "one shared NAT gateway, or one per AZ")
    vpc_id: str | None = opt(None, "bring your own VPC: its id (then give the subnet ids)", check=_pattern(re.compile(r"^vpc-[0-9a-f]{8,17}$", re.ASCII), "a VPC id such as vpc-0abc12345def67890"))
    flow_log_retention_days: Int = opt(
        30,
        "VPC flow logs (all traffic) kept this many days in CloudWatch; 0 turns them off (new VPC only)",
        check=SchemaCheck(lambda v: None if v in _FLOW_LOG_RETENTION else "allowed: 0 (off) or a CloudWatch retention: " + ", ".join(map(str, _FLOW_LOG_RETENTION[1:])), {"enum": list(_FLOW_LOG_RETENTION)}),
    )
    private_subnet_ids: list[str] = opt([], "existing private subnets (with vpcId)", check=_SUBNET_ID)
    public_subnet_ids: list[str] = opt([], "existing public subnets (with vpcId)", check=_SUBNET_ID)
    s3_gateway_endpoint: Bool = opt(True, "an S3 gateway endpoint on the private route tables (no charge): S3 reads and ECR's image layers skip the NAT gateway's per-GB charge (new VPC only)")
    interface_endpoints: Bool = opt(False, "interface endpoints (PrivateLink, priced per AZ-hour and per GB: make cost) for every AWS API the nodes and controllers call (config/vpc_endpoints.py), "
                                           "for a cluster that should not reach the internet for them (new VPC only)")

    def problems(self, path: str) -> Iterator[ConfigError]:
        if self.vpc_id:
            if len(self.private_subnet_ids) < 2:
                yield ConfigError(f"{path}.privateSubnetIds", self.private_subnet_ids, "with vpcId set, allowed: at least 2 private subnet ids in different AZs")
            if self.interface_endpoints:
                yield ConfigError(f"{path}.interfaceEndpoints", True, "with vpcId set, allowed: false (an existing VPC's endpoints and private DNS are its owner's; create them there)")
        else:
            for key, val in (("privateSubnetIds", self.private_subnet_ids), ("publicSubnetIds", self.public_subnet_ids)):
                if val:
                    yield ConfigError(f"{path}.{key}", val, "subnet ids are only allowed together with network.vpcId")
            if self.availability_zones and len(self.availability_zones) != self.az_count:
                yield ConfigError(f"{path}.availabilityZones", self.availability_zones, f"allowed: exactly azCount ({self.az_count}) distinct zone names")
        yield from duplicate_errors(f"{path}.availabilityZones", self.availability_zones, "allowed: distinct zone names")
        for key, ids in (("privateSubnetIds", self.private_subnet_ids), ("publicSubnetIds", self.public_subnet_ids)):
            yield from duplicate_errors(f"{path}.{key}", ids, "allowed: distinct subnet ids (a subnet listed twice is one subnet)")
        for i, subnet in enumerate(self.public_subnet_ids):
            if subnet in self.private_subnet_ids:
                yield ConfigError(f"{path}.publicSubnetIds[{i}]", subnet, f"also privateSubnetIds[{self.private_subnet_ids.index(subnet)}]; allowed: a subnet is either private or public")
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


# An IAM role (CI assumes roles through OIDC; users cannot be assumed): arn:<partition>:iam::<account>:role/[<path>/]<name>
_ROLE_ARN_RE = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:role/([A-Za-z0-9+=,.@_-]+/)*[A-Za-z0-9+=,.@_-]{1,64}$", re.ASCII)
_ROLE_ARN = _pattern(_ROLE_ARN_RE, "an IAM role ARN such as arn:aws:iam::123456789012:role/ci-preview (the role itself, not an assumed-role session)")


def _role_key(arn: str) -> tuple[str, str]:
    """(account, role name) of a role ARN, ignoring its path: EKS matches the role, and an STS
    session names the role without its path."""
    parts = arn.split(":", 5)
    return (parts[4], parts[5].rsplit("/", 1)[-1]) if len(parts) == 6 else (arn, "")


class CiAccessSettings(Section):
    """The CI workflows' IAM roles (``.github/workflows/preview.yml``, ``deploy-dev.yml``) and the
    access entries they get (``infra/cluster.py`` ``ci_access_entries``)."""

    preview_role_arn: str | None = opt(
        None, "role the preview workflow assumes (AWS_PREVIEW_ROLE_ARN): an access entry with AmazonEKSViewPolicy (read, no Secrets, no writes); "
        "the Kubernetes provider previews what the API server forbids it to dry-run from the program's inputs",
        check=_ROLE_ARN,
    )
    deploy_role_arn: str | None = opt(None, "role the deploy workflow assumes (AWS_DEPLOY_ROLE_ARN): an access entry with AmazonEKSClusterAdminPolicy (pulumi up writes cluster-scoped objects)", check=_ROLE_ARN)
    preview_dry_run: Bool = opt(
        False,
        "give the preview role AmazonEKSClusterAdminPolicy instead, so its server-side dry-runs run (admission webhooks and the API server's validation in the preview): "
        "a dry-run is authorized like the write itself, so this lets everyone who can run the preview workflow write to the cluster",
    )

    def problems(self, path: str) -> Iterator[ConfigError]:
        if self.preview_dry_run and self.preview_role_arn is None:
            yield ConfigError(f"{path}.previewDryRun", True, "needs ci.previewRoleArn (the role it applies to); allowed: false, or set previewRoleArn")
        if self.preview_role_arn is not None and self.deploy_role_arn is not None and _role_key(self.preview_role_arn) == _role_key(self.deploy_role_arn):
            yield ConfigError(f"{path}.deployRoleArn", self.deploy_role_arn, "the same role as previewRoleArn: one principal has one access entry; allowed: a separate deploy role (previews need no writes)")


class ClusterSettings(Section):
    name: str | None = opt(None, "EKS cluster name (physical); unset = training-platform-<stack>", check=_pattern(_CLUSTER_NAME_RE, "1-100 letters, digits, '-' or '_', starting with a letter or digit"))
    version: str = opt(versions.DEFAULT_KUBERNETES_VERSION, "Kubernetes version", choices=versions.KUBERNETES_VERSIONS)
    endpoint_public_access: Bool = opt(False, "also expose the API server publicly, restricted to publicAccessCidrs (the private endpoint is always on)")
    public_access_cidrs: list[str] = opt([], "CIDRs allowed to reach the public endpoint (required when it is on)", check=_cidr_list)
    allow_public_access_from_anywhere: Bool = opt(False, "explicitly allow 0.0.0.0/0 on the public endpoint")
    admin_principal_arns: list[str] = opt([], "IAM roles/users granted cluster-admin through access entries", check=_PRINCIPAL_ARNS)
    secrets_kms_key_arn: str | None = opt(None, "customer KMS key for envelope encryption of Secrets (in the stack's region)", check=_pattern(_KMS_ARN_RE, "a KMS key ARN"))
    ci: CiAccessSettings = opt(CiAccessSettings(), "the CI workflows' roles (.github/workflows): each gets an access entry with the access policy its job needs")

    def problems(self, path: str) -> Iterator[ConfigError]:
        # each rule stops alone where it reads a value that failed its check (config/failed.py)
        yield from known(self._ci_problems(path))
        yield from known(self._endpoint_problems(path))
        yield from duplicate_errors(f"{path}.publicAccessCidrs", self.public_access_cidrs)
        yield from duplicate_errors(f"{path}.adminPrincipalArns", self.admin_principal_arns)

    def _ci_problems(self, path: str) -> Iterator[ConfigError]:
        # one principal has one access entry (EKS CreateAccessEntry: ResourceInUseException for a second)
        admins = {_role_key(a): i for i, a in enumerate(self.admin_principal_arns)}
        for key, arn in (("previewRoleArn", self.ci.preview_role_arn), ("deployRoleArn", self.ci.deploy_role_arn)):
            if arn is not None and _role_key(arn) in admins:
                yield ConfigError(
                    f"{path}.ci.{key}", arn,
                    f"also adminPrincipalArns[{admins[_role_key(arn)]}]: one principal has one access entry; allowed: a role not in adminPrincipalArns "
                    "(a deploy role listed there already has cluster admin: leave it there, since moving it would create its new entry before the old one is deleted)",
                )

    def _endpoint_problems(self, path: str) -> Iterator[ConfigError]:
        if self.endpoint_public_access:
            if not self.public_access_cidrs:
                yield ConfigError(f"{path}.publicAccessCidrs", self.public_access_cidrs, "allowed: a non-empty list of CIDRs when endpointPublicAccess is true (or turn the public endpoint off)")
            elif (why := too_open(self.public_access_cidrs)) and not self.allow_public_access_from_anywhere:
                yield ConfigError(f"{path}.publicAccessCidrs", self.public_access_cidrs, f"{why}: refused unless cluster.allowPublicAccessFromAnywhere is true; allowed: your networks' CIDRs")
        elif self.public_access_cidrs:
            yield ConfigError(f"{path}.publicAccessCidrs", self.public_access_cidrs, "allowed only when endpointPublicAccess is true")


# --- node groups -----------------------------------------------------------------------------


class NodeGroupSettings(Section):
    """A managed node group; the subclasses fix the architecture (``ARCH``) and AMI type."""

    ARCH: ClassVar[str]
    AMI_TYPE: ClassVar[str]
    instance_type: str = opt("c7g.2xlarge", "instance type", check=_instance_type)
    min_size: Int = opt(2, "minimum nodes", ge=0, le=100)
    max_size: Int = opt(4, "maximum nodes", ge=1, le=100)
    desired_size: Int = opt(2, "desired nodes", ge=0, le=100)
    disk_size_gib: Int = opt(50, "root volume size in GiB", ge=20, le=2000)

    def problems(self, path: str) -> Iterator[ConfigError]:
        yield from known(self._size_problems(path))  # a size that failed its own check: the relations wait for it
        arm = is_graviton(self.instance_type)
        if self.ARCH == "arm64" and not arm:
            yield ConfigError(f"{path}.instanceType", self.instance_type, "allowed: a Graviton (ARM64) instance type such as c7g.2xlarge or m7g.xlarge")
        if self.ARCH == "amd64" and arm:
            yield ConfigError(f"{path}.instanceType", self.instance_type, "allowed: an x86_64 instance type such as c6i.2xlarge or m7i.xlarge")


    def _size_problems(self, path: str) -> Iterator[ConfigError]:
        """EKS's scaling config holds minSize <= desiredSize <= maxSize: a line for every relation
        the values given break, each naming both values."""
        lo, want, hi = self.min_size, self.desired_size, self.max_size
        between = f"between minSize ({lo}) and maxSize ({hi})" if lo <= hi else "between minSize and maxSize"
        if lo > hi:
            yield ConfigError(f"{path}.minSize", lo, f"greater than maxSize ({hi}); allowed: at most maxSize ({hi})")
        if want < lo:
            yield ConfigError(f"{path}.desiredSize", want, f"less than minSize ({lo}); allowed: {between}")
        if want > hi:
            yield ConfigError(f"{path}.desiredSize", want, f"greater than maxSize ({hi}); allowed: {between}")


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
        # Karpenter v1.14.1's EC2NodeClass CRD: capacityReservationSelectorTerms[].tags has the rule
        # `self.all(k, k != '' && self[k] != '')` ("empty tag keys or values aren't supported")
        for k, v in (self.tags or {}).items():
            if k == "" or v == "":
                yield ConfigError(f"{path}.tags.{k}", v, "Karpenter's EC2NodeClass refuses empty tag keys and values; allowed: a non-empty tag name and value")
        if self.owner_id is not None and self.id is not None:
            yield ConfigError(f"{path}.ownerId", self.owner_id, "allowed only with tags (an id names one reservation already)")

    def karpenter(self) -> dict[str, Any]:
        """The term as Karpenter's EC2NodeClass spells it (``ownerID``)."""
        term: dict[str, Any] = {"id": self.id} if self.id is not None else {"tags": dict(self.tags or {})}
        if self.owner_id is not None:
            term["ownerID"] = self.owner_id
        return term


# gp3 (EBS User Guide, "General Purpose SSD volumes"): a baseline of 3,000 IOPS and 125 MiB/s, and at
# most 0.25 MiB/s of throughput per provisioned IOPS.
GP3_BASELINE_IOPS = 3000
GP3_BASELINE_MIBPS = 125
GP3_MIB_PER_IOPS = 0.25
# nodeadm's FastImagePull: ignored below 4 vCPUs or 7 GiB (internal/containerd/config.go), and the AMI
# project's guide asks for at least 600 MiB/s of root-volume throughput (nodeadm/doc/examples.md).
FAST_PULL_MIN_VCPU = 4
FAST_PULL_MIN_MEMORY_GIB = 7
FAST_PULL_MIN_MIBPS = 600
IMAGE_PULL_KEYS = ("root_volume_throughput", "root_volume_iops", "instance_store_policy", "fast_image_pull")


class GpuPoolSettings(Section):
    mode: Literal["karpenter", "auto"] = opt("karpenter", "self-managed Karpenter, or EKS Auto Mode")
    instance_categories: list[str] = opt(["g", "p"], "instance categories the gpu-pool may launch", choices=tuple(catalog.categories()))
    instance_families: list[str] = opt([], "instance families (empty = any in the categories)", choices=tuple(catalog.families()))
    instance_types: list[str] = opt([], "instance types (empty = any in the families/categories)", check=_IN_CATALOG)
    capacity_types: list[Literal["on-demand", "spot", "reserved"]] = opt(["on-demand"], "capacity types")
    capacity_reservation_selector_terms: list[CapacityReservationSelectorTerm] = opt(
        [], "On-Demand Capacity Reservations the pool may use (required with, and only with, capacity type reserved): objects with id, or tags and optional ownerId"
    )
    gpu_limit: Int = opt(16, "total GPUs the pool may hold", ge=1)
    root_volume_size_gib: Int = opt(200, "GPU node root volume (deep-learning images are large)", ge=50, le=16000)
    consolidate_after: str = opt("10m", "how long an empty GPU node lives before removal", check=_pattern(_DURATION_RE, "a duration such as 30s, 10m or 1h"))
    node_repair: Bool = opt(
        True,
        "Karpenter's node repair (feature gate NodeRepair, karpenter mode): a GPU node whose AcceleratedHardwareReady stays False 10 min (Ready False/Unknown, or another agent condition, 30 min) is replaced; "
        "Auto Mode repairs nodes itself",
    )
    expire_after: str = opt("Never", "node lifetime (Never keeps nodes under a running job)", check=_pattern(_DURATION_RE, "Never or a duration such as 720h"))
    # Image pull levers (docs/time-to-first-step.md), all off by default: the GPU nodes' EC2NodeClasses as before.
    root_volume_throughput: Int | None = opt(
        None, "gp3 throughput of the GPU nodes' root volume in MiB/s (EC2NodeClass blockDeviceMappings ebs.throughput, Karpenter v1.14.1: 125 to 1000); "
        "unset = gp3's baseline, 125 MiB/s, which caps the unpack of the training image on the root volume", ge=125, le=1000,
    )
    root_volume_iops: Int | None = opt(None, "gp3 IOPS of the GPU nodes' root volume (ebs.iops: 3000 to 16000); unset = gp3's baseline, 3000", ge=3000, le=16000)
    instance_store_policy: Literal["RAID0"] | None = opt(
        None, "RAID0: the instance's NVMe instance-store disks as one RAID0 array under containerd, the kubelet and pod logs (EC2NodeClass instanceStorePolicy; on AL2023 "
        "Karpenter sets nodeadm's localStorage strategy RAID0), so images unpack to local NVMe instead of the root EBS volume; unset = instance store unused",
    )
    fast_image_pull: Bool = opt(
        False, "nodeadm's FastImagePull feature gate (experimental in the EKS AMI): containerd pulls and unpacks images with the SOCI snapshotter's parallel pull mode "
        "(an AL2023 NodeConfig in the EC2NodeClass userData); nodeadm ignores it below 4 vCPUs / 7 GiB and the AMI project asks for 600 MiB/s or more of root-volume throughput",
    )

    def problems(self, path: str) -> Iterator[ConfigError]:
        for key in ("instance_categories", "instance_families", "instance_types", "capacity_types"):
            yield from duplicate_errors(f"{path}.{camel(key)}", getattr(self, key))
        if not self.capacity_types:
            yield ConfigError(f"{path}.capacityTypes", self.capacity_types, "allowed: at least one of on-demand, spot, reserved")
        terms = f"{path}.capacityReservationSelectorTerms"
        if "reserved" in self.capacity_types and not self.capacity_reservation_selector_terms:
            yield ConfigError(terms, [], "required when gpuPool.capacityTypes includes reserved; allowed: a list of {id: cr-...} or {tags: {...}, ownerId: ...} terms")
        if self.capacity_reservation_selector_terms and "reserved" not in self.capacity_types:
            yield ConfigError(terms, to_raw(self.capacity_reservation_selector_terms), "allowed only when gpuPool.capacityTypes includes reserved")
        if self.mode == "auto":
            # Auto Mode's gpu-pool uses its built-in `default` NodeClass (k8s.builders.gpu_objects), which
            # sizes the root volume itself: the key would do nothing
            why = {
                "root_volume_size_gib": "Auto Mode's default NodeClass sizes the root volume",
                "node_repair": "EKS Auto Mode repairs its nodes itself",
                **{key: "Auto Mode's default NodeClass sets its nodes' storage and user data" for key in IMAGE_PULL_KEYS},
            }
            for key, reason in why.items():
                if key in self.model_fields_set:
                    yield ConfigError(f"{path}.{camel(key)}", getattr(self, key), f"does nothing in gpuPool.mode auto ({reason}); allowed: unset, or gpuPool.mode karpenter")
        if "reserved" in self.capacity_types and self.mode == "auto":
            # the terms live on the node class, and Auto Mode's built-in `default` NodeClass selects none
            yield ConfigError(f"{path}.capacityTypes", self.capacity_types, "reserved needs gpuPool.mode: karpenter (Auto Mode's default NodeClass selects no capacity reservations); allowed: on-demand, spot")
        if self.mode == "karpenter":
            yield from self._image_pull_problems(path)
        pool = self.allowed_types()
        if not pool:
            yield ConfigError(f"{path}.instanceTypes", self.instance_types, "no catalog type matches instanceCategories/instanceFamilies/instanceTypes together")
            return
        if self.fast_image_pull and self.mode == "karpenter":
            # nodeadm v20260724 internal/containerd/config.go UseSOCISnapshotter: memory >= 7 GiB and >= 4000 millicores, else the gate is ignored
            small = sorted(i.name for i in pool if i.vcpu < FAST_PULL_MIN_VCPU or i.memory_gib < FAST_PULL_MIN_MEMORY_GIB)
            if small:
                yield ConfigError(f"{path}.fastImagePull", True, f"nodeadm ignores FastImagePull below {FAST_PULL_MIN_VCPU} vCPUs or {FAST_PULL_MIN_MEMORY_GIB} GiB, and the pool allows {', '.join(small)}; allowed: false, or a pool without them")
        smallest = min(i.gpus for i in pool)
        if self.gpu_limit < smallest:
            yield ConfigError(f"{path}.gpuLimit", self.gpu_limit, f"allowed: at least one node's GPUs ({smallest} for the smallest type in the pool)")

    def allowed_types(self) -> list[catalog.GpuInstance]:
        return catalog.types_in_pool(self.instance_categories, self.instance_families, self.instance_types)

    def _image_pull_problems(self, path: str) -> Iterator[ConfigError]:
        iops = self.root_volume_iops if self.root_volume_iops is not None else GP3_BASELINE_IOPS
        if self.root_volume_throughput is not None and self.root_volume_throughput > iops * GP3_MIB_PER_IOPS:
            # EBS User Guide, "General Purpose SSD volumes": gp3 throughput is at most 0.25 MiB/s per provisioned IOPS
            need = math.ceil(self.root_volume_throughput / GP3_MIB_PER_IOPS)
            yield ConfigError(f"{path}.rootVolumeThroughput", self.root_volume_throughput, f"gp3 allows at most 0.25 MiB/s per IOPS ({iops} IOPS: {int(iops * GP3_MIB_PER_IOPS)} MiB/s); allowed: rootVolumeIops of {need} or more, or less throughput")
        if self.fast_image_pull and self.instance_store_policy is None and (self.root_volume_throughput or GP3_BASELINE_MIBPS) < FAST_PULL_MIN_MIBPS:
            # amazon-eks-ami nodeadm/doc/examples.md, "Enabling fast image pull": at least 600 MiB/s, "below that value, you may see longer image pull times"
            yield ConfigError(
                f"{path}.fastImagePull", True,
                f"parallel pull writes to the root volume, and below {FAST_PULL_MIN_MIBPS} MiB/s (now {self.root_volume_throughput or GP3_BASELINE_MIBPS}) the EKS AMI project warns it may pull slower; "
                f"allowed: with rootVolumeThroughput of {FAST_PULL_MIN_MIBPS} or more (and rootVolumeIops of {math.ceil(FAST_PULL_MIN_MIBPS / GP3_MIB_PER_IOPS)} or more), or instanceStorePolicy RAID0",
            )

    def node_class_storage(self) -> dict[str, Any]:
        """The image pull levers as ``k8s.builders.gpu_objects.ec2_node_class`` takes them."""
        return {"root_volume_throughput": self.root_volume_throughput, "root_volume_iops": self.root_volume_iops, "instance_store_policy": self.instance_store_policy, "fast_image_pull": self.fast_image_pull}


class EfaSettings(Section):
    enabled: Bool = opt(False, "EFA device plugin and an EFA NodePool for multi-node jobs")
    availability_zone: str | None = opt(None, "the one AZ EFA nodes run in (required when enabled): a zone of the cluster", check=_pattern(AZ_RE, "an AZ name such as us-west-2a"))
    instance_types: list[str] = opt(["p5.48xlarge"], "EFA-capable instance types for the EFA pool", check=_IN_CATALOG)

    def problems(self, path: str) -> Iterator[ConfigError]:
        for i, t in enumerate(self.instance_types):
            if not catalog.lookup(t).efa:
                efa_types = ", ".join(sorted(n for n, info in catalog.catalog().items() if info.efa))
                yield ConfigError(f"{path}.instanceTypes[{i}]", t, f"{t} has no EFA; allowed: {efa_types}")
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
# Trainer releases with the TrainJobStatus feature gate (kubeflow/trainer pkg/features/features.go: alpha in v2.3.0)
STATUS_SERVER_VERSIONS = frozenset({"v2.3.0"})


class TrainerSettings(Section):
    version: str = opt(versions.DEFAULT_TRAINER_VERSION, "Kubeflow Trainer release", choices=tuple(versions.TRAINER_VERSIONS))
    max_restarts: Int = opt(3, "whole-job restarts (JobSet failurePolicy.maxRestarts)", ge=0, le=100)
    shm_size: str = opt("64Gi", "size of the memory-backed /dev/shm volume", check=SchemaCheck(_shm_size, {"pattern": _K8S_QUANTITY_RE.pattern}))
    termination_grace_seconds: Int = opt(
        120, "seconds a training pod has from SIGTERM (Kueue preemption, a drain) to SIGKILL to finish its step and save a checkpoint: the runtimes' terminationGracePeriodSeconds (not on a spot interruption, whose drain skips training pods: they carry karpenter.sh/do-not-disrupt)",
        ge=30, le=3600,
    )
    grace_classes: list[Int] = opt(
        [], "further grace periods (seconds, 30 to 3600) offered as runtimes of their own (<runtime>-grace<N>): trainctl submit --grace-seconds picks one "
        "(a job's grace period lives in its runtime, since Kueue drops it from a TrainJob: k8s/builders/runtimes.py); the stack's jobs' trainjobs.<job>.terminationGraceSeconds get theirs without being listed",
    )
    progress_in_status: Bool = opt(
        False, "turn on Trainer v2.3.0's TrainJobStatus feature (alpha): the programs' progress, ETA and metrics in TrainJob.status.trainerStatus. "
        "Off by default: its status server checks job tokens by OIDC discovery at the service-account issuer with a client that trusts only the cluster CA, "
        "which EKS's issuer (oidc.eks.<region>.amazonaws.com, a public certificate) fails, and the controller then stops at start (docs/trainer-upgrade.md); "
        "progress then comes from the programs' log lines",
    )
    runtimes: list[str] = opt(list(RUNTIME_NAMES), "ClusterTrainingRuntimes to install (the runtimes of enabled jobs are always installed)", choices=RUNTIME_NAMES)
    allow_upgrade_from: str | None = opt(None, "installed Trainer release the docs/trainer-upgrade.md procedure was run for", choices=tuple(versions.TRAINER_VERSIONS))

    def problems(self, path: str) -> Iterator[ConfigError]:
        yield from duplicate_errors(f"{path}.runtimes", self.runtimes)
        for i, grace in enumerate(self.grace_classes):
            if not 30 <= grace <= 3600 or grace == self.termination_grace_seconds or grace in self.grace_classes[:i]:
                yield ConfigError(f"{path}.graceClasses[{i}]", grace, f"allowed: an integer from 30 to 3600, once, other than trainer.terminationGraceSeconds ({self.termination_grace_seconds}: every runtime has it)")
        if self.progress_in_status and self.version not in STATUS_SERVER_VERSIONS:
            yield ConfigError(f"{path}.progressInStatus", True, f"Trainer {self.version} has no TrainJobStatus feature; allowed: false, or trainer.version {', '.join(sorted(STATUS_SERVER_VERSIONS))}")


