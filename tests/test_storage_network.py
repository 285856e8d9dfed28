"""Checkpoint storage is reachable from the nodes, evaluated on the plan's security-group rules.

Required traffic, from AWS's documentation:
* FSx for Lustre User Guide, "File system access control with Amazon VPC": TCP 988 and 1018-1023
  between clients and the file system in both directions (file servers connect back to clients),
  and among the file servers themselves.
* EFS User Guide, "Using VPC security groups for Amazon EC2 instances and mount targets": clients
  connect to mount targets on TCP 2049.
The EKS-managed cluster security group, which every node joins, allows all outbound traffic
(EKS User Guide, "View Amazon EKS security group requirements for clusters"): its egress is
modelled below, since EKS creates it, not this program.
"""

from __future__ import annotations

import pytest

from tests.conftest import dev_config, run_config, run_stack

CLUSTER_SG = "cluster-sg"  # stands for the EKS-managed group (an output of the cluster)
LUSTRE = [988] + list(range(1018, 1024))
NFS = [2049]


class Rules:
    def __init__(self, run):
        self.ingress: list[tuple[str, str, int, int]] = []
        self.egress: list[tuple[str, str, int, int]] = [(CLUSTER_SG, "0.0.0.0/0", 0, 65535)]
        self.groups = {}
        for sg in run.by_type("aws:ec2/securityGroup:SecurityGroup"):
            self.groups[sg.id] = sg.name
        for typ, bucket in (("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule", self.ingress), ("aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule", self.egress)):
            for r in run.by_type(typ):
                i = r.inputs
                if i.get("ipProtocol") not in ("tcp", "-1"):
                    continue
                lo, hi = (0, 65535) if i["ipProtocol"] == "-1" else (i["fromPort"], i["toPort"])
                bucket.append((self.name(i["securityGroupId"]), self.name(i.get("referencedSecurityGroupId")) if i.get("referencedSecurityGroupId") else i.get("cidrIpv4"), lo, hi))

    def name(self, sg_id) -> str:
        """The program's groups by name; any other id is the EKS-managed cluster group (the only
        group the program references without creating it)."""
        return self.groups.get(sg_id, CLUSTER_SG)

    def allows(self, src: str, dst: str, port: int) -> bool:
        out = any(g == src and peer in (dst, "0.0.0.0/0") and lo <= port <= hi for g, peer, lo, hi in self.egress)
        inn = any(g == dst and peer == src and lo <= port <= hi for g, peer, lo, hi in self.ingress)
        return out and inn


def _fs_group(run, prefix: str) -> str:
    names = [sg.name for sg in run.by_type("aws:ec2/securityGroup:SecurityGroup") if sg.name.startswith(prefix)]
    assert len(names) == 1, names
    return names[0]


def test_lustre_traffic_flows_both_ways_between_nodes_and_file_servers():
    run = run_stack("dev")
    rules = Rules(run)
    fs = _fs_group(run, "checkpoints-sg")
    for port in LUSTRE:
        assert rules.allows(CLUSTER_SG, fs, port), f"nodes -> FSx {port}"
        assert rules.allows(fs, CLUSTER_SG, port), f"FSx -> nodes {port}"
        assert rules.allows(fs, fs, port), f"FSx -> FSx {port}"
    assert not rules.allows(fs, CLUSTER_SG, 22) and not rules.allows(fs, fs, 2049)  # nothing more is opened


def test_efs_clients_reach_mount_targets_on_nfs_only():
    run = run_config(dev_config(trainjobs={"checkpointStorage": {"type": "efs"}}))
    rules = Rules(run)
    fs = _fs_group(run, "checkpoints-sg")
    assert rules.allows(CLUSTER_SG, fs, 2049)
    assert not rules.allows(CLUSTER_SG, fs, 988)
    # EFS never connects back: no rule opens the nodes' group to the file system
    assert not [r for r in rules.ingress if r[0] == CLUSTER_SG and r[1] == fs]


@pytest.mark.parametrize("port", [988, 1018, 1023])
def test_security_group_model_fails_without_the_reverse_rules(port):
    """The evaluator itself: drop the nodes' ingress from the file system and the path breaks."""
    run = run_stack("dev")
    rules = Rules(run)
    fs = _fs_group(run, "checkpoints-sg")
    rules.ingress = [r for r in rules.ingress if not (r[0] == CLUSTER_SG and r[1] == fs)]
    assert not rules.allows(fs, CLUSTER_SG, port)


def test_checkpoints_are_backed_up_and_outlive_a_destroy():
    """Daily backups with the configured retention and a final backup on delete (pulumi-aws's
    LustreFileSystem skips it unless skipFinalBackup is false); prod protects the file system."""
    fsx = run_stack("dev").one("aws:fsx/lustreFileSystem:LustreFileSystem").inputs
    assert fsx["automaticBackupRetentionDays"] == 7 and fsx["skipFinalBackup"] is False and fsx["copyTagsToBackups"] is True
    prod = run_stack("prod")
    assert prod.one("aws:fsx/lustreFileSystem:LustreFileSystem").inputs["automaticBackupRetentionDays"] == 30
    efs = run_config(dev_config(trainjobs={"checkpointStorage": {"type": "efs"}}))
    assert efs.one("aws:efs/backupPolicy:BackupPolicy").inputs["backupPolicy"] == {"status": "ENABLED"}
    off = run_config(dev_config(trainjobs={"checkpointStorage": {"type": "efs", "backupRetentionDays": 0}}))
    assert off.one("aws:efs/backupPolicy:BackupPolicy").inputs["backupPolicy"] == {"status": "DISABLED"}
