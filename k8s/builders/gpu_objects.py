"""Pure builders for GPU capacity objects: NodePools, EC2NodeClasses and the Helm values of
Karpenter and the device plugins. Plain dicts in, plain dicts out; no Pulumi."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import versions
from config import catalog
from config.efa import EFA_POOL, efa_devices_per_node, efa_layouts, efa_network_interfaces, efa_pool_of  # noqa: F401  (part of this module's interface)
from config.namespaces import KARPENTER_NAMESPACE  # noqa: F401  (part of this module's interface)
from config.settings import EfaSettings, GpuPoolSettings

GPU_POOL = "gpu-pool"
GPU_TAINT = {"key": "nvidia.com/gpu", "effect": "NoSchedule"}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
POOL_LABEL = "training-platform/pool"
EFA_LABEL = "training-platform/efa"
KARPENTER_SERVICE_ACCOUNT = "karpenter"


@dataclass(frozen=True)
class NodeClassRef:
    group: str
    kind: str
    name: str

    def to_dict(self) -> dict:
        return {"group": self.group, "kind": self.kind, "name": self.name}


AUTO_MODE_NODE_CLASS = NodeClassRef("eks.amazonaws.com", "NodeClass", "default")


def ec2_node_class_ref(name: str) -> NodeClassRef:
    return NodeClassRef("karpenter.k8s.aws", "EC2NodeClass", name)


def instance_label_keys(mode: str) -> tuple[str, str]:
    """Karpenter's well-known labels for category/family; Auto Mode uses its own prefix."""
    prefix = "eks.amazonaws.com" if mode == "auto" else "karpenter.k8s.aws"
    return f"{prefix}/instance-category", f"{prefix}/instance-family"


def _requirements(mode: str, categories: list[str], families: list[str], types: list[str], capacity_types: Sequence[str], zone: str | None = None) -> list[dict]:
    cat_key, fam_key = instance_label_keys(mode)
    reqs = [
        {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
        {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": list(capacity_types)},
    ]
    if categories:
        reqs.append({"key": cat_key, "operator": "In", "values": list(categories)})
    if families:
        reqs.append({"key": fam_key, "operator": "In", "values": list(families)})
    # Always bound the pool to types the catalog knows: every GPU count and EFA value the
    # platform derives comes from the catalog, so Karpenter must not launch anything else.
    reqs.append({"key": "node.kubernetes.io/instance-type", "operator": "In", "values": sorted(types)})
    if zone:
        reqs.append({"key": "topology.kubernetes.io/zone", "operator": "In", "values": [zone]})
    return reqs


def _disruption(pool: GpuPoolSettings) -> dict:
    # Only empty nodes are consolidated, and at most one node at a time; training pods carry
    # karpenter.sh/do-not-disrupt so drift or expiry never evicts a running job either.
    return {"consolidationPolicy": "WhenEmpty", "consolidateAfter": pool.consolidate_after, "budgets": [{"nodes": "1"}]}


def node_pool(*, name: str, pool: GpuPoolSettings, node_class: NodeClassRef, types: list[str], categories: list[str], families: list[str], gpu_limit: int, zone: str | None = None, extra_labels: dict | None = None) -> dict:
    template_spec = {
        "nodeClassRef": node_class.to_dict(),
        "requirements": _requirements(pool.mode, categories, families, types, pool.capacity_types, zone),
        "taints": [dict(GPU_TAINT)],
        "expireAfter": pool.expire_after,
    }
    if pool.expire_after != "Never":
        # Expiry drains a node only within this window; after it, pods are force-removed.
        template_spec["terminationGracePeriod"] = "24h"
    return {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": name},
        "spec": {
            "template": {"metadata": {"labels": {POOL_LABEL: name, **(extra_labels or {})}}, "spec": template_spec},
            "limits": {"nvidia.com/gpu": str(gpu_limit)},
            "disruption": _disruption(pool),
        },
    }


def gpu_node_pool(pool: GpuPoolSettings, node_class: NodeClassRef) -> dict:
    """The ``gpu-pool`` NodePool every training job lands on."""
    return node_pool(
        name=GPU_POOL,
        pool=pool,
        node_class=node_class,
        types=[i.name for i in pool.allowed_types()],
        categories=pool.instance_categories,
        families=pool.instance_families,
        gpu_limit=pool.gpu_limit,
    )


def efa_node_pool(name: str, types: list[str], pool: GpuPoolSettings, efa: EfaSettings, node_class: NodeClassRef) -> dict:
    gpus = sum(catalog.lookup(t).gpus for t in types)
    return node_pool(
        name=name,
        pool=pool,
        node_class=node_class,
        types=types,
        categories=[],
        families=[],
        gpu_limit=max(pool.gpu_limit, gpus),
        zone=efa.availability_zone,
        extra_labels={EFA_LABEL: "true"},
    )


def ec2_node_class(
    *,
    name: str,
    cluster_name: str,
    node_role: str,
    root_volume_gib: int,
    tags: dict[str, str],
    placement_group: str | None = None,
    interfaces: list[dict] | None = None,
    extra_security_group_tags: dict[str, str] | None = None,
    capacity_reservations: list[dict] | None = None,
    root_volume_throughput: int | None = None,
    root_volume_iops: int | None = None,
    instance_store_policy: str | None = None,
    fast_image_pull: bool = False,
) -> dict:
    """``capacity_reservations``: Karpenter's ``capacityReservationSelectorTerms``; the NodePools'
    ``reserved`` capacity type launches only into reservations these terms select.

    The image pull levers (``gpuPool`` keys, docs/time-to-first-step.md), each left out when unset:
    ``root_volume_throughput`` / ``root_volume_iops`` (gp3 MiB/s and IOPS of the root volume, where
    containerd unpacks images), ``instance_store_policy`` (``RAID0``: Karpenter has nodeadm put
    containerd, the kubelet and pod logs on a RAID0 of the NVMe instance store) and
    ``fast_image_pull`` (a NodeConfig in ``userData`` turning on nodeadm's FastImagePull gate, the
    SOCI snapshotter's parallel pull; Karpenter adds its own NodeConfig after it)."""
    discovery = {"karpenter.sh/discovery": cluster_name}
    security_groups = [{"tags": dict(discovery)}] + ([{"tags": dict(extra_security_group_tags)}] if extra_security_group_tags else [])
    spec = {
        "role": node_role,
        "amiSelectorTerms": [{"alias": versions.GPU_NODE_AMI_ALIAS}],
        "subnetSelectorTerms": [{"tags": dict(discovery)}],
        "securityGroupSelectorTerms": security_groups,
        "metadataOptions": {"httpEndpoint": "enabled", "httpProtocolIPv6": "disabled", "httpPutResponseHopLimit": 1, "httpTokens": "required"},
        "blockDeviceMappings": [
            {"deviceName": "/dev/xvda", "ebs": {"volumeSize": f"{root_volume_gib}Gi", "volumeType": "gp3", "encrypted": True, "deleteOnTermination": True}}
        ],
        "associatePublicIPAddress": False,
        "tags": dict(tags),
    }
    if placement_group:
        spec["placementGroupSelector"] = {"name": placement_group}
    if interfaces:
        spec["networkInterfaces"] = interfaces
    if capacity_reservations:
        spec["capacityReservationSelectorTerms"] = [dict(t) for t in capacity_reservations]
    root_ebs = spec["blockDeviceMappings"][0]["ebs"]
    if root_volume_throughput is not None:
        root_ebs["throughput"] = root_volume_throughput
    if root_volume_iops is not None:
        root_ebs["iops"] = root_volume_iops
    if instance_store_policy:
        spec["instanceStorePolicy"] = instance_store_policy
    if fast_image_pull:
        spec["userData"] = FAST_IMAGE_PULL_NODE_CONFIG
    return {"apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": name}, "spec": spec}


# nodeadm's NodeConfig (node.eks.aws/v1alpha1) with the FastImagePull gate, as amazon-eks-ami's
# nodeadm/doc/examples.md ("Enabling fast image pull") writes it. Karpenter v1.14.1 takes a YAML
# userData on AL2023 as a NodeConfig part of the MIME archive it builds, before its own NodeConfig
# (pkg/providers/amifamily/bootstrap/nodeadm.go parseUserData), and nodeadm merges the two.
FAST_IMAGE_PULL_NODE_CONFIG = "apiVersion: node.eks.aws/v1alpha1\nkind: NodeConfig\nspec:\n  featureGates:\n    FastImagePull: true\n"


# --- Helm values -------------------------------------------------------------------------------

SYSTEM_NODE_AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "training-platform/node-role", "operator": "In", "values": ["system"]}]}]
        }
    }
}


