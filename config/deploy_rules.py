"""Rules that hold for a real deploy (``pulumi up`` / ``pulumi preview`` against AWS) but not for the
offline render, which also feeds the local control plane: there they are said once as warnings.

* ``trainer.progressInStatus``: Trainer v2.3.0's status server verifies job tokens by OIDC
  discovery at the service-account issuer through ``rest.HTTPClientFor`` of the in-cluster config,
  whose CA replaces the system roots (kubeflow/trainer v2.3.0 ``pkg/statusserver/auth.go`` Init).
  EKS's issuer (``https://oidc.eks.<region>.amazonaws.com/id/...``) presents a public certificate,
  so the discovery fails and the manager exits at start: on EKS the key cannot work, and is refused.
  The local control plane's API server is its own issuer (tools/cluster), where it works.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from config.schema import ConfigError

if TYPE_CHECKING:
    from config.settings import Settings


def deploy_problems(s: Settings) -> list[ConfigError]:
    found: list[ConfigError] = []
    if s.trainer.progress_in_status:
        found.append(ConfigError(
            "trainer.progressInStatus", True,
            "the Trainer's status server cannot start on EKS (it checks job tokens by OIDC discovery at EKS's issuer, whose public certificate its client does not trust, and the controller exits); "
            "allowed: false on EKS (progress then comes from the programs' log lines; the local control plane, whose API server is its own issuer, runs it)",
        ))
    return found
