"""The teams (builders: ``k8s/builders/tenants.py``, ``k8s/builders/kueue.py``): per team, namespace
objects, checkpoint volume, ClusterQueue and LocalQueue, EKS access entries.

Why no tenant principal ever gets cluster scope: a team's access entry carries only the team's
Kubernetes group, bound by a RoleBinding inside the team's namespace; the optional AWS-managed
view policy is associated with ``accessScope.type: namespace`` naming that namespace alone. A
cluster-scoped association would let the team read (or with other policies, change) every
namespace, the other teams' included. AWS: "If none of the access policies meet your
requirements, then don't associate an access policy ... specify one or more group names ... and
create and manage Kubernetes role-based access control objects", and a principal with a policy
gets the policy's rights *and* its groups' (EKS User Guide, "Associate access policies with
access entries"; CreateAccessEntry ``kubernetesGroups``).
"""

from __future__ import annotations

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as kube

import versions
from config.settings import Settings
from infra.cluster import Cluster
from infra.storage import CheckpointStorage
from infra.team_identity import TeamIdentity
from k8s.builders import admission, platform_facts, trainer_api
from k8s.builders import kueue as kq
from k8s.builders import tenants as tn
from k8s.builders.volume_setup import tenant_dirs_job
from k8s.kueue import Kueue
from k8s.resources import apply_manifest

VIEW_POLICY = "arn:aws:eks::aws:cluster-access-policy/AmazonEKSViewPolicy"


