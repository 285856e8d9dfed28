"""Value checks of the stack config's fields: each returns the "allowed" text for a bad value."""


from __future__ import annotations

import difflib
import ipaddress
import re
from collections.abc import Callable, Iterator
from typing import Any

from config import aws_facts, catalog
from config.failed import Failed, FailedList
from config.schema import ConfigError, SchemaCheck

# --- value checks (return the "allowed" text when the value is bad) -------------------------

_INSTANCE_TYPE_RE = re.compile(r"^([a-z]+)(\d+)([a-z-]*)\.(nano|micro|small|medium|large|\d*xlarge|metal(-\d+xl)?)$", re.ASCII)
# Kubernetes quantities (k8s.io/apimachinery resource.Quantity's grammar): an optionally signed
# decimal ("4.", ".5", "+4"), then a binary SI, decimal SI or decimal-exponent suffix ("1e9", "129E6")
_K8S_QUANTITY_RE = re.compile(r"^\+?(\d+(\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|[eE][+-]?\d+)?$", re.ASCII)
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


def _principal_arns(values: list[str] | str) -> str | None:
    """A principal ARN (a list's items are judged one by one where a field holds a list)."""
    for v in values if isinstance(values, list) else [values]:
        if _ARN_PRINCIPAL_RE.fullmatch(v):
            continue
        if m := _STS_SESSION_RE.fullmatch(v):
            return f"a session of a role, not a principal EKS accepts; allowed: the role itself, arn:{m[1]}:iam::{m[2]}:role/{m[3]}"
        return "allowed: IAM role or user ARNs such as arn:aws:iam::123456789012:role/Admin"
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


from config.cidrs import WIDEST_PUBLIC_CIDR, too_open  # noqa: E402, F401  (part of this module's interface)


def _cidr_list(values: list[str] | str) -> str | None:
    for v in values if isinstance(values, list) else [values]:
        if _public_cidr(v):
            return "not an IPv4 CIDR block; allowed: IPv4 CIDR blocks such as 203.0.113.0/24"
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
    return float(m.group(1)) * suffix_factor(m.group(3) or "")


def suffix_factor(suffix: str) -> float:
    """The factor of a quantity's suffix: binary or decimal SI, or a decimal exponent (``e9``)."""
    if suffix[:1] in ("e", "E"):
        return 10.0 ** int(suffix[1:])
    return float(_QUANTITY_FACTORS[suffix])


# A CPU quantity: cores, decimal cores or millicores (Kubernetes "Resource units in Kubernetes": 0.5
# and 500m are the same), optionally with a decimal SI suffix.
_CPU_QUANTITY_RE = re.compile(r"^\+?(\d+(\.\d*)?|\.\d+)(m|k|M|G|T|P|E|[eE][+-]?\d+)?$", re.ASCII)


def cpu_cores(quantity: str) -> float:
    """CPUs of a CPU quantity :func:`_cpu_quantity` accepted: ``2``, ``0.5``, ``1500m``, ``2k``, ``1e3``."""
    m = _CPU_QUANTITY_RE.fullmatch(quantity)
    assert m is not None
    suffix = m.group(3) or ""
    return float(m.group(1)) / 1000 if suffix == "m" else float(m.group(1)) * suffix_factor(suffix)


def _cpu_quantity(value: str) -> str | None:
    m = _CPU_QUANTITY_RE.fullmatch(value)
    if not m or float(m.group(1)) <= 0:
        return "allowed: a positive CPU quantity such as 16, 0.5 or 1500m"
    return None


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


def duplicates(values: list) -> list[tuple[int, Any, int]]:
    """Each repeated item of a list: (its index, the item, the index of its first occurrence)."""
    first: dict[Any, int] = {}
    found = []
    for i, v in enumerate(values):
        if v in first:
            found.append((i, v, first[v]))
        first.setdefault(v, i)
    return found


def duplicate_errors(key: str, values: list, allowed: str = "allowed: a list without duplicates", same: Callable[[Any], Any] | None = None) -> Iterator[ConfigError]:
    """A line per repeated item of the list at ``key``, naming its index, its value as given and
    its first occurrence; ``same`` normalises the items compared (``str.lower``). A list with
    items that failed their own check (:class:`config.failed.FailedList`): its items that passed,
    by their indexes in the list given."""
    name = key.rsplit(".", 1)[-1]
    if isinstance(values, FailedList):
        pairs = values.parsed
    elif isinstance(values, Failed):
        return
    else:
        pairs = list(enumerate(values))
    compared = [same(v) if same else v for _, v in pairs]
    for n, _item, first in duplicates(compared):
        yield ConfigError(f"{key}[{pairs[n][0]}]", pairs[n][1], f"also {name}[{pairs[first][0]}]; {allowed}")


_IN_CATALOG = SchemaCheck(_in_catalog, {"enum": sorted(catalog.catalog())})
_FLOW_LOG_RETENTION = (0, 1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653)
_SUBNET_ID = _pattern(re.compile(r"^subnet-[0-9a-f]{8,17}$", re.ASCII), "subnet ids such as subnet-0abc1234")




# --- ARNs of regional resources ------------------------------------------------------------

# Every ARN-valued setting whose AWS service uses only a resource of its own Region: (key, how to
# read it from the settings (None: unset or unused), what it is, its service in the ARN, why).
# IAM ARNs (adminPrincipalArns, ci.*RoleArn, tenants.<team>.principalArns) are global: only their
# partition is checked (config/settings.py _arn_rules).
REGIONAL_ARNS: tuple[tuple[str, Any, str, str, str], ...] = (
    # EKS User Guide, "Encrypt Kubernetes secrets with KMS on existing clusters": the key must be in the cluster's Region
    ("cluster.secretsKmsKeyArn", lambda s: s.cluster.secrets_kms_key_arn, "a KMS key", "kms", "EKS cannot use a key of another region"),
    # ACM User Guide, "Supported Regions": certificates are regional; an ALB's HTTPS listener takes
    # a certificate of the load balancer's own Region (ELB User Guide, "SSL certificates")
    ("portal.certificateArn", lambda s: s.portal.certificate_arn if s.portal.enabled else None, "an ACM certificate", "acm",
     "an ALB uses only certificates of its own region (ACM certificates are regional; request or import one there)"),
)


def regional_arn_problems(s: Any, region: str, partition: str) -> Iterator[ConfigError]:
    """A line for each ARN of :data:`REGIONAL_ARNS` outside the stack's Region or partition."""
    for key, read, what, service, why in REGIONAL_ARNS:
        arn = read(s)
        if arn is None:
            continue
        _, arn_part, _, arn_region, *_ = arn.split(":")
        if (arn_part, arn_region) != (partition, region):
            yield ConfigError(key, arn, f"allowed: {what} of the stack's region and partition (arn:{partition}:{service}:{region}:...); {why}")
