"""CI preflight: can this runner reach the stack's EKS API endpoint?

Usage: python -m tools.ci_reach --stack dev [--runner-variable PREVIEW_RUNNER_DEV]

A preview or deploy on a runner that cannot reach the endpoint does not stop at once: the
Kubernetes provider marks the cluster unreachable and a preview goes on without it, so the plan on
the pull request silently misses what the cluster would say. This step fails first, with one line
saying what to change. Exit 0: the endpoint answers a TCP connection on 443, or the cluster does not
exist yet (the first ``pulumi up`` creates it). Exit 1: not reachable, or the stack file is invalid.
Needs the AWS CLI and credentials that may call ``eks:DescribeCluster``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from urllib.parse import urlsplit

from config.schema import PROJECT, ConfigError
from config.settings import Settings, load_settings
from config.stack_file import StackFileError, load_stack_file

PROJECT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONNECT_TIMEOUT_S = 10.0


class NoCluster(Exception):
    """The stack's cluster does not exist yet."""


def stack_settings(stack: str, project_dir: str = PROJECT_DIR) -> Settings:
    config = load_stack_file(os.path.join(project_dir, f"Pulumi.{stack}.yaml")).get("config") or {}
    raw = {k.partition(":")[2]: v for k, v in config.items() if k.startswith(f"{PROJECT}:")}
    return load_settings(raw, stack=stack, region=str(config.get("aws:region") or ""))


def endpoint_of(cluster: str, region: str) -> str:
    """The cluster's API endpoint (``aws eks describe-cluster``); :class:`NoCluster` when EKS has none
    of that name (error code ResourceNotFoundException, EKS API Reference, DescribeCluster)."""
    try:
        proc = subprocess.run(
            ["aws", "eks", "describe-cluster", "--name", cluster, "--region", region, "--output", "json"],
            capture_output=True, text=True, check=False,
        )
    except FileNotFoundError:
        raise RuntimeError("the AWS CLI (aws) is not installed on this runner; the preview's kubeconfig needs it too (aws eks get-token)") from None
    if proc.returncode != 0:
        if "ResourceNotFoundException" in proc.stderr:
            raise NoCluster(cluster)
        raise RuntimeError(f"aws eks describe-cluster --name {cluster} failed: {' '.join(proc.stderr.split())}")
    return json.loads(proc.stdout)["cluster"]["endpoint"]


def connect_error(endpoint: str, timeout: float = CONNECT_TIMEOUT_S) -> str | None:
    """None when a TCP connection to the endpoint's host and port (443 unless the URL names one)
    opens; else why not."""
    url = urlsplit(endpoint)
    try:
        with socket.create_connection((url.hostname or "", url.port or 443), timeout=timeout):
            return None
    except OSError as err:
        return str(err) or type(err).__name__


def advice(settings: Settings, runner_variable: str) -> str:
    """What to change so that the job runs where the endpoint is reachable."""
    c = settings.cluster
    if not c.endpoint_public_access:
        return (f"the endpoint is private (cluster.endpointPublicAccess false): run the job on a runner inside the VPC or a network routed to it, "
                f"and set the repository variable {runner_variable} to its label as JSON, e.g. [\"self-hosted\", \"{settings.cluster_name}\"]")
    return (f"the public endpoint admits only cluster.publicAccessCidrs ({', '.join(c.public_access_cidrs)}): set the repository variable {runner_variable} "
            f"to a runner inside the VPC or one whose egress address is in that list")


def check(stack: str, runner_variable: str, *, describe: Callable[[str, str], str] = endpoint_of, connect: Callable[[str], str | None] = connect_error) -> tuple[int, str]:
    """(exit code, the one line to print)."""
    try:
        settings = stack_settings(stack)
    except (ConfigError, StackFileError) as err:
        return 1, f"::error::{stack}: {' '.join(str(err).split())}"
    name, region = settings.cluster_name, settings.region
    try:
        endpoint = describe(name, region)
    except NoCluster:
        return 0, f"{stack}: no EKS cluster {name} in {region} yet; the first pulumi up creates it, nothing to reach"
    except RuntimeError as err:
        return 1, f"::error::{stack}: {err}"
    why = connect(endpoint)
    if why is None:
        return 0, f"{stack}: {endpoint} is reachable from this runner"
    return 1, f"::error::{stack}: this runner cannot reach the EKS API endpoint {endpoint} ({why}); {advice(settings, runner_variable)} (docs/deploying.md: CI previews of a private cluster)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--stack", required=True)
    ap.add_argument("--runner-variable", default="PREVIEW_RUNNER_<STACK>", help="the repository variable that picks this job's runner")
    args = ap.parse_args(argv)
    code, line = check(args.stack, args.runner_variable)
    print(line, file=sys.stderr if code else sys.stdout)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
