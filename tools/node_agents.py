"""Which node agents a rendered plan installs, with which values, and the node kinds it makes; then
``k8s/builders/node_agents.py``'s check of every agent against every node kind it must run on.

Usage: python -m tools.node_agents --stack dev   (prints every finding; exit 1 if one is not a known gap)

How a plan installs each agent (``config/node_agents.yaml`` ``installedAs``):

* ``addon``: an ``aws:eks/addon:Addon`` of that name; its ``configurationValues`` (JSON) are our values;
* ``chart``: a ``kubernetes:helm.sh/v3:Release`` of that chart; its ``values``;
* ``clusterComponent``: made inside pulumi-eks' Cluster component, which a plan shows as one
  ``eks:index:Cluster`` (pulumi/pulumi-eks nodejs/eks/cluster/cluster.ts: the vpc-cni add-on unless
  ``useDefaultVpcCni`` is true, or, with it unset, unless Auto Mode is on; the kube-proxy add-on
  unless ``kubeProxyAddonOptions.enabled`` is false, or, with it unset, unless Auto Mode is on).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from typing import Any

from config.node_agents import Agent, agents
from k8s.builders import node_agents as na
from k8s.builders.operations import FENCE, OPS_NAMESPACE
from k8s.pods.preflight_fence import TAINT as FENCE_TAINT
from tools.mock_runtime import ProgramRun, run_program
from tools.render import PROJECT_DIR, manifests

ADDON = "aws:eks/addon:Addon"
RELEASE = "kubernetes:helm.sh/v3:Release"
NODE_GROUP = "eks:index:ManagedNodeGroup"
CLUSTER = "eks:index:Cluster"


def _cluster_component(component: str, cluster: Mapping[str, Any]) -> Mapping[str, Any] | None:
    auto = bool((cluster.get("autoMode") or {}).get("enabled"))
    if component == "vpc-cni":
        default_cni = cluster.get("useDefaultVpcCni")
        on = (not default_cni) if default_cni is not None else not auto
        return {} if on else None
    options = cluster.get("kubeProxyAddonOptions") or {}
    on = options["enabled"] if options.get("enabled") is not None else not auto
    if not on:
        return None
    config = options.get("configurationValues")
    return json.loads(config) if isinstance(config, str) else dict(config or {})


def installed(run: ProgramRun, table: Mapping[str, Agent]) -> dict[str, Mapping[str, Any] | None]:
    """Each agent's values as the plan installs it; None where the plan does not."""
    addons = {r.inputs["addonName"]: json.loads(r.inputs.get("configurationValues") or "{}") for r in run.by_type(ADDON)}
    releases = {r.inputs["chart"]: dict(r.inputs.get("values") or {}) for r in run.by_type(RELEASE)}
    cluster = run.one(CLUSTER).inputs
    out: dict[str, Mapping[str, Any] | None] = {}
    for name, agent in table.items():
        how = agent.installed_as
        if how.addon:
            out[name] = addons.get(how.addon)
        elif how.chart:
            out[name] = releases.get(how.chart)
        else:
            assert how.cluster_component is not None
            out[name] = _cluster_component(how.cluster_component, cluster)
    return out


def node_kinds(run: ProgramRun) -> list[na.NodeKind]:
    """The managed node groups, every instance type of every NodePool, and, where the plan deploys
    the preflight fence, the GPU kinds once fenced."""
    groups = [
        {"name": r.inputs.get("nodeGroupName") or r.name, "amiType": r.inputs["amiType"], "instanceTypes": r.inputs["instanceTypes"], "labels": r.inputs.get("labels"), "taints": r.inputs.get("taints")}
        for r in run.by_type(NODE_GROUP)
    ]
    objs = list(manifests(run).values())
    pools = [o for o in objs if o["kind"] == "NodePool"]
    kinds = na.node_group_kinds(groups) + na.node_pool_kinds(pools)
    fence = any(o["kind"] == "CronJob" and o["metadata"]["name"] == FENCE and o["metadata"].get("namespace") == OPS_NAMESPACE for o in objs)
    return kinds + (na.fenced(kinds, FENCE_TAINT) if fence else [])


def plan_of(run: ProgramRun, table: Mapping[str, Agent] | None = None) -> na.Plan:
    table = agents() if table is None else table
    return na.Plan(installed=installed(run, table), kinds=node_kinds(run), resource_types={r.type for r in run.registrations})


def findings(run: ProgramRun, table: Mapping[str, Agent] | None = None) -> list[na.Finding]:
    table = agents() if table is None else table
    return na.check(table, plan_of(run, table))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.node_agents", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--stack", required=True)
    args = parser.parse_args(argv)
    found = findings(run_program(PROJECT_DIR, args.stack))
    for f in found:
        print(f)
    return 1 if any(f.accepted is None for f in found) else 0


if __name__ == "__main__":
    sys.exit(main())
