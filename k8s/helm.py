"""The one place a pinned Helm chart becomes a Pulumi resource."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as kube


def release(name: str, *, chart: str, version: str, namespace: str, values: dict, opts: pulumi.ResourceOptions, repo: str | None = None, create_namespace: bool = False, timeout_s: int = 600) -> kube.helm.v3.Release:
    """A Helm release that waits for its workloads to be ready (``skip_await`` off), so
    resources that depend on it are created only once it serves."""
    return kube.helm.v3.Release(
        name,
        name=name,
        chart=chart,
        version=version,
        namespace=namespace,
        create_namespace=create_namespace,
        repository_opts=kube.helm.v3.RepositoryOptsArgs(repo=repo) if repo else None,
        values=values,
        skip_await=False,
        atomic=True,
        cleanup_on_fail=True,
        timeout=timeout_s,
        opts=opts,
    )