def karpenter_values(*, cluster_name: str, queue_name: str, node_repair: bool = True) -> dict:
    """The controller runs on the managed node groups (never on nodes it manages), 2 replicas.

    Node repair (karpenter v1.14.1 pkg/controllers/node/health/controller.go, with the AWS
    provider's RepairPolicies in karpenter-provider-aws pkg/cloudprovider/cloudprovider.go): a node
    whose AcceleratedHardwareReady is False for 10 min (Ready False/Unknown or another node
    monitoring agent condition: 30 min) gets its NodeClaim's termination timestamp set to now and
    is deleted, so neither ``karpenter.sh/do-not-disrupt`` (which the platform's training pods
    carry) nor the NodePool's disruption budgets block it: a broken GPU node never holds a job
    forever. It is held back only while more than 20% of the NodePool's nodes are unhealthy (so a
    cluster-wide outage does not delete every node), and a healthy node is never touched."""
    return {
        "settings": {"clusterName": cluster_name, "interruptionQueue": queue_name, "featureGates": {"nodeRepair": node_repair}},
        "serviceAccount": {"create": True, "name": KARPENTER_SERVICE_ACCOUNT},
        "replicas": 2,
        "affinity": SYSTEM_NODE_AFFINITY,
        "controller": {"resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}}},
    }


def nvidia_device_plugin_values() -> dict:
    """The chart's default affinity needs NFD or nvidia.com/gpu.present labels, which Karpenter
    nodes don't carry: schedule on any GPU-pool node instead, tolerating the GPU taint."""
    return {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": POOL_LABEL, "operator": "Exists"}]},
                        {"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]},
                    ]
                }
            }
        },
        "tolerations": [dict(GPU_TOLERATION), {"key": "CriticalAddonsOnly", "operator": "Exists"}],
        "priorityClassName": "system-node-critical",
    }


def efa_device_plugin_values(instance_types: list[str]) -> dict:
    """The chart has no tolerations and a fixed instance-type list: tolerate the GPU taint and
    select exactly the EFA pool's nodes."""
    return {
        "tolerations": [dict(GPU_TOLERATION)],
        "nodeSelector": {EFA_LABEL: "true"},
        "supportedInstanceLabels": {"keys": ["node.kubernetes.io/instance-type"], "values": sorted(instance_types)},
    }
