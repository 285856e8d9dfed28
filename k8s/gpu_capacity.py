"""Cluster side of GPU capacity: Karpenter, device plugins, the gpu-pool and EFA NodePools."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as kube

import versions
from config.settings import Settings
from infra.gpu_aws import EFA_SG_TAG, GpuAws
from k8s.builders import gpu_objects as g
from k8s.helm import release
from k8s.resources import apply_manifest


class GpuCapacity(pulumi.ComponentResource):
    node_pools: list[pulumi.Resource]

    def __init__(self, name: str, *, settings: Settings, gpu_aws: GpuAws, cluster_name: str, provider: kube.Provider, tags: dict[str, str], opts: pulumi.ResourceOptions | None = None):
        super().__init__("training-platform:k8s:GpuCapacity", name, None, opts)
        self._s = settings
        self._aws = gpu_aws
        self._cluster_name = cluster_name
        self._provider = provider
        self._tags = tags
        self.node_pools = []
        self.plugins: list[pulumi.Resource] = []
        if settings.gpu_pool.mode == "karpenter":
            self._create_karpenter_pools()
        else:
            self._create_auto_mode_pools()
        self.register_outputs({"nodePools": [p.urn for p in self.node_pools]})

    def _opts(self, depends_on: list | None = None) -> pulumi.ResourceOptions:
        return pulumi.ResourceOptions(parent=self, provider=self._provider, depends_on=depends_on or [])

    def _create_karpenter_pools(self) -> None:
        s = self._s
        queue_name, node_role = self._aws.queue_name, self._aws.node_role_name
        assert queue_name is not None and node_role is not None, "GpuAws creates the queue and node role in karpenter mode"
        karpenter = release(
            "karpenter",
            chart=versions.KARPENTER_CHART,
            version=versions.KARPENTER_VERSION,
            namespace=g.KARPENTER_NAMESPACE,
            values=g.karpenter_values(cluster_name=self._cluster_name, queue_name=queue_name, node_repair=s.gpu_pool.node_repair),
            opts=self._opts(depends_on=self._aws.karpenter_ready),
        )
        self.karpenter = karpenter
        node_tags = {**self._tags, "karpenter.sh/discovery": self._cluster_name}
        reservations = [t.karpenter() for t in s.gpu_pool.capacity_reservation_selector_terms]
        gpu_class = apply_manifest(
            g.ec2_node_class(
                name="gpu",
                cluster_name=self._cluster_name,
                node_role=node_role,
                root_volume_gib=s.gpu_pool.root_volume_size_gib,
                tags=node_tags,
                capacity_reservations=reservations,
                **s.gpu_pool.node_class_storage(),
            ),
            self._opts(depends_on=[karpenter]),
        )
        self.node_pools.append(apply_manifest(g.gpu_node_pool(s.gpu_pool, g.ec2_node_class_ref("gpu")), self._opts(depends_on=[karpenter, gpu_class])))
        self._plugin("nvidia-device-plugin", versions.NVIDIA_DEVICE_PLUGIN_CHART, versions.NVIDIA_DEVICE_PLUGIN_REPO, versions.NVIDIA_DEVICE_PLUGIN_VERSION, g.nvidia_device_plugin_values())
        if s.efa.enabled:
            self._plugin("aws-efa-k8s-device-plugin", versions.EFA_DEVICE_PLUGIN_CHART, versions.EFA_DEVICE_PLUGIN_REPO, versions.EFA_DEVICE_PLUGIN_VERSION, g.efa_device_plugin_values(s.efa.instance_types))
            for pool_name, types in g.efa_layouts(s.efa).items():
                node_class = apply_manifest(
                    g.ec2_node_class(
                        name=pool_name,
                        cluster_name=self._cluster_name,
                        node_role=node_role,
                        capacity_reservations=reservations,
                        root_volume_gib=s.gpu_pool.root_volume_size_gib,
                        tags=node_tags,
                        placement_group=self._aws.placement_group_name,
                        interfaces=g.efa_network_interfaces(types[0]),
                        extra_security_group_tags={EFA_SG_TAG: self._cluster_name},
                        **s.gpu_pool.node_class_storage(),
                    ),
                    self._opts(depends_on=[karpenter, *self._aws.efa_resources]),
                )
                self.node_pools.append(apply_manifest(g.efa_node_pool(pool_name, types, s.gpu_pool, s.efa, g.ec2_node_class_ref(pool_name)), self._opts(depends_on=[karpenter, node_class])))

    def _plugin(self, name: str, chart: str, repo: str, version: str, values: dict) -> None:
        self.plugins.append(release(name, chart=chart, repo=repo, version=version, namespace=g.KARPENTER_NAMESPACE, values=values, opts=self._opts()))

    def _create_auto_mode_pools(self) -> None:
        """Auto Mode brings its own NVIDIA and EFA plugins and the ``default`` NodeClass."""
        s = self._s
        self.node_pools.append(apply_manifest(g.gpu_node_pool(s.gpu_pool, g.AUTO_MODE_NODE_CLASS), self._opts()))
        if s.efa.enabled:
            for pool_name, types in g.efa_layouts(s.efa).items():
                self.node_pools.append(apply_manifest(g.efa_node_pool(pool_name, types, s.gpu_pool, s.efa, g.AUTO_MODE_NODE_CLASS), self._opts()))

