"""The settings models of teams, Kueue, observability and smoke checks."""


from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterator
from typing import ClassVar, Literal

from pydantic import ConfigDict, RootModel

from config.checks import _FLOW_LOG_RETENTION, _IN_CATALOG, _PRINCIPAL_ARNS, DNS_LABEL_RE, _cpu_quantity, _pattern, _quantity, duplicate_errors
from config.schema import Bool, ConfigError, Int, SchemaCheck, Section, opt, problems_of

# --- teams (tenants) and Kueue --------------------------------------------------------------

# S3 general purpose bucket names (Amazon S3 User Guide, "General purpose bucket naming rules"): 3-63
# characters of lower-case letters, digits, '.' and '-', beginning and ending with a letter or digit,
# no two adjacent periods, not an IP address, none of the reserved prefixes and suffixes below.
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", re.ASCII)
_BUCKET_RESERVED_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_BUCKET_RESERVED_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")
# A key prefix the role may use: folders of S3's "safe" key characters (S3 User Guide, "Naming Amazon
# S3 objects": letters, digits and ! - _ . * ' ( )), without '*' and '?' (IAM wildcards: they would
# widen the grant) and without '$' (IAM policy variables are ${...}); ending with '/', so that data/
# grants data/... and not data-old/... as well. S3 keys are UTF-8 (the same page: "any UTF-8
# character"), so a folder may hold letters, marks and digits of any script (données/, 数据/): the
# policy document is written with JSON's \u escapes (json.dumps), which keeps it within the
# characters IAM takes (U+0009, U+000A, U+000D, U+0020 to U+00FF: IAM User Guide, "IAM and AWS STS
# quotas"), and its length is counted as written there (an escape is six characters), so the
# role's policy stays within its size limit (S3_GRANTS_MAX).
_S3_PREFIX_RE = re.compile(r"^([A-Za-z0-9!_.'()\u0080-\uFFFF-]+/)+$")
_S3_PREFIX_LETTERS = ("L", "M", "N")  # Unicode general categories beyond ASCII: letters, marks, numbers
S3_PREFIX_MAX = 128
S3_GRANTS_MAX = 10
"""At most this many grants a team: the worst case (the longest bucket names and prefixes, every grant
read-write, each on its own bucket) keeps the role's inline policy under IAM's 10,240 characters
(IAM User Guide, "IAM and AWS STS quotas": inline policies of a role, aggregate; tests/test_team_identity.py)."""


def bucket_problem(name: str) -> str | None:
    """Why ``name`` is not an S3 general purpose bucket name (None when it is one)."""
    allowed = "allowed: an S3 bucket name (3-63 lower-case letters, digits, '.' and '-', starting and ending with a letter or digit), such as vision-datasets"
    if not _BUCKET_RE.fullmatch(name):
        return allowed
    if ".." in name:
        return "an S3 bucket name has no two adjacent periods; " + allowed
    if re.fullmatch(r"\d{1,3}(\.\d{1,3}){3}", name):
        return "an S3 bucket name is not formatted as an IP address; " + allowed
    for reserved in _BUCKET_RESERVED_PREFIXES:
        if name.startswith(reserved):
            return f"S3 reserves bucket names starting with {reserved}; " + allowed
    for reserved in _BUCKET_RESERVED_SUFFIXES:
        if name.endswith(reserved):
            return f"S3 reserves bucket names ending with {reserved}; " + allowed
    return None


def prefix_problem(prefix: str) -> str | None:
    """Why ``prefix`` is not a key prefix a team's role may be granted (None when it is one)."""
    allowed = (
        f"allowed: a folder of the bucket ending with '/', such as datasets/imagenet/ or données/ (letters and digits of any script, and ! - _ . ' ( ), "
        f"at most {S3_PREFIX_MAX} characters as the policy writes them (a character beyond ASCII counts 6), no '*', no '.' or '..' folder); leave prefix out for the whole bucket"
    )
    if not _S3_PREFIX_RE.fullmatch(prefix) or any(not c.isascii() and unicodedata.category(c)[0] not in _S3_PREFIX_LETTERS for c in prefix):
        return allowed
    if len(json.dumps(prefix)) - 2 > S3_PREFIX_MAX:
        return allowed
    if any(part in (".", "..") for part in prefix.split("/")):
        return "a folder named '.' or '..' is not a folder S3 has; " + allowed
    return None


