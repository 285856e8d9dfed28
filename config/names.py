"""Physical AWS names that fit each service's limits and stay unique.

Cluster names may be 100 characters long (EKS allows that, see ``_CLUSTER_NAME_RE`` in
config/settings.py), while an IAM role name may have 64. Cutting ``<cluster>-karpenter-node`` and
``<cluster>-karpenter-controller`` at 64 characters gives both roles the same name. ``aws_name``
keeps a name as it is when it fits and otherwise shortens it to
``<readable prefix>-<hash8>-<suffix>``, where ``hash8`` comes from the whole unshortened name:
distinct inputs get distinct names, the same input always gets the same name, and names that
already fit (every stack deployed so far) do not change.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

HASH_LEN = 8
SEP = "-"


def aws_name(*parts: str, limit: int, allowed: str = r"[A-Za-z0-9_-]", sep: str = SEP, hash_len: int = HASH_LEN) -> str:
    """``sep.join(parts)`` when it fits ``limit`` and uses only characters matching ``allowed``
    (a regex for one character, ASCII classes); otherwise ``<first part, cut>-<hash>-<other parts>``.

    The hash is the first ``hash_len`` hex digits of SHA-256 over the joined name, so two inputs
    can only share a shortened name if their hashes collide (2**-32 for the default length).
    When the suffix alone leaves no room for a prefix, the joined name is cut instead and the hash
    goes last. Characters outside ``allowed`` become ``sep`` (and force the hashed form, so that
    two names differing only in such characters still differ)."""
    if not parts or any(not isinstance(p, str) or not p for p in parts):
        raise ValueError(f"aws_name needs non-empty string parts, got {parts!r}")
    if not re.fullmatch(allowed, sep, re.ASCII):
        raise ValueError(f"separator {sep!r} is not an allowed character")
    if limit < hash_len + 2:
        raise ValueError(f"limit {limit} leaves no room for a {hash_len}-character hash")
    full = sep.join(parts)
    one = re.compile(allowed, re.ASCII)
    cleaned = ["".join(c if one.fullmatch(c) else sep for c in p) for p in parts]
    if len(full) <= limit and sep.join(cleaned) == full:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:hash_len]
    suffix = sep.join(cleaned[1:])
    room = limit - hash_len - len(sep) - (len(sep) + len(suffix) if suffix else 0)
    if room >= 1:
        prefix = cleaned[0][:room].rstrip(sep)
        return sep.join(p for p in (prefix, digest, suffix) if p)
    head = sep.join(cleaned)[: limit - hash_len - len(sep)].rstrip(sep)
    return sep.join(p for p in (head, digest) if p)


@dataclass(frozen=True)
class NameRule:
    """What one AWS name may be: at most ``limit`` characters, each matching ``allowed``, and, where
    the service says more (separators only between alphanumerics, a reserved prefix), the whole
    name matching ``pattern``."""

    limit: int
    allowed: str
    source: str
    pattern: str | None = None

    def name(self, *parts: str, sep: str = SEP) -> str:
        """The one normaliser of every AWS name the stack builds: :func:`aws_name` (names that
        already fit stay as they are), and where that breaks ``pattern``, each part reduced to
        alphanumeric runs joined by ``sep`` (lowercase where the service allows no capitals) with
        the hash of the whole original name, so two names that normalise alike stay apart."""
        got = aws_name(*parts, limit=self.limit, allowed=self.allowed, sep=sep)
        if self.fits(got):
            return got
        lower = not re.fullmatch(self.allowed, "A", re.ASCII)
        tidy = [t for t in (re.sub(r"[^A-Za-z0-9]+", sep, p.lower() if lower else p).strip(sep) for p in parts) if t]
        digest = hashlib.sha256(sep.join(parts).encode()).hexdigest()[:HASH_LEN]
        suffix = sep.join(tidy[1:])
        room = self.limit - len(digest) - len(sep) - (len(sep) + len(suffix) if suffix else 0)
        for candidate in (sep.join(x for x in ((tidy[0] if tidy else "")[: max(room, 0)].strip(sep), digest, suffix) if x), sep.join(x for x in (digest, suffix) if x)[: self.limit].strip(sep)):
            if self.fits(candidate):
                return candidate
        raise ValueError(f"no valid name for {parts!r} under {self.source}")

    def fits(self, name: str) -> bool:
        return (1 <= len(name) <= self.limit and all(re.fullmatch(self.allowed, c, re.ASCII) for c in name)
                and (self.pattern is None or re.fullmatch(self.pattern, name, re.ASCII) is not None))


# Limits, each checked against AWS's own documentation (API reference pages unless noted).
IAM_ROLE = NameRule(64, r"[\w+=,.@-]", "IAM API Reference, CreateRole / Role: RoleName length 1-64, pattern [\\w+=,.@-]+")
IAM_POLICY = NameRule(128, r"[\w+=,.@-]", "IAM API Reference, CreatePolicy / PolicyDetail: PolicyName length 1-128, pattern [\\w+=,.@-]+")
SQS_QUEUE = NameRule(80, r"[A-Za-z0-9_-]", "SQS API Reference, CreateQueue: QueueName up to 80 characters, alphanumerics, hyphens and underscores")
PLACEMENT_GROUP = NameRule(255, r"[\x20-\x7e]", "EC2 API Reference, CreatePlacementGroup: GroupName up to 255 ASCII characters")
EKS_CLUSTER = NameRule(100, r"[A-Za-z0-9_-]", "EKS API Reference, CreateCluster: name up to 100 characters, alphanumerics, hyphens, underscores, starting alphanumeric")
# The EKS API reference gives no length for nodegroupName; 63 is what the AWS provider documents
# and enforces (pulumi_aws eks.NodeGroup, node_group_name: "can't be longer than 63 characters").
EKS_NODE_GROUP = NameRule(63, r"[A-Za-z0-9_-]", "pulumi-aws / terraform-provider-aws eks NodeGroup node_group_name: at most 63 characters, starting with a letter or digit")
EVENT_RULE = NameRule(64, r"[.\-_A-Za-z0-9]", "EventBridge API Reference, PutRule / Rule: Name length 1-64, pattern [\\.\\-_A-Za-z0-9]+")
LOG_GROUP = NameRule(512, r"[.\-_/#A-Za-z0-9]", "CloudWatch Logs API Reference, CreateLogGroup: logGroupName length 1-512, pattern [\\.\\-_/#A-Za-z0-9]+")
# SSM counts the parameter's whole ARN, arn:<partition>:ssm:<region>:<account>:parameter, against
# 1011 characters (PutParameter / AWS::SSM::Parameter docs); that prefix stays under 64 characters.
SSM_PARAMETER = NameRule(1011 - 64, r"[A-Za-z0-9_./-]", "SSM API Reference / CloudFormation AWS::SSM::Parameter: name incl. its ARN at most 1011 characters, a-zA-Z0-9_.- and /")
# ECR repository names are lowercase; the API's pattern also wants every '.', '_', '-' or '/'
# between two alphanumerics, which names made of a cluster name and a suffix keep.
ECR_REPOSITORY = NameRule(256, r"[a-z0-9._/-]", "ECR API Reference, CreateRepository: repositoryName length 2-256, lowercase letters, digits and . _ - / (pattern (?:[a-z0-9]+(?:[._-][a-z0-9]+)*/)*[a-z0-9]+(?:[._-][a-z0-9]+)*)",
                          pattern=r"(?=.{2})(?:[a-z0-9]+(?:[._-][a-z0-9]+)*/)*[a-z0-9]+(?:[._-][a-z0-9]+)*")
LOAD_BALANCER = NameRule(32, r"[A-Za-z0-9-]", "Elastic Load Balancing API Reference, CreateLoadBalancer: Name at most 32 characters, alphanumerics and hyphens, must not begin or end with a hyphen, must not begin with \"internal-\"",
                         pattern=r"(?!internal-)[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?")
SNS_TOPIC = NameRule(256, r"[A-Za-z0-9_-]", "SNS API Reference, CreateTopic: Name 1-256 ASCII letters, digits, underscores and hyphens")
METRIC_ALARM = NameRule(255, r"[\x20-\x7e]", "CloudWatch API Reference, PutMetricAlarm: AlarmName length 1-255")
METRIC_FILTER = NameRule(512, r"[^:*]", "CloudWatch Logs API Reference, PutMetricFilter: filterName length 1-512, pattern [^:*]*")
# Not a resource name, but the one other string derived from the cluster name that has a limit:
# the "Name" tag (tag values at most 256 Unicode characters; AWS tagging restrictions).
TAG_VALUE = NameRule(256, r"[\s\S]", "AWS tagging restrictions (e.g. EC2 / Batch user guides): tag value at most 256 Unicode characters")

# Where each rule applies in a plan: (Pulumi type token, input key) -> rule.
# pulumi-eks components appear under mocks as eks:index:* with camelCase inputs.
NAME_RULES: dict[tuple[str, str], NameRule] = {
    ("aws:iam/role:Role", "name"): IAM_ROLE,
    ("aws:iam/policy:Policy", "name"): IAM_POLICY,
    ("aws:iam/rolePolicy:RolePolicy", "name"): IAM_POLICY,
    ("aws:sqs/queue:Queue", "name"): SQS_QUEUE,
    ("aws:ec2/placementGroup:PlacementGroup", "name"): PLACEMENT_GROUP,
    ("aws:eks/cluster:Cluster", "name"): EKS_CLUSTER,
    ("eks:index:Cluster", "name"): EKS_CLUSTER,
    ("aws:eks/nodeGroup:NodeGroup", "nodeGroupName"): EKS_NODE_GROUP,
    ("eks:index:ManagedNodeGroup", "nodeGroupName"): EKS_NODE_GROUP,
    ("aws:cloudwatch/eventRule:EventRule", "name"): EVENT_RULE,
    ("aws:cloudwatch/logGroup:LogGroup", "name"): LOG_GROUP,
    ("aws:ssm/parameter:Parameter", "name"): SSM_PARAMETER,
    ("aws:ecr/repository:Repository", "name"): ECR_REPOSITORY,
    ("aws:sns/topic:Topic", "name"): SNS_TOPIC,
    ("aws:cloudwatch/metricAlarm:MetricAlarm", "name"): METRIC_ALARM,
    ("aws:cloudwatch/logMetricFilter:LogMetricFilter", "name"): METRIC_FILTER,
    ("aws:cloudwatch/logMetricFilter:LogMetricFilter", "logGroupName"): LOG_GROUP,
}
