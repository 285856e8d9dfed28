"""Bad input, round 5 (issue 45), as classes: every problem of several is named, each with the
value given (never a default in its place); a check made in one place is made in every place that
takes the same input (object sizes: the render and trainctl; regional ARNs: every setting whose
service needs its own Region's resource)."""

from __future__ import annotations

import pytest

from config import object_size
from config.schema import ConfigError
from config.settings import load_settings
from config.stack_file import StackFileError
from tests.conftest import PROJECT, dev_config
from tools.mock_runtime import ProgramError, run_program

DEV = "organization/training-platform/dev"
CERT = "arn:aws:acm:{region}:123456789012:certificate/12345678-1234-1234-1234-123456789012"


def lines(raw: dict, region: str = "us-west-2") -> list[str]:
    with pytest.raises(ConfigError) as err:
        load_settings(raw, stack="dev", region=region)
    return str(err.value).splitlines()


def line(key: str, value: object, allowed: str) -> str:
    return f"invalid config training-platform:{key} = {value!r}: {allowed}"


# --- several problems: each is named ---------------------------------------------------------------


def test_every_broken_size_relation_of_a_node_group_is_named_with_the_values_given():
    assert lines({"nodeGroups": {"x86": {"minSize": 5, "maxSize": 4, "desiredSize": 9}}}) == [
        line("nodeGroups.x86.minSize", 5, "greater than maxSize (4); allowed: at most maxSize (4)"),
        line("nodeGroups.x86.desiredSize", 9, "greater than maxSize (4); allowed: between minSize and maxSize"),
    ]
    assert lines({"nodeGroups": {"arm": {"minSize": 5, "maxSize": 3, "desiredSize": 4}}}) == [
        line("nodeGroups.arm.minSize", 5, "greater than maxSize (3); allowed: at most maxSize (3)"),
        line("nodeGroups.arm.desiredSize", 4, "less than minSize (5); allowed: between minSize and maxSize"),
        line("nodeGroups.arm.desiredSize", 4, "greater than maxSize (3); allowed: between minSize and maxSize"),
    ]
    assert lines({"nodeGroups": {"arm": {"minSize": 3, "maxSize": 6, "desiredSize": 1}}}) == [
        line("nodeGroups.arm.desiredSize", 1, "less than minSize (3); allowed: between minSize (3) and maxSize (6)"),
    ]
    load_settings({"nodeGroups": {"x86": {"minSize": 1, "maxSize": 4, "desiredSize": 4}, "arm": {"minSize": 3, "maxSize": 3, "desiredSize": 3}}}, stack="dev", region="us-west-2")


def test_every_bad_item_of_a_list_is_named_by_its_index_and_value():
    assert lines({"gpuPool": {"instanceCategories": ["z", "trn"]}}) == [
        line("gpuPool.instanceCategories[0]", "z", "allowed: g, gr, p"),
        line("gpuPool.instanceCategories[1]", "trn", "allowed: g, gr, p"),
    ]
    arns = lines({"cluster": {"adminPrincipalArns": ["admin", "arn:aws:iam::123456789012:role/Ok", "arn:aws:sts::123456789012:assumed-role/A/bob"]}})
    assert [x.split(" = ")[0] for x in arns] == ["invalid config training-platform:cluster.adminPrincipalArns[0]", "invalid config training-platform:cluster.adminPrincipalArns[2]"]
    assert "'admin'" in arns[0] and "'arn:aws:sts::123456789012:assumed-role/A/bob'" in arns[1] and "arn:aws:iam::123456789012:role/A" in arns[1]
    cidrs = lines({"cluster": {"endpointPublicAccess": True, "publicAccessCidrs": ["300.1.1.0/24", "203.0.113.0/24", "banana"]}})
    assert [x.split(" = ")[0].rsplit(":", 1)[1] for x in cidrs] == ["cluster.publicAccessCidrs[0]", "cluster.publicAccessCidrs[2]"]
    types = lines({"gpuPool": {"instanceTypes": ["g5.xlarge", "g9.huge", "p9.big"]}, "efa": {"instanceTypes": ["g5.xlarge", "g5.2xlarge"]}})
    assert [x.split(" = ")[0].rsplit(":", 1)[1] for x in types] == ["gpuPool.instanceTypes[1]", "gpuPool.instanceTypes[2]", "efa.instanceTypes[0]", "efa.instanceTypes[1]"]
    assert "'g9.huge'" in types[0] and "'p9.big'" in types[1]


