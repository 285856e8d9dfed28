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


P, G = "Running On-Demand P instances", "Running On-Demand G and VT instances"


def _warnings(caplog, quotas):
    caplog.clear()
    with caplog.at_level("WARNING"):
        run_program(str(PROJECT), "prod", quotas=quotas)
    return [r.getMessage() for r in caplog.records if "EC2 quota" in r.getMessage()]


def test_a_quota_below_what_the_jobs_need_is_one_warning_naming_both(caplog):
    from config import costs
    from config.settings import load_settings
    from tests.conftest import stack_file

    cfg = {k.split(":", 1)[1]: v for k, v in stack_file("prod")["config"].items() if k.startswith("training-platform:")}
    needs = costs.quota_needs(load_settings(cfg, stack="prod", region=stack_file("prod")["config"]["aws:region"]))
    assert needs.get(P), needs  # prod's FSDP job runs on p5
    lines = _warnings(caplog, {P: 0.0, G: 10_000.0})
    assert len(lines) == 1 and f"'{P}' is 0 vCPUs" in lines[0] and f"need {needs[P]} at once" in lines[0]
    assert _warnings(caplog, {P: float(needs[P]), G: 10_000.0}) == []


def test_quotas_that_cannot_be_read_are_named_once_and_the_deploy_goes_on(caplog, monkeypatch):
    assert _warnings(caplog, None) == []  # an offline render has no account to read: nothing said
    monkeypatch.setattr(gpu_aws, "offline_render", lambda: False)  # as pulumi up without the servicequotas grant
    lines = _warnings(caplog, None)
    assert len(lines) == 1 and "not read" in lines[0] and P in lines[0]