class S3Access(Section):
    """One bucket (or one folder of it) a team's jobs may use, and how."""

    bucket: str | None = opt(None, "the S3 bucket (required), such as vision-datasets", check=SchemaCheck(lambda v: bucket_problem(v), {"pattern": _BUCKET_RE.pattern}))
    prefix: str | None = opt(None, "a folder of the bucket, ending with '/' (such as datasets/imagenet/): the jobs may use only keys under it; unset = the whole bucket", check=SchemaCheck(lambda v: prefix_problem(v), {"pattern": _S3_PREFIX_RE.pattern, "maxLength": S3_PREFIX_MAX}))
    access: Literal["read", "readwrite"] = opt("read", "read: list and get objects; readwrite: also put and delete them (multipart uploads included)")
    cross_account: Bool = opt(
        False, "the bucket belongs to another AWS account (whose bucket policy must also allow the team's role); unset = the grant holds only while the bucket is the stack's own account's (s3:ResourceAccount)"
    )

    def problems(self, path: str) -> Iterator[ConfigError]:
        if self.bucket is None:
            yield ConfigError(f"{path}.bucket", self.bucket, "required: the S3 bucket the team's jobs may use, such as vision-datasets")


class TenantSettings(Section):
    """One team: its namespace, GPU quota and the IAM principals that act in its namespace."""

    gpu_quota: Int | None = opt(
        None, "GPUs the team is guaranteed in each GPU pool (required): its ClusterQueue's nominal quota with Kueue, its namespace's ResourceQuota without", ge=1
    )
    principal_arns: list[str] = opt(
        [], "IAM roles/users of the team: an access entry each, in a Kubernetes group bound to the team's Role in its namespace only", check=_PRINCIPAL_ARNS
    )
    cpu_quota: str | None = opt(None, "CPU the team may request; unset = what its GPUs bring on the pools' nodes (vCPUs per GPU of the largest ratio); cores or millicores such as 64 or 1500m", check=_cpu_quantity)
    memory_quota: str | None = opt(None, "memory the team may request; unset = what its GPUs bring on the pools' nodes", check=_quantity)
    namespace: str | None = opt(None, "the team's namespace; unset = the team name", check=_pattern(DNS_LABEL_RE, "a DNS label such as vision"))
    default_priority: Literal["low", "normal", "high"] = opt("normal", "Kueue priority of the team's jobs unless trainctl submit --priority says otherwise (low jobs are preempted first within the cohort)")
    namespace_view_policy: Bool = opt(
        False, "also associate the AWS-managed AmazonEKSViewPolicy, scoped to the team's namespace: read access to every object there except Secrets (more than the team's Role grants)"
    )
    s3: list[S3Access] = opt(
        [],
        f"S3 buckets or folders the team's jobs may use (at most {S3_GRANTS_MAX}): objects with bucket, optional prefix, access read or readwrite, crossAccount (default false: only while the bucket is the stack's account's); the team gets an IAM role with exactly these "
        "grants, associated (EKS Pod Identity) with its jobs' service account (docs/teams-aws-access.md); empty = no AWS identity",
    )

    def problems(self, path: str) -> Iterator[ConfigError]:
        if self.gpu_quota is None:
            yield ConfigError(f"{path}.gpuQuota", None, "required: the GPUs the team is guaranteed, an integer >= 1")
        yield from duplicate_errors(f"{path}.principalArns", self.principal_arns)
        mixed = sorted({g.bucket for g in self.s3 if g.bucket is not None and {h.cross_account for h in self.s3 if h.bucket == g.bucket} == {True, False}})
        if mixed:
            yield ConfigError(f"{path}.s3", mixed, "each bucket's entries must agree on crossAccount (a bucket belongs to one account)")
        if len(self.s3) > S3_GRANTS_MAX:
            yield ConfigError(f"{path}.s3", len(self.s3), f"allowed: at most {S3_GRANTS_MAX} entries (the role's inline policy must stay under IAM's 10,240 characters); grant a common folder instead")
        seen: dict[tuple[str, str], int] = {}
        for i, grant in enumerate(self.s3):
            where = (grant.bucket or "", grant.prefix or "")
            if where in seen:
                yield ConfigError(f"{path}.s3[{i}]", f"{grant.bucket}/{grant.prefix or ''}", f"the same bucket and prefix as s3[{seen[where]}]; allowed: one entry per folder (access readwrite includes read)")
            seen.setdefault(where, i)


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
        3, "times a job that timed out waiting for its pods is requeued before Kueue deactivates it (waitForPodsReady.requeuingStrategy.backoffLimitCount): it then ends with reason RequeuingLimitExceeded instead of holding quota in a loop", ge=0, le=100
    )


