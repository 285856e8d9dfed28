"""Cluster: EKS (pulumi-eks) with access entries, ARM and x86 managed node groups, CoreDNS, and
the Kubernetes provider every later Kubernetes object uses.

Facts from pulumi-eks ``nodejs/eks/cluster/cluster.ts`` (v3.x-v4.3) this component relies on:

* the cluster is created with ``accessConfig.bootstrapClusterCreatorAdminPermissions: true``
  (hard-coded): the principal that creates it gets an EKS-made admin access entry. An explicit
  entry for the same principal fails the create (``ResourceInUseException``), so the creator is
  left out of the explicit admin entries (see ``admin_access_entries``);
* with ``skipDefaultNodeGroup`` the managed CoreDNS add-on is created inside the component only when
  enabled explicitly (or in Auto Mode), before any node exists, and ``pulumi up`` then waits 20
  minutes on a DEGRADED add-on (pulumi-eks #1819). It is turned off there and created here, after
  the managed node groups; Auto Mode clusters keep the DNS that Auto Mode runs itself;
* ``tags`` are copied onto every security group the component makes, so the
  ``karpenter.sh/discovery`` tag is not passed there: it goes on the one EKS-managed cluster
  security group only (``infra/gpu_aws.py``).

A ``cluster.version`` bump, in order: the control plane, with the kube-proxy and VPC CNI add-ons the
pulumi-eks component makes (v4.3.0 ``nodejs/eks/cluster/cluster.ts``: their versions are
``getAddonVersion(kubernetesVersion: cluster.version, mostRecent: true)``; kube-proxy may be a minor newer
than the kubelets, never newer than the API server: Kubernetes version skew policy); then the managed node
groups (their ``version`` is the cluster's, and they depend on the cluster); then the EKS add-ons created
after them (CoreDNS here, version per cluster version in ``versions.COREDNS_ADDON_VERSIONS``; Pod Identity,
CSI, node monitoring and CloudWatch in their components, each depending on the node groups).
GPU nodes follow by themselves, after the control plane:

* Karpenter (karpenter-provider-aws v1.14.1): the EC2NodeClass alias ``versions.GPU_NODE_AMI_ALIAS``
  (``al2023@v<date>``) names an AMI release, not a Kubernetes version. Karpenter reads the cluster's
  version every 5 minutes (``pkg/controllers/providers/version/controller.go``; DescribeCluster or the API
  server's ``/version``, ``pkg/providers/version/version.go``) and resolves the alias to the SSM parameter
  ``/aws/service/eks/optimized-ami/<k8s version>/amazon-linux-2023/<arch>/<variant>/amazon-eks-node-al2023-
  <arch>-<variant>-<k8s version>-<date>/image_id`` (``pkg/providers/amifamily/al2023.go`` resolvePath). A
  node whose AMI is no longer the resolved one is drifted (``pkg/cloudprovider/drift.go`` AMIDrift) and
  replaced like any voluntary disruption: a node running a job (``karpenter.sh/do-not-disrupt``) waits
  for it to finish. The pinned release must exist for the new version (that SSM parameter), or the
  NodeClass resolves no AMI and launches nothing.
* EKS Auto Mode: after a control plane upgrade Auto Mode replaces its nodes with nodes of the new
  version, observing pod disruption budgets (EKS User Guide, "Update the Kubernetes Version of an EKS
  Auto Mode cluster", auto-upgrade.html); nothing in the program names a node version there.
"""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws
import pulumi_eks as eks
import pulumi_kubernetes as kube

import versions
from config.infra_models import CiAccessSettings
from config.labels import ARCH_LABEL, NODE_ROLE_LABEL
from config.names import EKS_NODE_GROUP
from config.settings import Settings
from infra import deploy_state
from infra.iam import assume_role_policy
from infra.network import Network

