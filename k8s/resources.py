"""The one place a Kubernetes manifest (a plain dict built by a pure function) becomes a
Pulumi resource. Built-in kinds use the typed pulumi-kubernetes classes, everything else
``CustomResource``; both take the manifest's fields unchanged."""

from __future__ import annotations

import re
from typing import Any

import pulumi
import pulumi_kubernetes as kube

# apiVersion group -> pulumi_kubernetes module for built-in kinds this project emits.
_BUILTIN_GROUPS = {
    "v1": ("core", "v1"),
    "apps/v1": ("apps", "v1"),
    "storage.k8s.io/v1": ("storage", "v1"),
    "rbac.authorization.k8s.io/v1": ("rbac", "v1"),
    "scheduling.k8s.io/v1": ("scheduling", "v1"),
    "policy/v1": ("policy", "v1"),
    "batch/v1": ("batch", "v1"),
    "networking.k8s.io/v1": ("networking", "v1"),
    "admissionregistration.k8s.io/v1": ("admissionregistration", "v1"),
}


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def resource_name(manifest: dict[str, Any]) -> str:
    """Pulumi logical name: <kind>-[<namespace>-]<name>, the same as the rendered file name."""
    meta = manifest["metadata"]
    parts = [manifest["kind"].lower()] + ([meta["namespace"]] if meta.get("namespace") else []) + [meta["name"]]
    return "-".join(parts)


def apply_manifest(manifest: dict[str, Any], opts: pulumi.ResourceOptions) -> pulumi.CustomResource:
    api_version, kind = manifest["apiVersion"], manifest["kind"]
    name = resource_name(manifest)
    fields = {k: v for k, v in manifest.items() if k not in ("apiVersion", "kind")}
    if api_version in _BUILTIN_GROUPS:
        group, version = _BUILTIN_GROUPS[api_version]
        cls = getattr(getattr(getattr(kube, group), version), kind)
        return cls(name, opts=opts, **{_snake(k): v for k, v in fields.items()})
    if set(fields) - {"metadata", "spec"}:  # top-level fields beside spec (a WorkloadPriorityClass's value)
        return _CustomObject(name, api_version=api_version, kind=kind, fields=fields, opts=opts)
    return kube.apiextensions.CustomResource(name, api_version=api_version, kind=kind, opts=opts, **fields)


class _CustomObject(pulumi.CustomResource):
    """A custom object registered as pulumi-kubernetes registers a CustomResource (type
    ``kubernetes:<apiVersion>:<kind>``, the provider's own version), with every top-level field:
    ``apiextensions.CustomResource`` takes only ``metadata`` and ``spec``."""

    def __init__(self, name: str, *, api_version: str, kind: str, fields: dict[str, Any], opts: pulumi.ResourceOptions):
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(version=k8s_version()))
        super().__init__(f"kubernetes:{api_version}:{kind}", name, {"apiVersion": api_version, "kind": kind, **fields}, opts)


def k8s_version() -> str:
    from pulumi_kubernetes import _utilities

    return _utilities.get_version()
