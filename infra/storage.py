"""Durable checkpoint storage: FSx for Lustre (default) or EFS, with its CSI driver add-on.

FSx for Lustre is the default for training: hundreds of MB/s per TiB and sub-millisecond latency
for large sharded checkpoint writes from every rank at once. EFS is simpler and elastic (no
capacity to size, multi-AZ) but slower for bursts of large writes. Both are mounted ReadWriteMany
through a static PersistentVolume, so the CSI drivers call no AWS API.

EFS is fenced by a file-system policy: without one, EFS's default policy lets any client that
reaches a mount target mount the root anonymously (EFS User Guide, "Using IAM to control file
system access": "Default EFS file system policy"). Ours allows only the cluster's node roles, over
TLS, through an access point; the platform's own volume mounts the root through its access point
and teams mount theirs (k8s/tenants.py), so no pod reaches another team's directory.
"""

from __future__ import annotations

import json
from typing import TypedDict

import pulumi
import pulumi_aws as aws

import versions
from config.settings import Settings
from infra.cluster import Cluster
from infra.network import Network
from k8s.builders.tenants import efs_volume_handle

# Ports from the FSx for Lustre User Guide ("File system access control with Amazon VPC"): Lustre
# clients and file servers talk on TCP 988 and 1018-1023, and servers also open connections back
# to clients, so both the file system's and the clients' groups allow them in both directions.
LUSTRE_PORTS = [(988, 988), (1018, 1023)]
# EFS User Guide ("Using VPC security groups"): NFS clients connect to mount targets on TCP 2049.
NFS_PORTS = [(2049, 2049)]


class _PortRule(TypedDict):
    """The protocol and port range shared by a security group rule's keyword arguments."""

    ip_protocol: str
    from_port: int
    to_port: int


# aws-efs-csi-driver: ``tls`` encrypts the mount, ``iam`` makes efs-utils sign it with the node's
# credentials (efs-csi-node runs on the host network, so IMDS at hop limit 1 answers it); EFS User
# Guide "Mounting with IAM authorization": ``iam`` requires ``tls``.
EFS_MOUNT_OPTIONS = ["tls", "iam"]


def efs_file_system_policy(*, file_system_arn: str, node_role_arns: list[str], platform_access_point_arn: str) -> dict:
    """The checkpoint file system's policy (EFS User Guide, "Using IAM to control file system
    access" and "Using access points in IAM policies"): an anonymous client matches no Allow, so
    IAM is required; the node roles may mount and write only through a mount target and an access
    point (``elasticfilesystem:AccessPointArn`` is absent on a mount without one); root access
    (``ClientRootAccess``, otherwise squashed to nfsnobody) only through the platform's access point,
    whose volume only the platform's namespace can claim; no mount without TLS."""
    nodes = {"AWS": sorted(set(node_role_arns))}
    via_mount_target = {"elasticfilesystem:AccessedViaMountTarget": "true"}
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "NodesThroughAccessPoints",
                "Effect": "Allow",
                "Principal": nodes,
                "Action": ["elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite"],
                "Resource": file_system_arn,
                "Condition": {"Bool": via_mount_target, "Null": {"elasticfilesystem:AccessPointArn": "false"}},
            },
            {
                "Sid": "RootOnlyThroughThePlatformAccessPoint",
                "Effect": "Allow",
                "Principal": nodes,
                "Action": ["elasticfilesystem:ClientRootAccess"],
                "Resource": file_system_arn,
                "Condition": {"Bool": via_mount_target, "StringEquals": {"elasticfilesystem:AccessPointArn": platform_access_point_arn}},
            },
            {
                "Sid": "DenyWithoutTls",
                "Effect": "Deny",
                "Principal": {"AWS": "*"},
                "Action": "*",
                "Resource": file_system_arn,
                "Condition": {"Bool": {"aws:SecureTransport": "false"}},
            },
        ],
    }