LOG_TYPES = ["api", "audit", "authenticator", "controllerManager", "scheduler"]
NODE_POLICIES = {
    "worker": "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy",
    "cni": "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy",
    "ecr": "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryReadOnly",
    "ssm": "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore",
}
# EKS access policies (EKS User Guide, "Review access policy permissions", awsdocs/amazon-eks-user-guide
# latest/ug/manage-access/k8s-access/access-policy-reference.adoc): ClusterAdmin is `*` on every API group,
# resource and non-resource URL; View is get/list/watch on the core and workload kinds, without Secrets,
# custom resources or RBAC objects, and no write verb at all.
CLUSTER_ADMIN_POLICY = "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"
VIEW_POLICY = "arn:aws:eks::aws:cluster-access-policy/AmazonEKSViewPolicy"


def coredns_configuration(auto_mode: bool) -> dict:
    """The CoreDNS add-on's configuration values (its schema's ``affinity``): in Auto Mode, on the
    managed node groups only (not ``eks.amazonaws.com/compute-type: auto`` nodes), Linux amd64/arm64
    as its default affinity asks."""
    terms = [{"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}, {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64", "arm64"]}]
    if auto_mode:
        terms.append({"key": "eks.amazonaws.com/compute-type", "operator": "NotIn", "values": ["auto"]})
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": terms}]}}}}


