"""Rules that hold for a real deploy (``pulumi up`` / ``pulumi preview`` against AWS) but not for the
offline render, which also feeds the local control plane: there they are said once as warnings.

* ``trainer.progressInStatus``: Trainer v2.3.0's status server verifies job tokens by OIDC
  discovery at the service-account issuer through ``rest.HTTPClientFor`` of the in-cluster config,
  whose CA replaces the system roots (kubeflow/trainer v2.3.0 ``pkg/statusserver/auth.go`` Init).
  EKS's issuer (``https://oidc.eks.<region>.amazonaws.com/id/...``) presents a public certificate,
  so the discovery fails and the manager exits at start: on EKS the key cannot work, and is refused.
  The local control plane's API server is its own issuer (tools/cluster), where it works.
* Placeholders the shipped stack files carry: the example account ``123456789012`` (AWS's own
  documentation account, e.g. the IAM User Guide's ARN examples) in any value (an ARN of
  ``cluster.adminPrincipalArns``, ``cluster.ci.*RoleArn``, a team's ``principalArns`` ...), and an
  address or CIDR inside the IPv4 documentation ranges of RFC 5737 section 3 (192.0.2.0/24
  TEST-NET-1, 198.51.100.0/24 TEST-NET-2, 203.0.113.0/24 TEST-NET-3), which are never routed on
  the internet: a deploy would grant a role of nobody's account, or open the endpoint to nobody.
* A bucket name ending in ``-example`` in ``tenants.<team>.s3[*].bucket`` (the shipped teams stack's
  ``vision-datasets-example``, ``vision-results-example``): S3 bucket names are global, so such a
  name may be someone else's bucket, and the team's role would be granted it.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from config.schema import ConfigError, to_raw

if TYPE_CHECKING:
    from config.settings import Settings


OFFLINE_NOTICE = "rendered offline, but pulumi up and preview refuse "
"""How the offline render's one warning about these problems begins (__main__.py)."""


def deploy_problems(s: Settings) -> list[ConfigError]:
    found: list[ConfigError] = []
    if s.trainer.progress_in_status:
        found.append(ConfigError(
            "trainer.progressInStatus", True,
            "the Trainer's status server cannot start on EKS (it checks job tokens by OIDC discovery at EKS's issuer, whose public certificate its client does not trust, and the controller exits); "
            "allowed: false on EKS (progress then comes from the programs' log lines; the local control plane, whose API server is its own issuer, runs it)",
        ))
    found += placeholder_problems(s)
    return found


EXAMPLE_ACCOUNT = "123456789012"
DOCUMENTATION_RANGES = tuple(ipaddress.IPv4Network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24"))
"""RFC 5737 section 3: the IPv4 blocks reserved for documentation."""

EXAMPLE_BUCKET_SUFFIX = "-example"
_BUCKET_KEY_RE = re.compile(r"tenants\.[^.]+\.s3\[[0-9]+\]\.bucket")
_ACCOUNT_RE = re.compile(rf"(?<![0-9]){EXAMPLE_ACCOUNT}(?![0-9])")
_IPV4_RE = re.compile(r"(?<![0-9.])(?:[0-9]{1,3}\.){3}[0-9]{1,3}(?:/[0-9]{1,2})?(?![0-9.])")


def placeholder_problems(s: Settings) -> list[ConfigError]:
    """One problem per key whose value holds the example account, a documentation address or an example bucket."""
    found: list[ConfigError] = []
    for key, value in _strings(to_raw(s)):
        if key.split(".", 1)[0] in ("stack", "region"):
            continue
        if _BUCKET_KEY_RE.fullmatch(key) and value.endswith(EXAMPLE_BUCKET_SUFFIX):
            found.append(ConfigError(key, value, f"a bucket name ending in {EXAMPLE_BUCKET_SUFFIX} is a placeholder of the shipped stack files (S3 names are global: it may be someone else's bucket); allowed: your own buckets' names"))
        elif _ACCOUNT_RE.search(value):
            found.append(ConfigError(key, value, f"{EXAMPLE_ACCOUNT} is the example account of AWS's documentation, a placeholder of the shipped stack files; allowed: your own account's ARNs"))
        elif doc := _documentation_range(value):
            found.append(ConfigError(key, value, f"{doc} is an RFC 5737 documentation range (never routed), a placeholder of the shipped stack files; allowed: your own addresses or CIDRs"))
    return found


def _documentation_range(text: str) -> str | None:
    for match in _IPV4_RE.findall(text):
        try:
            net = ipaddress.IPv4Network(match, strict=False)
        except ValueError:
            continue
        for doc in DOCUMENTATION_RANGES:
            if net.subnet_of(doc):  # inside it (0.0.0.0/0 merely contains it)
                return str(doc)
    return None


def _strings(value: Any, key: str = "") -> Iterator[tuple[str, str]]:
    """Every string in the camelCase config with its key path (``a.b[0].c``)."""
    if isinstance(value, dict):
        for k, v in value.items():
            sub = f"{key}.{k}" if key else str(k)
            yield from _strings(v, sub)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _strings(v, f"{key}[{i}]")
    elif isinstance(value, str):
        yield key, value