def test_every_repeated_item_of_a_list_is_named_by_its_index_and_value():
    assert lines({"gpuPool": {"instanceCategories": ["g", "p", "g", "p"]}}) == [
        line("gpuPool.instanceCategories[2]", "g", "also instanceCategories[0]; allowed: a list without duplicates"),
        line("gpuPool.instanceCategories[3]", "p", "also instanceCategories[1]; allowed: a list without duplicates"),
    ]
    role = "arn:aws:iam::123456789012:role/Admin"
    assert lines({"cluster": {"adminPrincipalArns": [role, role, role]}}) == [
        line("cluster.adminPrincipalArns[1]", role, "also adminPrincipalArns[0]; allowed: a list without duplicates"),
        line("cluster.adminPrincipalArns[2]", role, "also adminPrincipalArns[0]; allowed: a list without duplicates"),
    ]
    load_settings({"gpuPool": {"instanceCategories": ["g", "p"]}, "cluster": {"adminPrincipalArns": [role, "arn:aws:iam::123456789012:role/Other"]}}, stack="dev", region="us-west-2")


@pytest.mark.parametrize("limit", [0, -8])
def test_a_value_that_failed_its_check_is_not_judged_again_as_its_default(limit):
    """gpuLimit 0 is one line naming 0: no rule across sections judges the default 16 in its place."""
    raw = {"gpuPool": {"gpuLimit": limit}, "tenants": {"a": {"gpuQuota": 40}}, "trainjobs": {"ddp": {"enabled": True, "numNodes": 40}}}
    assert lines(raw) == [line("gpuPool.gpuLimit", limit, "allowed: an integer >= 1")]
    # a size that failed: the relations wait for it, the group's other rules still run
    assert lines({"nodeGroups": {"arm": {"minSize": -1, "desiredSize": 1, "instanceType": "c6i.large"}}}) == [
        line("nodeGroups.arm.minSize", -1, "allowed: an integer from 0 to 100"),
        line("nodeGroups.arm.instanceType", "c6i.large", "allowed: a Graviton (ARM64) instance type such as c7g.2xlarge or m7g.xlarge"),
    ]
    # a job whose instance type failed: gpusPerNode is not judged against the default type's GPUs
    bad_type = lines({"trainjobs": {"ddp": {"enabled": True, "instanceType": "zz.large", "gpusPerNode": 8}}})
    assert [x.split(" = ")[0].rsplit(":", 1)[1] for x in bad_type] == ["trainjobs.ddp.instanceType"] and "g5.xlarge has" not in bad_type[0]
    # a team that failed still counts as a team: the portal is not told the stack has none
    assert [x.split(" = ")[0].rsplit(":", 1)[1] for x in lines({"tenants": {"a": "x"}, "portal": {"teams": {"a": {"groups": ["g"]}}}})] == ["tenants.a", "portal.teams"]
    load_settings({"gpuPool": {"gpuLimit": 40}, "tenants": {"a": {"gpuQuota": 40}}, "trainjobs": {"ddp": {"enabled": True, "numNodes": 40}}}, stack="dev", region="us-west-2")


def test_trainctl_does_not_judge_a_failed_instance_type_as_its_default():
    from trainctl.objects import Request, problems

    found = problems(Request(namespace="vision", nodes=2, command=["python", "train.py"], instance_type="zz.large", gpus_per_node=8))
    assert [x for x in found if x.startswith("--gpus-per-node")] == [] and any(x.startswith("--instance-type 'zz.large'") for x in found)


def test_a_missing_platform_stack_names_the_key_the_user_wrote():
    config = {"training-platform-workloads:platform": "organization/training-platform/nosuch", "training-platform-workloads:ddp": {"numNodes": 2}}
    with pytest.raises(StackFileError) as err:
        run_program(str(PROJECT / "workloads"), "ddp", stack_config={"config": config})
    text = str(err.value)
    assert text.startswith("invalid config training-platform-workloads:platform = 'organization/training-platform/nosuch': no stack nosuch of project training-platform")
    assert "Pulumi.nosuch.yaml" in text and DEV in text and len(text.splitlines()) == 1


# --- regional ARNs ---------------------------------------------------------------------------------


def _portal(cert: str) -> dict:
    return {
        "tenants": {"vision": {"gpuQuota": 4}},
        "portal": {"enabled": True, "host": "portal.example.com", "certificateArn": cert, "issuer": "https://idp.example.com", "authorizationEndpoint": "https://idp.example.com/a",
                   "tokenEndpoint": "https://idp.example.com/t", "userInfoEndpoint": "https://idp.example.com/u", "clientId": "c", "clientSecret": "s", "teams": {"vision": {"groups": ["g"]}}},
    }