class Cluster(pulumi.ComponentResource):
    name: str
    eks_cluster: eks.Cluster
    provider: kube.Provider
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
        self._create_coredns(name)
        self.provider = kube.Provider(
            f"{name}-k8s",
            kubeconfig=self.kubeconfig,
            enable_server_side_apply=True,
            delete_unreachable=False,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[*self.node_groups.values(), *([self.coredns] if self.coredns else [])]),
        )
        self.register_outputs({"clusterName": self.name, "nodeGroupNames": self.node_group_names})

    def _create_cluster(self, name: str, network: Network) -> None:
        s = self._s
        auto = s.gpu_pool.mode == "auto"
        creator = self._record_creator(name)
        # a plain dict: accessEntries is a plain input of the pulumi-eks component (its provider
        # iterates the object it receives), so it cannot be an Output
        access_entries = admin_access_entries(list(s.cluster.admin_principal_arns), creator_arn=creator)
        access_entries.update(ci_access_entries(s.cluster.ci, creator_arn=creator))
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
            coredns_addon_options=eks.CoreDnsAddonOptionsArgs(enabled=False),  # created after the node groups
            # Teams are isolated by NetworkPolicy (k8s/builders/tenants.py), enforced by the VPC CNI's network-policy
            # agent only when the vpc-cni add-on's configuration sets enableNetworkPolicy (EKS User Guide,
            # "Limit Pod traffic with Kubernetes network policies"); pulumi-eks v4.3.0
            # (nodejs/eks/addons/cni-addon.ts) writes this option into that configuration
            vpc_cni_options=eks.VpcCniOptionsArgs(enable_network_policy=True) if s.tenants.teams() else None,
            # An Auto Mode cluster is created without the self-managed add-ons and pulumi-eks then makes
            # neither the vpc-cni nor the kube-proxy add-on (nodejs/eks/cluster/cluster.ts v4.3.0), so the
            # managed node groups, which Auto Mode does not network, would never be Ready; the vpc-cni
            # chart keeps off Auto Mode's own nodes (config/node_agents.yaml)
            use_default_vpc_cni=False if auto else None,
            kube_proxy_addon_options=eks.KubeProxyAddonOptionsArgs(enabled=True) if auto else None,
            auto_mode=eks.AutoModeOptionsArgs(
                enabled=True,
                create_node_role=True,
                # The built-in "system" pool keeps Auto Mode's default NodeClass, which the
                # gpu-pool NodePool points at; general workloads stay on the managed node groups.
                compute_config=eks.ClusterComputeConfigArgs(node_pools=["system"]),
            )
            if auto
            else None,
            tags=dict(self._tags),  # copied onto every security group: no discovery tag here
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.kubeconfig = pulumi.Output.secret(self.eks_cluster.kubeconfig_json)
        # The EKS-managed cluster security group: managed-node-group nodes use it, so GPU nodes
        # launched by Karpenter use it too (tagged for discovery in the GPU capacity component).
        self.security_group_id = self.eks_cluster.core.cluster.apply(lambda c: c.vpc_config.cluster_security_group_id)
        self.oidc_provider_arn = self.eks_cluster.oidc_provider_arn
        self.oidc_provider_url = self.eks_cluster.oidc_provider_url

    def _record_creator(self, name: str) -> str:
        """The principal EKS made the bootstrap admin entry for: the caller of the first
        ``pulumi up``. It is recorded in an SSM parameter whose value never changes after creation
        (``ignore_changes``) and read back, as a plain value, on every later run, so a later run by
        another admin still knows who created the cluster and keeps that admin's own entry."""
        param_name = deploy_state.parameter_name(self.name, deploy_state.BOOTSTRAP_ADMIN)
        invoke = pulumi.InvokeOptions(parent=self)
        creator = deploy_state.read_parameter(param_name, invoke) or iam_principal_of(aws.get_caller_identity(opts=invoke).arn)
        self.bootstrap_admin = aws.ssm.Parameter(
            f"{name}-bootstrap-admin",
            name=param_name,
            type="String",
            value=creator,
            description="Principal that created the EKS cluster (EKS gave it the bootstrap admin access entry)",
            tags=self._tags,
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=["value"]),
        )
        return creator

    def _create_coredns(self, name: str) -> None:
        """CoreDNS as a managed add-on once nodes exist to run it. Version pinned per Kubernetes
        version in ``versions.py``. In Auto Mode too: Auto Mode's DNS serves its own nodes (a
        node-local service), while pods on the managed node groups (the initializers, the
        controllers' clients) resolve through the kube-dns Service, which needs CoreDNS there
        (EKS User Guide, "Automate cluster infrastructure with EKS Auto Mode", DNS on
        non-Auto-Mode nodes; awsdocs/amazon-eks-user-guide#1149); it is kept off Auto Mode's nodes."""
        auto = self._s.gpu_pool.mode == "auto"
        self.coredns = aws.eks.Addon(
            f"{name}-coredns",
            cluster_name=self.eks_cluster.eks_cluster.name,
            addon_name="coredns",
            addon_version=versions.COREDNS_ADDON_VERSIONS[self._s.cluster.version],
            configuration_values=json.dumps(coredns_configuration(auto)) if auto else None,
            resolve_conflicts_on_create="OVERWRITE",  # take over the self-managed CoreDNS EKS installed
            resolve_conflicts_on_update="OVERWRITE",
            tags=self._tags,
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(self.node_groups.values())),
        )

    @property
    def node_role_arns(self) -> list[pulumi.Output[str]]:
        """The roles this component's nodes run as: the managed node groups' and, in Auto Mode,
        the node role pulumi-eks creates (``autoModeNodeRoleName``; roles it creates have the
        default path "/"). Karpenter's own node role is GpuAws's."""
        arns = [self.node_role.arn]
        if self._s.gpu_pool.mode == "auto":
            ident, part = aws.get_caller_identity_output(), aws.get_partition_output()
            arns.append(pulumi.Output.all(part.partition, ident.account_id, self.eks_cluster.auto_mode_node_role_name).apply(lambda a: f"arn:{a[0]}:iam::{a[1]}:role/{a[2]}"))
        return arns

    @property
    def node_group_names(self) -> list[str]:
        return [self._node_group_name(k) for k in self.node_groups]

    def _node_group_name(self, key: str) -> str:
        return EKS_NODE_GROUP.name(self.name, key)

    def _create_node_groups(self, name: str, network: Network) -> None:
        role = aws.iam.Role(f"{name}-node-role", assume_role_policy=assume_role_policy("ec2.amazonaws.com"), tags=self._tags, opts=pulumi.ResourceOptions(parent=self))
        # the role's policies before the groups: their nodes cannot register without them (EKS User
        # Guide, "Amazon EKS node IAM role": create the role with them before creating nodes;
        # CreateNodegroup otherwise ends in NodeCreationFailure), and EKS needs them to delete the
        # groups' instances and ENIs (terraform-provider-aws website/docs/r/eks_node_group: "Ensure
        # that IAM Role permissions are created before and deleted after EKS Node Group handling")
        node_policies = [
            aws.iam.RolePolicyAttachment(f"{name}-node-{key}", role=role.name, policy_arn=arn, opts=pulumi.ResourceOptions(parent=self)) for key, arn in NODE_POLICIES.items()
        ]
        self.node_role = role
        self.node_groups = {}
        for key, ng in (("arm", self._s.node_groups.arm), ("x86", self._s.node_groups.x86)):
            template = self._create_launch_template(f"{name}-{key}", ng.disk_size_gib)
            self.node_groups[key] = eks.ManagedNodeGroup(
                f"{name}-{key}",
                cluster=self.eks_cluster,
                node_group_name=self._node_group_name(key),
                # explicit: pulumi-eks (v4.3.0, nodejs/eks/nodes/nodegroup.ts createManagedNodeGroup) defaults
                # a managed node group's version to the cluster's only when no launch template is given, and
                # ours always has one; the template names no AMI, so EKS takes the group's version (and the
                # newest AMI release of it) and UpdateNodegroupVersion rolls the nodes when it changes
                version=self._s.cluster.version,
                node_role=role,
                ami_type=ng.AMI_TYPE,
                instance_types=[ng.instance_type],
                capacity_type="ON_DEMAND",
                scaling_config=aws.eks.NodeGroupScalingConfigArgs(min_size=ng.min_size, max_size=ng.max_size, desired_size=ng.desired_size),
                subnet_ids=network.private_subnet_ids,
                # our own launch template: pulumi-eks's enableIMDSv2 template sets hop limit 2
                # (nodejs/eks/nodes/nodegroup.ts), which lets pods read the node role's credentials
                launch_template=aws.eks.NodeGroupLaunchTemplateArgs(id=template.id, version=template.latest_version.apply(str)),
                labels={ARCH_LABEL: ng.ARCH, NODE_ROLE_LABEL: "system"},
                tags=self._tags,
                # after the control plane (and the kube-proxy and VPC CNI add-ons inside the pulumi-eks
                # component): a kubelet must not be newer than kube-apiserver (Kubernetes version skew
                # policy, kubernetes/website content/en/releases/version-skew-policy.md); the add-ons
                # created here and in the other components depend on the node groups in turn
                opts=pulumi.ResourceOptions(parent=self, depends_on=[self.eks_cluster, *node_policies]),
            )


    def _create_launch_template(self, name: str, disk_size_gib: int) -> aws.ec2.LaunchTemplate:
        """The managed node groups' launch template: IMDSv2 only with a hop limit of 1 (a pod, one hop
        further than the node, gets no answer from the instance metadata service and so none of the
        node role's credentials), and an encrypted gp3 root volume. No AMI: EKS picks the group's."""
        return aws.ec2.LaunchTemplate(
            f"{name}-lt",
            description="training-platform managed node group: IMDSv2, hop limit 1, encrypted root volume",
            metadata_options=aws.ec2.LaunchTemplateMetadataOptionsArgs(http_endpoint="enabled", http_tokens="required", http_put_response_hop_limit=NODE_METADATA_HOP_LIMIT, instance_metadata_tags="disabled"),
            block_device_mappings=[aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
                device_name="/dev/xvda",
                ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(volume_size=disk_size_gib, volume_type="gp3", encrypted="true", delete_on_termination="true"),
            )],
            tag_specifications=[aws.ec2.LaunchTemplateTagSpecificationArgs(resource_type=t, tags=self._tags) for t in ("instance", "volume")],
            tags=self._tags,
            opts=pulumi.ResourceOptions(parent=self),
        )


