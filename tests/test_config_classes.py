"""Classes of configs a new user got through (issue: one config model): each is refused with one
clear line naming its key, every problem at once, no traceback, no secret echoed."""

from __future__ import annotations

import pytest

from config.schema import ConfigError, ConfigErrors
from config.settings import load_settings
from config.stack_file import StackFileError, load_stack_file

P5 = {"efa": {"enabled": True, "availabilityZone": "us-west-2a"}}

BAD = [
    # limits on every path: an EFA job is held to its EFA pool's limit
    ({**P5, "trainjobs": {"ddp": {"enabled": True, "instanceType": "p5.48xlarge", "numNodes": 1000}}}, "trainjobs.ddp.numNodes"),
    # instance types that do not exist (pulumi_aws.ec2.InstanceType), in either node group
    ({"nodeGroups": {"x86": {"instanceType": "c6i.9xlarge"}}}, "nodeGroups.x86.instanceType"),
    ({"nodeGroups": {"arm": {"instanceType": "c7g.9xlarge"}}}, "nodeGroups.arm.instanceType"),
    # network arithmetic
    ({"network": {"cidr": "10.0.0.0/24", "azCount": 6}}, "network.cidr"),
    ({"network": {"cidr": "10.0.0.0/23", "azCount": 3}}, "network.cidr"),
    ({"network": {"vpcId": "vpc-0abc12345def67890", "privateSubnetIds": ["subnet-0abc1234", "subnet-0abc1234"]}}, "network.privateSubnetIds"),
    # identifiers: full matches, ASCII only
    ({"tenants": {"vision\n": {"gpuQuota": 1}}}, "tenants.vision\n"),
    ({"tenants": {"visión": {"gpuQuota": 1}}}, "tenants.visión"),
    ({"cluster": {"adminPrincipalArns": ["arn:aws:iam::123456789012:role/Admin\n"]}}, "cluster.adminPrincipalArns"),
    ({"cluster": {"adminPrincipalArns": ["arn:aws:iam::123456789012:role/Ädmin"]}}, "cluster.adminPrincipalArns"),
    ({"cluster": {"adminPrincipalArns": ["arn:aws:iam::١٢٣٤٥٦٧٨٩٠١٢:role/Admin"]}}, "cluster.adminPrincipalArns"),
    ({"trainjobs": {"ddp": {"enabled": True, "image": "registry.example/org/img:1\n"}}}, "trainjobs.ddp.image"),
    ({"trainjobs": {"fsdp": {"enabled": True, "model": "google-t5/t5-lárge"}}}, "trainjobs.fsdp.model"),
    # an STS session is no principal for an access entry
    ({"cluster": {"adminPrincipalArns": ["arn:aws:sts::123456789012:assumed-role/Admin/alice"]}}, "cluster.adminPrincipalArns"),
    ({"tenants": {"a": {"gpuQuota": 1, "principalArns": ["arn:aws:sts::123456789012:assumed-role/A/bob"]}}}, "tenants.a.principalArns"),
    # keys that do nothing in the chosen mode
    ({"gpuPool": {"mode": "auto", "rootVolumeSizeGib": 400}}, "gpuPool.rootVolumeSizeGib"),
    # sizes that cannot work
    ({"trainer": {"shmSize": "1"}}, "trainer.shmSize"),
    ({"trainer": {"shmSize": "64Mi"}}, "trainer.shmSize"),
    ({"gpuPool": {"gpuLimit": 2**63}}, "gpuPool.gpuLimit"),
    ({"trainjobs": {"ddp": {"enabled": True, "activeDeadlineSeconds": 2**64}}}, "trainjobs.ddp.activeDeadlineSeconds"),
    ({"nodeGroups": {"arm": {"minSize": 0, "desiredSize": 0}, "x86": {"minSize": 0, "desiredSize": 0}}}, "nodeGroups.x86.minSize"),
]


@pytest.mark.parametrize("raw,key", BAD, ids=[f"{i}-{k}" for i, (_, k) in enumerate(BAD)])
def test_each_class_is_one_clear_line(raw, key):
    with pytest.raises(ConfigError) as err:
        load_settings(raw, stack="dev", region="us-west-2")
    assert isinstance(err.value, ConfigErrors)
    assert [k.split("[")[0] for k in err.value.keys] == [key], str(err.value)
    assert "Traceback" not in str(err.value) and len(str(err.value).splitlines()) == 1


def test_an_sts_session_gets_its_role_as_the_hint():
    with pytest.raises(ConfigError) as err:
        load_settings({"cluster": {"adminPrincipalArns": ["arn:aws:sts::123456789012:assumed-role/Admin/alice"]}}, stack="dev", region="us-west-2")
    assert "arn:aws:iam::123456789012:role/Admin" in str(err.value)


def test_a_type_the_region_does_not_sell_is_refused():
    """GovCloud (US-West) sells no g5 on demand (config/aws_facts.yaml, Karpenter's price table)."""
    raw = {"cluster": {"adminPrincipalArns": []}, "trainjobs": {"ddp": {"enabled": True, "instanceType": "g5.xlarge"}}}
    with pytest.raises(ConfigError) as err:
        load_settings(raw, stack="dev", region="us-gov-west-1")
    assert err.value.keys == ["trainjobs.ddp.instanceType"] and "g6.xlarge" in str(err.value)


def test_every_problem_at_once():
    raw = {"nodeGroups": {"x86": {"instanceType": "c6i.9xlarge"}}, "network": {"cidr": "10.0.0.0/24", "azCount": 6}, "trainer": {"shmSize": "1"}}
    with pytest.raises(ConfigError) as err:
        load_settings(raw, stack="dev", region="us-west-2")
    assert sorted(err.value.keys) == ["network.cidr", "nodeGroups.x86.instanceType", "trainer.shmSize"]


def test_good_neighbours_of_the_bad_classes_pass():
    load_settings({"network": {"cidr": "10.0.0.0/20", "azCount": 6}}, stack="dev", region="us-west-2")
    load_settings({"nodeGroups": {"x86": {"instanceType": "c6i.8xlarge"}, "arm": {"minSize": 0, "desiredSize": 0}}}, stack="dev", region="us-west-2")
    load_settings({"gpuPool": {"mode": "auto"}, "trainer": {"shmSize": "1Gi"}}, stack="dev", region="us-west-2")
    load_settings({"cluster": {"adminPrincipalArns": ["arn:aws:iam::123456789012:role/team/ops/Admin"]}}, stack="dev", region="us-west-2")


def test_a_yaml_alias_bomb_is_refused_before_expanding(tmp_path):
    import time

    rows = ["config:", '  a: &a ["x","x","x","x","x","x","x","x","x"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        rows.append(f"  {name}: &{name} [{','.join(['*' + prev] * 9)}]")
    bomb = tmp_path / "Pulumi.bomb.yaml"
    bomb.write_text("\n".join(rows) + "\n")
    started = time.monotonic()
    with pytest.raises(StackFileError, match="refused before expanding"):
        load_stack_file(bomb)
    assert time.monotonic() - started < 5  # (not a speed target: expanding would take minutes and gigabytes)
    few = tmp_path / "Pulumi.few.yaml"
    few.write_text("config:\n  x: &z {a: 1}\n  y: *z\n")
    assert load_stack_file(few)["config"]["y"] == {"a": 1}
