"""EFS checkpoints are fenced by a file-system policy: IAM required, access points required, root
only through the platform's own access point, TLS required.

AWS facts encoded here (EFS User Guide):
* "Using IAM to control file system access": without a file-system policy EFS's default policy
  grants full access to any anonymous client that reaches a mount target; with one, a client is
  allowed an action (ClientMount, ClientWrite, ClientRootAccess) only if a statement allows it,
  and root without ClientRootAccess is squashed. Condition keys for clients: aws:SecureTransport,
  elasticfilesystem:AccessPointArn, elasticfilesystem:AccessedViaMountTarget.
* "Using access points in IAM policies": elasticfilesystem:AccessPointArn is the access point the
  file system is mounted with (absent without one).
* IAM policy evaluation logic (tests/iam_eval.py): an explicit Deny wins; otherwise an Allow is
  needed. The ``Null`` operator with "false" asks that the key be present.
tests/iam_eval.py applies these rules to the rendered policy.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from tests import iam_eval
from tests.conftest import dev_config, run_config, run_stack

EFS = {"checkpointStorage": {"type": "efs"}}


@dataclass
class Mount:
    principal: str | None  # None: an anonymous client (mounted without the iam option)
    access_point: str | None
    tls: bool = True
    via_mount_target: bool = True


def _context(m: Mount) -> dict[str, str]:
    ctx = {"aws:SecureTransport": str(m.tls).lower(), "elasticfilesystem:AccessedViaMountTarget": str(m.via_mount_target).lower()}
    if m.access_point:
        ctx["elasticfilesystem:AccessPointArn"] = m.access_point
    return ctx


def allowed(policy: dict, m: Mount, action: str) -> bool:
    """IAM's decision for a mount under the file system's policy (whose statements all name the
    file system as their Resource)."""
    resource = policy["Statement"][0]["Resource"]
    who = {"AWS": m.principal} if m.principal else None
    return iam_eval.allowed(policy, iam_eval.Request(who, action, resource, _context(m)))


def _policy(run) -> dict:
    return json.loads(run.one("aws:efs/fileSystemPolicy:FileSystemPolicy").inputs["policy"])


def _roles(run) -> dict[str, str]:
    return {r.name: r.state["arn"] for r in run.by_type("aws:iam/role:Role")}


def _access_points(run) -> dict[str, str]:
    return {r.name: r.state["arn"] for r in run.by_type("aws:efs/accessPoint:AccessPoint")}


def test_only_node_roles_mount_and_only_through_an_access_point():
    run = run_config(dev_config(trainjobs=EFS))
    policy, roles, aps = _policy(run), _roles(run), _access_points(run)
    nodes = [roles["eks-node-role"], roles["gpu-karpenter-node"]]
    platform = aps["checkpoints-efs-platform"]
    for role in nodes:
        assert allowed(policy, Mount(role, platform), "elasticfilesystem:ClientWrite")
        assert allowed(policy, Mount(role, platform), "elasticfilesystem:ClientRootAccess")
        assert not allowed(policy, Mount(role, None), "elasticfilesystem:ClientMount"), "the root without an access point"
        assert not allowed(policy, Mount(role, platform, tls=False), "elasticfilesystem:ClientMount"), "without TLS"
        assert not allowed(policy, Mount(role, platform, via_mount_target=False), "elasticfilesystem:ClientMount")
    assert not allowed(policy, Mount(None, platform), "elasticfilesystem:ClientMount"), "an anonymous (non-IAM) mount"
    other = roles["eks-node-role"].rsplit("/", 1)[0] + "/someone-else"
    assert not allowed(policy, Mount(other, platform), "elasticfilesystem:ClientMount")


def test_team_access_points_give_no_root():
    config = dev_config(trainjobs=EFS, tenants={"vision": {"gpuQuota": 8}, "nlp": {"gpuQuota": 8}})
    run = run_config(config)
    policy, roles, aps = _policy(run), _roles(run), _access_points(run)
    node = roles["eks-node-role"]
    assert {"vision-checkpoints", "nlp-checkpoints"} <= set(aps)
    for team in ("vision", "nlp"):
        assert allowed(policy, Mount(node, aps[f"{team}-checkpoints"]), "elasticfilesystem:ClientWrite")
        assert not allowed(policy, Mount(node, aps[f"{team}-checkpoints"]), "elasticfilesystem:ClientRootAccess")
    # every team volume goes through its own access point, signed and encrypted
    pvs = [r.inputs for r in run.by_type("kubernetes:core/v1:PersistentVolume")]
    assert pvs and all(pv["spec"]["mountOptions"] == ["tls", "iam"] and "::fsap-" in pv["spec"]["csi"]["volumeHandle"] for pv in pvs)


def test_auto_mode_nodes_may_mount():
    run = run_config(dev_config(trainjobs=EFS, gpuPool={"mode": "auto"}))
    policy = _policy(run)
    principals = policy["Statement"][0]["Principal"]["AWS"]
    auto = [p for p in principals if "auto-mode-node-role" in p]
    assert len(auto) == 1 and auto[0].startswith("arn:aws:iam::") and ":role/" in auto[0]
    assert allowed(policy, Mount(auto[0], _access_points(run)["checkpoints-efs-platform"]), "elasticfilesystem:ClientMount")
    assert not [r for r in run.by_type("aws:iam/role:Role") if r.name == "gpu-karpenter-node"]


def test_the_platform_volume_moves_to_its_access_point_under_a_new_name():
    """A PV's source is immutable (and a bound PV cannot be deleted while its claim holds it), so
    the volume through the access point has its own name and the claim, whose volumeName is
    immutable, is replaced, deleting first."""
    run = run_config(dev_config(trainjobs=EFS))
    pv = run.one("kubernetes:core/v1:PersistentVolume").inputs
    assert pv["metadata"]["name"] == "training-checkpoints-ap" and pv["spec"]["mountOptions"] == ["tls", "iam"]
    pvc = run.one("kubernetes:core/v1:PersistentVolumeClaim")
    assert pvc.inputs["spec"]["volumeName"] == "training-checkpoints-ap"
    assert pvc.replace_on_changes == ["spec.volumeName"] and pvc.delete_before_replace
    fsx = run_stack("dev").one("kubernetes:core/v1:PersistentVolume").inputs  # FSx keeps its volume
    assert fsx["metadata"]["name"] == "training-checkpoints" and fsx["spec"]["mountOptions"] == ["flock"]


def test_evaluator_refuses_when_the_access_point_condition_is_dropped():
    """The evaluator itself: without the access-point condition a root mount would be allowed."""
    run = run_config(dev_config(trainjobs=EFS))
    policy, roles = _policy(run), _roles(run)
    for s in policy["Statement"]:
        s.get("Condition", {}).pop("Null", None)
    assert allowed(policy, Mount(roles["eks-node-role"], None), "elasticfilesystem:ClientMount")