class Tenants(pulumi.ComponentResource):
    """Every team of ``settings.tenants``."""

    def __init__(
        self,
        name: str,
        *,
        settings: Settings,
        cluster: Cluster,
        storage: CheckpointStorage,
        kueue: Kueue | None,
        provider: kube.Provider,
        tags: dict[str, str],
        image: pulumi.Input[str] | None = None,
        pod_identity_agent: pulumi.Resource | None = None,
        endpoint_ips: pulumi.Input[list[str]] | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ):
        """``image``: the platform's training image (``<repo>@<digest>``), published to teams.
        ``pod_identity_agent``: the EKS add-on the teams' Pod Identity associations wait for."""
        super().__init__("training-platform:k8s:Tenants", name, None, opts)
        self._s = settings
        self._storage = storage
        # what trainctl defaults and checks a team's job with (k8s/builders/platform_facts.py); the image by digest
        image_ref = pulumi.Output.from_input(image)
        self._provider = provider
        teams = settings.tenants.teams()
        dirs_ready = self._fsx_directories(sorted(teams)) if storage.type == "fsx" else []
        self.namespaces: dict[str, str] = {}
        self.identities: dict[str, TeamIdentity] = {}
        reader = self._apply(tn.runtime_reader_role())
        reader_binding = self._apply(tn.runtime_reader_binding(list(teams)), reader)
        # what a team's TrainJob may change of its pods, checked by the API server (k8s/builders/admission.py);
        # in place before any team principal gets access
        gpu_pools = kq.pools(settings)
        policy = self._apply(admission.trainjob_policy(
            [p.name for p in gpu_pools], instance_types=sorted({t for p in gpu_pools for t in p.instance_types}),
            queue=tn.LOCAL_QUEUE if kueue is not None else None, priorities=list(kq.PRIORITIES),
        ))
        policy_binding = self._apply(admission.trainjob_policy_binding(), policy)
        # which ConfigMaps a team may create and delete (its code only, not what the platform publishes)
        configmap_policy = self._apply(admission.configmap_policy())
        fences = self._apply(admission.configmap_policy_binding(), configmap_policy, policy_binding)
        # which Secrets a team may write (its Role: write-only): no service-account token Secrets
        secret_fence = self._apply(admission.secret_policy_binding(), self._apply(admission.secret_policy()))
        # the VPC's interface endpoints (network.interfaceEndpoints), which private DNS gives for the AWS APIs
        endpoints = pulumi.Output.from_input(endpoint_ips).apply(tn.endpoint_peers) if endpoint_ips is not None and settings.network.interface_endpoints else None
        for team, tenant in teams.items():
            ns_name = settings.tenants.namespace_of(team)
            self.namespaces[team] = ns_name
            ns = self._apply(tn.namespace(ns_name, team))
            gpu_cap = kq.gpu_ceiling(settings) if kueue else (tenant.gpu_quota or 0)
            facts_doc = image_ref.apply(lambda ref, team=team: platform_facts.dumps(platform_facts.facts(settings, ref, team)))
            self._apply(platform_facts.configmap(ns_name, facts_doc, {tn.TEAM_LABEL: team}), ns)
            manifests = (tn.resource_quota(ns_name, team, tenant, gpu_cap=gpu_cap, kueue=kueue is not None, storage_gib=storage.capacity_gib), tn.limit_range(ns_name, team), tn.network_policy(ns_name, team), tn.egress_policy(ns_name, {tn.TEAM_LABEL: team}, trainer_status=trainer_api.status_server_on(settings.trainer), pod_identity=bool(tenant.s3), endpoints=endpoints), tn.role(ns_name, team), tn.service_account(ns_name, team))
            for manifest in manifests:
                self._apply(manifest, ns)
            binding = self._apply(tn.role_binding(ns_name, team), ns)
            if tenant.s3:  # the team's AWS identity: a role with its S3 grants, for its jobs' service account
                self.identities[team] = TeamIdentity(
                    f"{name}-{team}-identity", cluster_name=settings.cluster_name, eks_cluster_name=cluster.eks_cluster.eks_cluster.name, region=settings.region, team=team,
                    namespace=ns_name, grants=tenant.s3, tags=tags, pod_identity_agent=pod_identity_agent, opts=pulumi.ResourceOptions(parent=self),
                )
            self._checkpoint_volume(team, ns_name, ns, dirs_ready)
            if kueue is not None:
                cq = self._apply(kq.team_cluster_queue(team, tenant, namespace=ns_name, settings=settings), *kueue.ready)
                self._apply(kq.local_queue(ns_name, kq.team_queue_name(team), team), ns, cq)
            for i, arn in enumerate(tenant.principal_arns):
                entry = aws.eks.AccessEntry(
                    f"{name}-{team}-{i}",
                    cluster_name=cluster.eks_cluster.eks_cluster.name,
                    principal_arn=arn,
                    type="STANDARD",
                    kubernetes_groups=[tn.team_group(team)],
                    tags=tags,
                    opts=pulumi.ResourceOptions(parent=self, depends_on=[binding, reader_binding, fences, secret_fence]),
                )
                if tenant.namespace_view_policy:
                    aws.eks.AccessPolicyAssociation(
                        f"{name}-{team}-{i}-view",
                        cluster_name=cluster.eks_cluster.eks_cluster.name,
                        principal_arn=arn,
                        policy_arn=VIEW_POLICY,
                        access_scope=aws.eks.AccessPolicyAssociationAccessScopeArgs(type="namespace", namespaces=[ns_name]),
                        opts=pulumi.ResourceOptions(parent=self, depends_on=[entry]),
                    )
        self.register_outputs({"namespaces": self.namespaces})

    def _apply(self, manifest: dict, *deps: pulumi.Resource) -> pulumi.CustomResource:
        return apply_manifest(manifest, pulumi.ResourceOptions(parent=self, provider=self._provider, depends_on=list(deps)))

    def _fsx_directories(self, teams: list[str]) -> list[pulumi.Resource]:
        """The teams' directories on FSx for Lustre (the CSI driver mounts a sub-directory only if
        it exists): a Job in its own namespace mounts the file system's root and creates them."""
        st = self._storage
        ns = self._apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": tn.STORAGE_NAMESPACE, "labels": dict(tn.POD_SECURITY_LABELS)}})
        pv_manifest, pvc_manifest = tn.checkpoint_volume(
            ns=tn.STORAGE_NAMESPACE, storage_type=st.type, volume_handle=st.volume_handle, capacity_gib=st.capacity_gib, attributes=st.attributes, mount_options=st.mount_options
        )
        pv = self._apply(pv_manifest, st.addon)
        pvc = self._apply(pvc_manifest, ns, pv)
        job = self._apply(tenant_dirs_job(teams, uid=int(versions.WORKLOAD_UID), image=versions.VOLUME_SETUP_IMAGE), pvc)
        return [job]

    def _checkpoint_volume(self, team: str, ns_name: str, ns: pulumi.Resource, dirs_ready: list[pulumi.Resource]) -> None:
        """The team's ``checkpoints`` claim, bound to a volume of the team's own directory: an EFS
        access point rooted there, or a Lustre sub-directory mount. Teams cannot create
        PersistentVolumes (their Role), so they reach no other directory."""
        st = self._storage
        fs = st.file_system
        if st.type == "efs":
            uid = int(versions.WORKLOAD_UID)
            ap = aws.efs.AccessPoint(
                f"{team}-checkpoints",
                file_system_id=fs.id,
                # EFS creates the root directory on first mount with this owner and mode
                root_directory=aws.efs.AccessPointRootDirectoryArgs(
                    path=f"/{tn.team_directory(team)}",
                    creation_info=aws.efs.AccessPointRootDirectoryCreationInfoArgs(owner_uid=uid, owner_gid=uid, permissions="0750"),
                ),
                posix_user=aws.efs.AccessPointPosixUserArgs(uid=uid, gid=uid),
                opts=pulumi.ResourceOptions(parent=self),
            )
            handle = pulumi.Output.all(fs.id, ap.id).apply(lambda ids: tn.efs_volume_handle(ids[0], ids[1]))
            attributes = None
        else:
            assert isinstance(fs, aws.fsx.LustreFileSystem)
            volume = pulumi.Output.all(fs.id, fs.mount_name).apply(lambda v: tn.fsx_volume(v[0], v[1], team))
            handle = volume.apply(lambda v: v[0])
            attributes = {"dnsname": fs.dns_name, "mountname": volume.apply(lambda v: v[1])}
        pv_manifest, pvc_manifest = tn.checkpoint_volume(ns=ns_name, storage_type=st.type, volume_handle=handle, capacity_gib=st.capacity_gib, attributes=attributes, mount_options=st.mount_options)
        pv_manifest["metadata"]["labels"] = {tn.TEAM_LABEL: team}
        pv = self._apply(pv_manifest, st.addon, *dirs_ready)
        self._apply(pvc_manifest, ns, pv)