NODE_METADATA_HOP_LIMIT = 1


def iam_principal_of(caller_arn: str) -> str:
    """The IAM principal behind a caller ARN: an STS assumed-role session
    (``arn:aws:sts::ACCOUNT:assumed-role/ROLE/SESSION``) is the role
    ``arn:aws:iam::ACCOUNT:role/ROLE``; users and roles are returned unchanged."""
    parts = caller_arn.split(":", 5)
    if len(parts) == 6 and parts[2] == "sts" and parts[5].startswith("assumed-role/"):
        role = parts[5].split("/")[1]
        return f"arn:{parts[1]}:iam::{parts[4]}:role/{role}"
    return caller_arn


def _principal_key(arn: str) -> tuple[str, str, str, str]:
    """(partition, account, kind, name) of an IAM principal, ignoring the role path: an STS
    session names its role without the path, and EKS matches the role itself."""
    arn = iam_principal_of(arn)
    parts = arn.split(":", 5)
    if len(parts) < 6:
        return (arn, "", "", "")
    kind, _, rest = parts[5].partition("/")
    return (parts[1], parts[4], kind, rest.rsplit("/", 1)[-1])


def admin_access_entries(admin_arns: list[str], *, creator_arn: str | None) -> dict[str, eks.AccessEntryArgs]:
    """Cluster-admin access entries for ``admin_arns``, keyed by their position in the list (so
    removing one never renames the others), leaving out the cluster's creator, who already has
    EKS's bootstrap admin entry."""
    creator = _principal_key(creator_arn) if creator_arn else None
    return {
        f"admin-{i}": eks.AccessEntryArgs(
            principal_arn=arn,
            access_policies={"cluster-admin": eks.AccessPolicyAssociationArgs(policy_arn=CLUSTER_ADMIN_POLICY, access_scope=aws.eks.AccessPolicyAssociationAccessScopeArgs(type="cluster"))},
        )
        for i, arn in enumerate(admin_arns)
        if _principal_key(arn) != creator
    }


