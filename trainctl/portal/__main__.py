"""The portal in the cluster: ``python -m trainctl.portal [--config FILE] [--port P]``. It reads
its settings (the Region, the ALB's ARN prefix, the teams' logins) from the ConfigMap the stack
mounts (k8s/builders/portal.py) and calls the API server with its service account, which may only
impersonate the teams' portal users and groups."""

from __future__ import annotations

import argparse
import json
import sys

from trainctl.portal.identity import TeamLogin

DEFAULT_CONFIG = "/etc/portal/portal.json"
# Longer than the ALB's idle timeout (60 s by default: ELB User Guide, "Application Load Balancers",
# connection idle timeout; k8s/builders/portal.py sets no other): were the portal to close an idle
# keep-alive connection first (uvicorn's default timeout_keep_alive is 5 s), the ALB could send a
# request on it as it closes and answer 502 (ELB User Guide, "Troubleshoot your Application Load
# Balancers", HTTP 502: a target that closes the connection while the ALB sends on it; the guide
# asks for a target keep-alive longer than the ALB's idle timeout).
KEEP_ALIVE_S = 65


def settings_of(doc: dict):
    from trainctl.portal.app import Settings

    teams = {t: TeamLogin(namespace=v["namespace"], groups=frozenset(v.get("groups") or []), emails=frozenset(e.lower() for e in v.get("emails") or []), gpu_quota=v.get("gpuQuota")) for t, v in doc["teams"].items()}
    return Settings(mode="alb", region=doc["region"], signer=doc["signer"], teams=teams, bearer_tokens=doc.get("apiBearerTokens") is True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainctl.portal")
    ap.add_argument("--config", default=DEFAULT_CONFIG)
    ap.add_argument("--port", type=int, default=8080)
    args = ap.parse_args(argv)
    import uvicorn
    from kubernetes import client, config

    from trainctl.portal.app import create_app

    with open(args.config) as f:
        settings = settings_of(json.load(f))
    base = client.Configuration()
    config.load_incluster_config(client_configuration=base)
    uvicorn.run(create_app(base, settings), host="0.0.0.0", port=args.port, log_level="info", proxy_headers=False, timeout_keep_alive=KEEP_ALIVE_S)  # noqa: S104  (the pod's port; the NetworkPolicy admits only the ALB)
    return 0


if __name__ == "__main__":
    sys.exit(main())