class CheckpointStorage(pulumi.ComponentResource):
    volume_handle: pulumi.Output[str]
    attributes: dict | None
    mount_options: list[str] | None
    capacity_gib: int
    addon: aws.eks.Addon

    def __init__(
        self, name: str, *, settings: Settings, cluster: Cluster, network: Network, node_role_arns: list[pulumi.Output[str]], tags: dict[str, str], opts: pulumi.ResourceOptions | None = None
    ):
        """``node_role_arns``: every role the cluster's nodes run as (managed node groups,
        Karpenter's or Auto Mode's nodes): the EFS file-system policy lets only these mount."""
        super().__init__("training-platform:infra:CheckpointStorage", name, None, opts)
        self._s = settings
        self._node_role_arns = node_role_arns
        self._cluster = cluster
        self._network = network
        self._tags = tags
        self.type = settings.trainjobs.checkpoint_storage.type
        if self.type == "fsx":
            self._create_fsx(name)
        else:
            self._create_efs(name)
        self.register_outputs({"volumeHandle": self.volume_handle})

    def platform_volume_name(self, namespace: str) -> str:
        """The name of the platform's own volume in ``namespace``. On EFS it mounts through the
        platform's access point: a volume source is immutable, so that volume has a name of its
        own (the claim moves to it; the old volume, ``Retain``, is deleted and the data stays)."""
        return f"{namespace}-checkpoints" + ("-ap" if self.type == "efs" else "")

    def _opts(self, **kw) -> pulumi.ResourceOptions:
        return pulumi.ResourceOptions(parent=self, **kw)

    def _security_group(self, name: str, ports: list[tuple[int, int]], *, servers_connect_back: bool) -> tuple[aws.ec2.SecurityGroup, list[pulumi.Resource]]:
        """The file system's group. Clients are the nodes in the EKS cluster security group (managed
        and Karpenter nodes alike); its default egress allows everything, so client-to-server
        traffic needs only the file system's ingress. ``servers_connect_back`` (Lustre) adds the
        reverse path: the file system's egress to clients and the cluster group's ingress from it.
        Returns the group and its rules (separate resources, created in parallel with whatever
        only references the group)."""
        sg = aws.ec2.SecurityGroup(f"{name}-sg", vpc_id=self._network.vpc_id, description=f"{self.type} checkpoints from cluster nodes", tags=self._tags, opts=self._opts())
        nodes = self._cluster.security_group_id
        rules: list[pulumi.Resource] = []
        for lo, hi in ports:
            rule = _PortRule(ip_protocol="tcp", from_port=lo, to_port=hi)
            rules.append(aws.vpc.SecurityGroupIngressRule(f"{name}-from-nodes-{lo}", security_group_id=sg.id, referenced_security_group_id=nodes, description="from cluster nodes", **rule, opts=self._opts()))
            rules.append(aws.vpc.SecurityGroupIngressRule(f"{name}-from-self-{lo}", security_group_id=sg.id, referenced_security_group_id=sg.id, description="between file servers", **rule, opts=self._opts()))
            rules.append(aws.vpc.SecurityGroupEgressRule(f"{name}-to-self-{lo}", security_group_id=sg.id, referenced_security_group_id=sg.id, description="between file servers", **rule, opts=self._opts()))
            if servers_connect_back:
                rules.append(aws.vpc.SecurityGroupEgressRule(f"{name}-to-nodes-{lo}", security_group_id=sg.id, referenced_security_group_id=nodes, description="to cluster nodes", **rule, opts=self._opts()))
                rules.append(aws.vpc.SecurityGroupIngressRule(f"{name}-nodes-from-fs-{lo}", security_group_id=nodes, referenced_security_group_id=sg.id, description=f"{self.type} servers to clients", **rule, opts=self._opts()))
        return sg, rules

    def _addon(self, name: str, addon: str, version: str) -> None:
        self.addon = aws.eks.Addon(
            f"{name}-csi", cluster_name=self._cluster.eks_cluster.eks_cluster.name, addon_name=addon, addon_version=version,
            opts=self._opts(depends_on=list(self._cluster.node_groups.values())),
        )

    def _create_fsx(self, name: str) -> None:
        cfg = self._s.trainjobs.checkpoint_storage
        sg, rules = self._security_group(name, LUSTRE_PORTS, servers_connect_back=True)
        fs = aws.fsx.LustreFileSystem(
            f"{name}-fsx",
            storage_capacity=cfg.capacity_gib,
            subnet_ids=self._network.private_subnet_ids.apply(lambda ids: ids[0]),  # Lustre lives in one subnet
            security_group_ids=[sg.id],
            deployment_type="PERSISTENT_2",
            per_unit_storage_throughput=cfg.throughput_per_tib,
            file_system_type_version="2.15",
            data_compression_type="LZ4",
            # daily backups, and a final one when the file system is deleted (the provider's default
            # skips it): `pulumi destroy` keeps the checkpoints as a backup
            automatic_backup_retention_days=cfg.backup_retention_days,
            daily_automatic_backup_start_time="03:00" if cfg.backup_retention_days else None,
            copy_tags_to_backups=True,
            skip_final_backup=False,
            final_backup_tags={**self._tags, "training-platform/final-backup": f"{self._cluster.name}-checkpoints"},
            tags={**self._tags, "Name": f"{self._cluster.name}-checkpoints"},
            # FSx checks the groups' LNET rules (988, 1018-1023) in CreateFileSystem and fails with
            # InvalidNetworkSettings when they are not there yet: the rules are resources of their
            # own, so it waits for them (aws/aws-parallelcluster#6181, the same race; #1198)
            opts=self._opts(protect=cfg.protect, depends_on=rules),
        )
        self._addon(name, "aws-fsx-csi-driver", versions.FSX_CSI_ADDON_VERSION)
        self.volume_handle = fs.id
        self.attributes = {"dnsname": fs.dns_name, "mountname": fs.mount_name}
        self.mount_options = ["flock"]
        self.capacity_gib = cfg.capacity_gib
        self.file_system = fs

    def _create_efs(self, name: str) -> None:
        # EFS validates a mount target's groups (SecurityGroupNotFound) but not their rules (EFS API
        # Reference, CreateMountTarget: its errors): the mount targets need only the group itself
        sg, _ = self._security_group(name, NFS_PORTS, servers_connect_back=False)
        cfg = self._s.trainjobs.checkpoint_storage
        fs = aws.efs.FileSystem(
            f"{name}-efs", encrypted=True, performance_mode="generalPurpose", throughput_mode="elastic",
            tags={**self._tags, "Name": f"{self._cluster.name}-checkpoints"}, opts=self._opts(protect=cfg.protect),
        )
        # AWS Backup's default daily plan for EFS (recovery points outlive the file system)
        aws.efs.BackupPolicy(f"{name}-efs-backup", file_system_id=fs.id, backup_policy=aws.efs.BackupPolicyBackupPolicyArgs(status="ENABLED" if cfg.backup_retention_days else "DISABLED"), opts=self._opts())
        count = self._s.network.az_count if self._s.network.create_vpc else len(self._s.network.private_subnet_ids)
        for i in range(count):
            aws.efs.MountTarget(f"{name}-efs-{i}", file_system_id=fs.id, subnet_id=self._network.private_subnet_ids.apply(lambda ids, i=i: ids[i]), security_groups=[sg.id], opts=self._opts())
        # the platform's own volume: the root, as the user the pod runs as (its setup Job chowns the
        # root to the training user; the Trainer's initializers run as root)
        platform = aws.efs.AccessPoint(f"{name}-efs-platform", file_system_id=fs.id, root_directory=aws.efs.AccessPointRootDirectoryArgs(path="/"), tags=self._tags, opts=self._opts())
        policy = pulumi.Output.all(fs.arn, platform.arn, *self._node_role_arns).apply(
            lambda a: json.dumps(efs_file_system_policy(file_system_arn=a[0], platform_access_point_arn=a[1], node_role_arns=list(a[2:]))),
        )
        self.file_system_policy = aws.efs.FileSystemPolicy(f"{name}-efs-policy", file_system_id=fs.id, policy=policy, opts=self._opts())
        self._addon(name, "aws-efs-csi-driver", versions.EFS_CSI_ADDON_VERSION)
        self.volume_handle = pulumi.Output.all(fs.id, platform.id).apply(lambda ids: efs_volume_handle(ids[0], ids[1]))
        self.attributes = None
        self.mount_options = list(EFS_MOUNT_OPTIONS)
        self.capacity_gib = 1024  # nominal: EFS is elastic
        self.file_system = fs