def test_a_certificate_of_another_region_is_refused_for_the_albs():
    cert = CERT.format(region="eu-west-1")
    assert lines(_portal(cert)) == [line(
        "portal.certificateArn", cert,
        "allowed: an ACM certificate of the stack's region and partition (arn:aws:acm:us-west-2:...); an ALB uses only certificates of its own region (ACM certificates are regional; request or import one there)",
    )]
    kms = "arn:aws:kms:eu-west-1:123456789012:key/abc"
    both = lines({**_portal(cert), "cluster": {"secretsKmsKeyArn": kms}})
    assert [x.split(" = ")[0].rsplit(":", 1)[1] for x in both] == ["cluster.secretsKmsKeyArn", "portal.certificateArn"]
    load_settings(_portal(CERT.format(region="us-west-2")), stack="dev", region="us-west-2")
    load_settings({**_portal(CERT.format(region="eu-west-1")), "cluster": {"secretsKmsKeyArn": "arn:aws:kms:eu-west-1:123456789012:key/abc"}}, stack="dev", region="eu-west-1")


def test_the_portal_certificate_goes_through_the_render_too():
    cert = CERT.format(region="eu-west-1")
    with pytest.raises(ProgramError) as err:
        run_program(str(PROJECT), "dev", stack_config={"config": dev_config(**_portal(cert))})
    assert any(x.startswith(f"invalid config training-platform:portal.certificateArn = '{cert}'") for x in str(err.value).splitlines())


# --- object sizes: the render and trainctl, one check -----------------------------------------------

BIG = "x" * 2_000_000  # 1.9 MiB: more than etcd's 1.5 MiB request limit


def test_trainctl_and_the_render_share_the_object_size_check():
    from trainctl import code

    assert code.stored_size is object_size.stored_size and code.MAX_OBJECT_BYTES == object_size.MAX_OBJECT_BYTES == 1024 * 1024 * 3 // 2


def test_a_trainjob_etcd_cannot_store_is_refused_by_the_platform_render():
    with pytest.raises(ProgramError) as err:
        run_program(str(PROJECT), "dev", stack_config={"config": dev_config(trainjobs={"ddp": {"enabled": True, "env": {"BIG": BIG, "SMALL": "1"}}})})
    found = str(err.value).splitlines()
    assert len(found) == 1 and found[0].startswith("invalid config training-platform:trainjobs.ddp.env.BIG = <not shown>: its TrainJob ddp-mnist would be about 1.9 MiB")
    assert "BIG 2000000 bytes" in found[0] and BIG not in found[0]
    assert not [r for r in err.value.registrations if r.type == "kubernetes:trainer.kubeflow.org/v1alpha1:TrainJob"]
    run_program(str(PROJECT), "dev", stack_config={"config": dev_config(trainjobs={"ddp": {"enabled": True, "env": {"BIG": "x" * 100_000}}})})


def test_a_trainjob_etcd_cannot_store_is_refused_by_a_trainjob_stack_and_by_trainctl(tmp_path):
    from tests.conftest import run_stack

    outputs = {DEV: run_stack("dev").outputs}
    config = {"training-platform-workloads:platform": DEV, "training-platform-workloads:ddp": {"numNodes": 2, "env": {"BIG": BIG}}}
    with pytest.raises(ProgramError) as err:
        run_program(str(PROJECT / "workloads"), "ddp", stack_config={"config": config}, stack_outputs=outputs)
    found = str(err.value).splitlines()
    assert len(found) == 1 and found[0].startswith("invalid config training-platform-workloads:ddp.env.BIG = <not shown>: its TrainJob ddp-mnist-ddp would be about 1.9 MiB")
    assert {r.type for r in err.value.registrations} <= {"pulumi:pulumi:StackReference"}
    config["training-platform-workloads:ddp"]["env"] = {"BIG": "x" * 100_000}
    run_program(str(PROJECT / "workloads"), "ddp", stack_config={"config": config}, stack_outputs=outputs)

    from trainctl.code import collect
    from trainctl.objects import Request, SubmitError, build

    (tmp_path / "train.py").write_text("print(1)\n")
    with pytest.raises(SubmitError, match="etcd"):
        build(Request(namespace="vision", nodes=2, command=["python", "train.py"], env=(("BIG", BIG),)), collect(tmp_path))