# --- observability and smoke checks ---------------------------------------------------------

# CloudWatch Logs retention periods: the values PutRetentionPolicy accepts for retentionInDays
# (CloudWatch Logs API Reference, PutRetentionPolicy; the same list as network.flowLogRetentionDays).
LOG_RETENTION_DAYS = _FLOW_LOG_RETENTION[1:]


_EMAIL_RE = re.compile(r"^[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}$", re.ASCII)
# user information (RFC 3986 userinfo: https://user:password@host) is allowed: SNS takes HTTPS
# endpoints with basic-auth credentials (SNS Developer Guide, "HTTP/S endpoint ... basic and digest
# access authentication"); such values are never printed (config/schema.py looks_secret)
_USERINFO = r"([A-Za-z0-9._~%!$&'()*+,;=-]+(:[A-Za-z0-9._~%!$&'()*+,;=:-]*)?@)?"
_HTTPS_RE = re.compile(r"^https://" + _USERINFO + r"[A-Za-z0-9.-]+(:\d+)?(/[!-~]*)?$", re.ASCII)


class AlarmsSettings(Section):
    """Where the platform's alarms go: an SNS topic the stack owns, with these subscriptions."""

    enabled: Bool = opt(True, "CloudWatch alarms on an SNS topic (cloudwatch mode) or alert rules (prometheus mode): failed and stalled TrainJobs, GPUs held idle, GPU nodes not ready")
    emails: list[str] = opt([], "e-mail subscriptions of the alarm topic (each confirms by mail)", check=_pattern(_EMAIL_RE, "e-mail addresses such as oncall@example.com"))
    https_endpoints: list[str] = opt([], "HTTPS subscriptions of the alarm topic (a pager's or chat's webhook)", check=_pattern(_HTTPS_RE, "https:// URLs"))
    idle_gpu_percent: Int = opt(5, "GPUs held but idle: average GPU utilization of the cluster's GPU nodes below this for idleMinutes (below 100: at 100 every GPU would always be in alarm)", ge=1, le=99)
    idle_minutes: Int = opt(60, "how long GPUs may sit idle before the alarm (a multiple of 10: the alarm averages 10-minute periods)", ge=10, le=1440)


class ObservabilitySettings(Section):
    mode: Literal["cloudwatch", "prometheus", "none"] = opt(
        "cloudwatch",
        "metrics and logs: the amazon-cloudwatch-observability EKS add-on (Container Insights with GPU/EFA metrics, Fluent Bit logs) and a CloudWatch dashboard; prometheus: dcgm-exporter and kube-prometheus-stack; none: neither",
    )
    alarms: AlarmsSettings = opt(AlarmsSettings(), "alarms and where they go")
    log_retention_days: Int = opt(
        30,
        "days CloudWatch keeps the Container Insights log groups (application, dataplane, host, performance); cloudwatch mode",
        check=SchemaCheck(lambda v: None if v in LOG_RETENTION_DAYS else "allowed: a CloudWatch Logs retention: " + ", ".join(map(str, LOG_RETENTION_DAYS)), {"enum": list(LOG_RETENTION_DAYS)}),
    )


class SmokeChecksSettings(Section):
    enabled: Bool = opt(False, "run a one-shot GPU check at deploy (nvidia-smi and a small CUDA matmul on a gpu-pool node); pulumi up waits for it to pass")
    instance_type: str | None = opt(None, "GPU instance type for the check; unset = the gpu-pool's type with the fewest GPUs", check=_IN_CATALOG)


