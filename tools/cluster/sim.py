"""Simulated capacity: the stack's managed node groups as kwok nodes, and what Karpenter's kwok
provider needs to launch GPU nodes the way the stack's NodePools allow.

* Managed node groups become ``desiredSize`` kwok nodes each, with the labels and taints the stack
  gives the group and the labels EKS puts on a managed node, in the stack's zones.
* Karpenter's kwok provider only launches for NodePools whose ``nodeClassRef`` is its
  ``KWOKNodeClass`` (``GetSupportedNodeClasses``); NodePools of ``EC2NodeClass`` or Auto Mode's
  ``NodeClass`` are ignored. Each stack NodePool (applied unchanged) therefore gets a twin, equal
  in everything but the node class and the name: same requirements, labels, taints, limits,
  disruption. Karpenter's launch decisions (which type, which zone, the limit) are its own.
* The kwok provider's instance types are the GPU catalog's (``config/gpu_instances.yaml``), each
  with its GPUs, EFA devices (as the platform's EC2NodeClass makes Karpenter advertise them),
  vCPUs and memory, offered in the stack's zones for every capacity type, and labelled with the
  well-known labels the NodePools select on (``karpenter.k8s.aws/instance-category`` and
  ``-family``, and Auto Mode's ``eks.amazonaws.com/`` ones).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any

from config import catalog
from k8s.builders import gpu_objects

TWIN_PREFIX = "kwok-"
KWOK_NODE_CLASS = {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "local"}
# Capacity reservations are not simulated: a reserved offering needs a reservation the kwok provider
# tracks (Karpenter 1.14.1 panics reserving an offering it has none for), so NodePools that allow
# `reserved` launch on-demand or spot here.
CAPACITY_TYPES = ("on-demand", "spot")
# EC2 instance sizes: vCPUs per size (AWS's naming: large = 2 vCPUs, xlarge = 4, Nxlarge = 4N) and
# GiB of memory per vCPU by the family's first letter (compute 2, general purpose 4, memory 8), as
# the EC2 User Guide's "Instance type naming conventions" and the c/m/r specifications give them.
_SIZE_RE = re.compile(r"^(?:(\d+)?xlarge|large|medium)$")
_MEMORY_PER_VCPU = {"c": 2, "m": 4, "r": 8, "t": 4}


@dataclass(frozen=True)
class NodeGroup:
    name: str
    instance_type: str
    desired: int
    labels: dict[str, str]
    taints: list[dict]
    arch: str


def vcpus_and_memory(instance_type: str) -> tuple[int, int]:
    """(vCPUs, GiB) of a general-purpose, compute or memory EC2 type from its name."""
    family, _, size = instance_type.partition(".")
    m = _SIZE_RE.match(size)
    per = _MEMORY_PER_VCPU.get(family[:1])
    if not m or per is None:
        raise ValueError(f"cannot size {instance_type} for the local cluster (families c, m, r, t; sizes medium, large, Nxlarge)")
    vcpu = 1 if size == "medium" else 2 if size == "large" else 4 * int(m.group(1) or 1)
    return vcpu, vcpu * per


def system_nodes(groups: list[NodeGroup], zones: list[str], cluster_version: str) -> list[dict]:
    """Node objects for the managed node groups, spread over the zones as a node group spreads them."""
    nodes = []
    for group in groups:
        vcpu, memory = vcpus_and_memory(group.instance_type)
        for i in range(group.desired):
            zone = zones[i % len(zones)]
            name = f"{group.name}-{i}"
            # pods per node: the VPC CNI's limit for these sizes is larger than the kubelet's 110
            capacity = {"cpu": str(vcpu), "memory": f"{memory}Gi", "pods": "110", "ephemeral-storage": "50Gi"}
            nodes.append({
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {"kwok.x-k8s.io/node": "fake"},
                    "labels": {
                        **group.labels,
                        "eks.amazonaws.com/nodegroup": group.name,
                        "eks.amazonaws.com/capacityType": "ON_DEMAND",
                        "node.kubernetes.io/instance-type": group.instance_type,
                        "kubernetes.io/arch": group.arch,
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/hostname": name,
                        "topology.kubernetes.io/zone": zone,
                        "topology.kubernetes.io/region": zone[:-1],
                        "type": "kwok",
                    },
                },
                "spec": {"taints": copy.deepcopy(group.taints)} if group.taints else {},
                "status": {"capacity": capacity, "allocatable": capacity, "nodeInfo": {"architecture": group.arch, "kubeletVersion": f"v{cluster_version}.0-kwok", "operatingSystem": "linux"}},
            })
    return nodes


def instance_types(zones: list[str]) -> list[dict]:
    """The kwok provider's catalog (``kwok/cloudprovider`` ``InstanceTypeOptions``): every GPU type of
    ours, offered in every zone and capacity type."""
    out = []
    for it in catalog.catalog().values():
        resources = {"cpu": str(it.vcpu), "memory": f"{it.memory_gib}Gi", "pods": "110", "ephemeral-storage": "200Gi", "nvidia.com/gpu": str(it.gpus)}
        efa = gpu_objects.efa_devices_per_node(it.name) if it.efa else 0
        if efa:
            resources["vpc.amazonaws.com/efa"] = str(efa)
        labels = {}
        for mode in ("karpenter", "auto"):
            category_key, family_key = gpu_objects.instance_label_keys(mode)
            labels[category_key] = it.category
            labels[family_key] = it.family
        offerings = []
        for zone in zones:
            for capacity_type in CAPACITY_TYPES:
                reqs = [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": [zone]},
                        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": [capacity_type]}]
                reqs += [{"key": k, "operator": "In", "values": [v]} for k, v in labels.items()]
                offerings.append({"price": _price(it, capacity_type), "available": True, "requirements": reqs})
        out.append({"name": it.name, "architecture": "amd64", "operatingSystems": ["linux"], "resources": resources, "offerings": offerings})
    return out


def _price(it: catalog.GpuInstance, capacity_type: str) -> float:
    """A price that orders types as AWS's do (more GPUs and memory cost more); Karpenter launches the
    cheapest type that fits, so the order is what matters. Spot below on-demand."""
    base = it.gpus * it.gpu_memory_gib * 0.01 + it.vcpu * 0.04 + it.memory_gib * 0.005
    return {"on-demand": base, "spot": base * 0.4}[capacity_type]


def twin_node_pool(node_pool: dict) -> dict:
    """The stack's NodePool as the kwok provider launches it: another name, the KWOKNodeClass."""
    twin = copy.deepcopy(node_pool)
    twin["metadata"] = {"name": TWIN_PREFIX + node_pool["metadata"]["name"], "labels": {"training-platform/local-cluster": "twin", "training-platform/twin-of": node_pool["metadata"]["name"]}}
    twin["spec"]["template"]["spec"]["nodeClassRef"] = dict(KWOK_NODE_CLASS)
    twin.pop("status", None)
    return twin


def kwok_node_class() -> dict[str, Any]:
    return {"apiVersion": "karpenter.kwok.sh/v1alpha1", "kind": "KWOKNodeClass", "metadata": {"name": KWOK_NODE_CLASS["name"]}, "spec": {}}
