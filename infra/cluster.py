"""Cluster: EKS (pulumi-eks) with access entries, ARM and x86 managed node groups, and the
Kubernetes provider every later Kubernetes object uses."""

from __future__ import annotations

import pulumi
import pulumi_aws as aws
import pulumi_eks as eks
import pulumi_kubernetes as k8s

from infra.iam import assume_role_policy
from infra.network import Network
from infra.settings import Settings

LOG_TYPES = ["api", "audit", "authenticator", "controllerManager", "scheduler"]
NODE_POLICIES = {
    "worker": "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy",
    "cni": "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy",
    "ecr": "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryReadOnly",
    "ssm": "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore",
}
CLUSTER_ADMIN_POLICY = "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"
NODE_ROLE_LABEL = "training-platform/node-role"
ARCH_LABEL = "training-platform/arch"


class Cluster(pulumi.ComponentResource):
    name: str
    eks_cluster: eks.Cluster
    provider: k8s.Provider
    kubeconfig: pulumi.Output[str]
    security_group_id: pulumi.Output[str]
    oidc_provider_arn: pulumi.Output[str]
    oidc_provider_url: pulumi.Output[str]
    node_groups: dict[str, eks.ManagedNodeGroup]

    def __init__(self, name: str, *, settings: Settings, network: Network, tags: dict[str, str], opts: pulumi.ResourceOptions | None = None):
        super().__init__("training-platform:infra:Cluster", name, None, opts)
        self._s = settings
        self._tags = tags
        self.name = settings.cluster_name
        self._create_cluster(name, network)
        self._create_node_groups(name, network)
        self.provider = k8s.Provider(
            f"{name}-k8s",
            kubeconfig=self.kubeconfig,
            enable_server_side_apply=True,
            delete_unreachable=False,
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(self.node_groups.values())),
        )
        self.register_outputs({"clusterName": self.name, "nodeGroupNames": self.node_group_names})

    def _create_cluster(self, name: str, network: Network) -> None:
        s = self._s
        auto = s.gpu_pool.mode == "auto"
        access_entries = {
            f"admin-{i}": eks.AccessEntryArgs(
                principal_arn=arn,
                access_policies={"cluster-admin": eks.AccessPolicyAssociationArgs(policy_arn=CLUSTER_ADMIN_POLICY, access_scope=aws.eks.AccessPolicyAssociationAccessScopeArgs(type="cluster"))},
            )
            for i, arn in enumerate(s.cluster.admin_principal_arns)
        }
        self.eks_cluster = eks.Cluster(
            f"{name}-eks",
            name=self.name,
            version=s.cluster.version,
            vpc_id=network.vpc_id,
            private_subnet_ids=network.private_subnet_ids,
            public_subnet_ids=network.public_subnet_ids,
            node_associate_public_ip_address=False,
            authentication_mode=eks.AuthenticationMode.API,
            access_entries=access_entries,
            endpoint_private_access=True,
            endpoint_public_access=s.cluster.endpoint_public_access,
            public_access_cidrs=list(s.cluster.public_access_cidrs) if s.cluster.endpoint_public_access else None,
            enabled_cluster_log_types=LOG_TYPES,
            encryption_config_key_arn=s.cluster.secrets_kms_key_arn,
            create_oidc_provider=True,
            skip_default_node_group=True,
            coredns_addon_options=eks.CoreDnsAddonOptionsArgs(enabled=True),
            auto_mode=eks.AutoModeOptionsArgs(
                enabled=True,
                create_node_role=True,
                # The built-in "system" pool keeps Auto Mode's default NodeClass, which the
                # gpu-pool NodePool points at; general workloads stay on the managed node groups.
                compute_config=aws.eks.ClusterComputeConfigArgs(node_pools=["system"]),
            )
            if auto
            else None,
            tags={**self._tags, "karpenter.sh/discovery": self.name},
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.kubeconfig = pulumi.Output.secret(self.eks_cluster.kubeconfig_json)
        # The EKS-managed cluster security group: managed-node-group nodes use it, so GPU nodes
        # launched by Karpenter use it too (tagged for discovery in the GPU capacity component).
        self.security_group_id = self.eks_cluster.core.cluster.apply(lambda c: c.vpc_config.cluster_security_group_id)
        self.oidc_provider_arn = self.eks_cluster.oidc_provider_arn
        self.oidc_provider_url = self.eks_cluster.oidc_provider_url

    @property
    def node_group_names(self) -> list[str]:
        return [self._node_group_name(k) for k in self.node_groups]

    def _node_group_name(self, key: str) -> str:
        return f"{self.name}-{key}"[:63]

    def _create_node_groups(self, name: str, network: Network) -> None:
        role = aws.iam.Role(f"{name}-node-role", assume_role_policy=assume_role_policy("ec2.amazonaws.com"), tags=self._tags, opts=pulumi.ResourceOptions(parent=self))
        for key, arn in NODE_POLICIES.items():
            aws.iam.RolePolicyAttachment(f"{name}-node-{key}", role=role.name, policy_arn=arn, opts=pulumi.ResourceOptions(parent=self))
        self.node_role = role
        self.node_groups = {}
        for key, ng in (("arm", self._s.node_groups.arm), ("x86", self._s.node_groups.x86)):
            self.node_groups[key] = eks.ManagedNodeGroup(
                f"{name}-{key}",
                cluster=self.eks_cluster,
                node_group_name=self._node_group_name(key),
                node_role=role,
                ami_type=ng.AMI_TYPE,
                instance_types=[ng.instance_type],
                capacity_type="ON_DEMAND",
                scaling_config=aws.eks.NodeGroupScalingConfigArgs(min_size=ng.min_size, max_size=ng.max_size, desired_size=ng.desired_size),
                subnet_ids=network.private_subnet_ids,
                disk_size=ng.disk_size_gib,
                enable_imd_sv2=True,
                labels={ARCH_LABEL: ng.ARCH, NODE_ROLE_LABEL: "system"},
                tags=self._tags,
                opts=pulumi.ResourceOptions(parent=self),
            )