def ci_access_entries(ci: CiAccessSettings, *, creator_arn: str | None) -> dict[str, eks.AccessEntryArgs]:
    """Access entries for the CI workflows' roles, cluster-wide, each with the one access policy its
    job needs, leaving out the cluster's creator (EKS's bootstrap admin entry already covers it).

    * deploy (``pulumi up``): AmazonEKSClusterAdminPolicy. The program writes cluster-scoped objects
      (CRDs through Helm, ClusterRoles and their bindings, webhooks, ClusterTrainingRuntimes, NodePools),
      which only ClusterAdmin among the EKS access policies allows.
    * preview: AmazonEKSViewPolicy, unless ``ci.previewDryRun``. The Kubernetes provider previews with
      server-side dry-run requests (pulumi-kubernetes v4 provider/pkg/await/await.go: every create and
      update patch of a preview carries ``dryRun=All``), and "authorization for dry-run and non-dry-run
      requests is identical" (Kubernetes docs, reference/using-api/api-concepts.md, "Dry-run
      authorization"): only write rights let a dry-run through. When the API server forbids one, the
      provider previews the object from the program's inputs instead of failing
      (provider/pkg/provider/provider.go Create and Update: ``IsForbidden`` during a preview), so a
      read-only preview role gives the same plan without server-side admission and validation, which
      ``make validate`` checks offline. ``previewDryRun`` grants ClusterAdmin for the full server-side
      preview, and with it writes to everyone who can run the preview workflow.
    """
    creator = _principal_key(creator_arn) if creator_arn else None
    wanted = (("ci-preview", ci.preview_role_arn, CLUSTER_ADMIN_POLICY if ci.preview_dry_run else VIEW_POLICY), ("ci-deploy", ci.deploy_role_arn, CLUSTER_ADMIN_POLICY))
    return {
        key: eks.AccessEntryArgs(
            principal_arn=arn,
            access_policies={policy.rsplit("/", 1)[-1]: eks.AccessPolicyAssociationArgs(policy_arn=policy, access_scope=aws.eks.AccessPolicyAssociationAccessScopeArgs(type="cluster"))},
        )
        for key, arn, policy in wanted
        if arn is not None and _principal_key(arn) != creator
    }
