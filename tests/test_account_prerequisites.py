"""What an account needs before the first job, prepared by the stack: the EC2 Spot service-linked role
for a pool that may launch spot capacity (EC2 User Guide, "Service-linked role for Spot Instance
requests"; Karpenter's getting-started guide asks for it on an account that never used spot)."""

from __future__ import annotations

from infra import gpu_aws
from tests.conftest import PROJECT, dev_config
from tools.mock_runtime import run_program

SLR = "aws:iam/serviceLinkedRole:ServiceLinkedRole"


def _run(capacity_types: list[str], roles: dict[str, str] | None = None, mode: str | None = None):
    pool = {"capacityTypes": capacity_types, **({"mode": mode} if mode else {})}
    return run_program(str(PROJECT), "dev", stack_config={"config": dev_config(gpuPool=pool)}, roles=roles)


def test_a_spot_pool_on_an_account_without_the_role_creates_it_and_keeps_it():
    run = _run(["spot"])
    (role,) = run.by_type(SLR)
    assert role.inputs["awsServiceName"] == "spot.amazonaws.com" and role.retain_on_delete
    assert gpu_aws.SPOT_ROLE_PATH == "/aws-service-role/spot.amazonaws.com/"
    assert _run(["on-demand", "spot"]).by_type(SLR)


def test_an_account_that_has_the_role_gets_nothing_new():
    run = _run(["spot"], roles={"AWSServiceRoleForEC2Spot": gpu_aws.SPOT_ROLE_PATH, "other": "/"})
    assert not run.by_type(SLR)


def test_no_spot_no_role():
    assert not _run(["on-demand"]).by_type(SLR)
