"""Bad GPU nodes found: the eks-node-monitoring-agent add-on (self-managed Karpenter mode) reports
GPU (Xid, DCGM), kernel, network, storage and runtime faults as node conditions, which Karpenter's
node repair acts on (k8s/builders/gpu_objects.py karpenter_values). EKS Auto Mode runs its own node
monitoring and repairs its nodes itself (EKS User Guide, "Enable node auto repair and investigate
node health issues"): nothing is added there.

The add-on's DCGM server DaemonSet ships without tolerations, so its configuration values
(``k8s/builders/node_agents.py``) let it onto the tainted GPU nodes, where the agent needs it."""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

import versions
from config.settings import Settings
from infra.cluster import Cluster
from k8s.builders.node_agents import node_monitoring_agent_configuration


class NodeHealth(pulumi.ComponentResource):
    addon: aws.eks.Addon | None

    def __init__(self, name: str, *, settings: Settings, cluster: Cluster, opts: pulumi.ResourceOptions | None = None):
        super().__init__("training-platform:infra:NodeHealth", name, None, opts)
        self.addon = None
        if settings.gpu_pool.mode == "karpenter":
            self.addon = aws.eks.Addon(
                f"{name}-node-monitoring-agent",
                cluster_name=cluster.eks_cluster.eks_cluster.name,
                addon_name="eks-node-monitoring-agent",
                addon_version=versions.NODE_MONITORING_AGENT_ADDON_VERSION,
                configuration_values=json.dumps(node_monitoring_agent_configuration(), sort_keys=True),
                resolve_conflicts_on_create="OVERWRITE",
                resolve_conflicts_on_update="OVERWRITE",
                opts=pulumi.ResourceOptions(parent=self, depends_on=list(cluster.node_groups.values())),
            )
        self.register_outputs({"nodeMonitoringAgent": self.addon.addon_version if self.addon else None})
