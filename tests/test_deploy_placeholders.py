"""The shipped stack files' placeholders (AWS's example account, the RFC 5737 documentation ranges)
are refused by a real deploy, one line per key, and kept by the offline render with one warning."""

from __future__ import annotations

import logging

import pytest

from config.deploy_rules import deploy_problems, placeholder_problems
from config.settings import load_settings
from tests.conftest import PROJECT, dev_config, stack_file
from tools.mock_runtime import ProgramError, run_program


def settings(raw: dict, stack: str = "dev"):
    return load_settings(raw, stack=stack, region="us-west-2")


def raw_of(stack: str) -> dict:
    return {k.split(":", 1)[1]: v for k, v in stack_file(stack)["config"].items() if k.startswith("training-platform:")}


def test_the_shipped_dev_stack_names_each_placeholder_once():
    keys = [p.key for p in deploy_problems(settings(raw_of("dev")))]
    assert keys == ["cluster.publicAccessCidrs[0]", "cluster.adminPrincipalArns[0]", "cluster.ci.previewRoleArn", "cluster.ci.deployRoleArn"]


def test_team_principals_and_the_workshop_range_are_placeholders_too():
    assert [p.key for p in placeholder_problems(settings(raw_of("teams"), "teams"))] == [
        "cluster.adminPrincipalArns[0]", "tenants.vision.principalArns[0]", "tenants.vision.s3[0].bucket", "tenants.vision.s3[1].bucket",
        "tenants.nlp.principalArns[0]"]
    assert [p.key for p in placeholder_problems(settings(raw_of("workshop"), "workshop"))] == ["cluster.publicAccessCidrs[0]"]


@pytest.mark.parametrize("cidr", ["192.0.2.0/24", "198.51.100.7/32", "203.0.113.128/25"])
def test_every_documentation_range_and_what_lies_inside_it_is_refused(cidr):
    s = settings({"cluster": {"endpointPublicAccess": True, "publicAccessCidrs": ["10.0.0.0/8", cidr]}})
    problems = placeholder_problems(s)
    assert [p.key for p in problems] == ["cluster.publicAccessCidrs[1]"]
    assert "RFC 5737" in str(problems[0]) and len(str(problems[0]).splitlines()) == 1


@pytest.mark.parametrize("cidr", ["198.51.0.0/16", "203.0.114.0/24", "192.0.3.1/32", "192.0.0.0/22"])
def test_ranges_that_only_contain_or_border_a_documentation_range_are_not_placeholders(cidr):
    s = settings({"cluster": {"endpointPublicAccess": True, "publicAccessCidrs": [cidr]}, "portal": {"inboundCidrs": ["0.0.0.0/0"]}})
    assert placeholder_problems(s) == []


def test_real_accounts_pass_and_the_example_account_is_found_in_any_arn():
    mine = "arn:aws:iam::210987654321:role/PlatformAdmin"
    assert placeholder_problems(settings({"cluster": {"adminPrincipalArns": [mine]}})) == []
    # a longer number that contains the twelve digits is another account
    assert placeholder_problems(settings({"cluster": {"adminPrincipalArns": ["arn:aws:iam::912345678901:role/A"]}})) == []
    found = placeholder_problems(settings({"cluster": {"adminPrincipalArns": [mine, "arn:aws:iam::123456789012:user/ops"]}}))
    assert [p.key for p in found] == ["cluster.adminPrincipalArns[1]"] and "example account" in str(found[0])


def test_a_real_deploy_refuses_them_one_line_per_key_and_registers_nothing(monkeypatch):
    import infra.project_config

    monkeypatch.setattr(infra.project_config, "offline_render", lambda: False)  # as under pulumi up / preview
    with pytest.raises(ProgramError) as err:
        run_program(str(PROJECT), "dev", stack_config={"config": dev_config()})
    lines = str(err.value).splitlines()
    assert len(lines) == 4
    assert [line.split(" = ")[0].removeprefix("invalid config training-platform:") for line in lines] == [
        "cluster.publicAccessCidrs[0]", "cluster.adminPrincipalArns[0]", "cluster.ci.previewRoleArn", "cluster.ci.deployRoleArn"]
    assert err.value.registrations == [] or all(r.type == "pulumi:pulumi:Stack" for r in err.value.registrations)


def test_a_real_deploy_of_own_values_goes_ahead(monkeypatch):
    import infra.project_config

    monkeypatch.setattr(infra.project_config, "offline_render", lambda: False)
    own = dev_config(cluster={"publicAccessCidrs": ["198.18.0.0/24"], "adminPrincipalArns": ["arn:aws:iam::210987654321:role/PlatformAdmin"],
                              "ci": {"previewRoleArn": "arn:aws:iam::210987654321:role/training-ci-preview", "deployRoleArn": "arn:aws:iam::210987654321:role/training-ci-deploy"}})
    own["training-platform:cluster"]["publicAccessCidrs"] = ["198.18.0.0/24"]  # a list replaces, not merges
    own["training-platform:cluster"]["adminPrincipalArns"] = ["arn:aws:iam::210987654321:role/PlatformAdmin"]
    run = run_program(str(PROJECT), "dev", stack_config={"config": own})
    assert any(r.type == "eks:index:Cluster" for r in run.registrations)


def test_the_offline_render_keeps_them_and_says_so_once(caplog):
    with caplog.at_level(logging.WARNING):
        run = run_program(str(PROJECT), "dev", stack_config={"config": dev_config()})
    assert any(r.type == "eks:index:Cluster" for r in run.registrations)
    said = [r.getMessage() for r in caplog.records if "pulumi up and preview refuse" in r.getMessage()]
    assert len(said) == 1
    for key in ("cluster.publicAccessCidrs[0]", "cluster.adminPrincipalArns[0]", "cluster.ci.previewRoleArn", "cluster.ci.deployRoleArn"):
        assert key in said[0]


def _teams_with(buckets: list[str]) -> dict:
    raw = raw_of("teams")
    raw["tenants"]["vision"]["s3"] = [{"bucket": b, "prefix": "runs/", "access": "read"} for b in buckets]
    return raw


def test_example_bucket_names_are_placeholders_one_line_naming_the_key():
    found = [p for p in placeholder_problems(settings(_teams_with(["acme-ml-data", "vision-datasets-example", "my-example-bucket"]), "teams")) if ".s3[" in p.key]
    assert [p.key for p in found] == ["tenants.vision.s3[1].bucket"]  # only the -example ending; 'example' inside a name is a name
    assert "someone else's bucket" in str(found[0]) and len(str(found[0]).splitlines()) == 1
    assert not [p for p in placeholder_problems(settings(_teams_with(["acme-ml-data"]), "teams")) if ".s3[" in p.key]


def _teams_config() -> dict:
    return {k: v for k, v in stack_file("teams")["config"].items()}


def test_a_real_deploy_of_the_teams_stack_refuses_its_example_buckets(monkeypatch):
    import infra.project_config

    monkeypatch.setattr(infra.project_config, "offline_render", lambda: False)
    with pytest.raises(ProgramError) as err:
        run_program(str(PROJECT), "teams", stack_config={"config": _teams_config()})
    keys = [line.split(" = ")[0].removeprefix("invalid config training-platform:") for line in str(err.value).splitlines()]
    assert "tenants.vision.s3[0].bucket" in keys and "tenants.vision.s3[1].bucket" in keys
    assert not [r for r in err.value.registrations if r.type.startswith("aws:iam")]


def test_the_offline_render_of_the_teams_stack_keeps_its_example_buckets_and_says_so(caplog):
    with caplog.at_level(logging.WARNING):
        run = run_program(str(PROJECT), "teams", stack_config={"config": _teams_config()})
    assert any(r.type == "aws:iam/rolePolicy:RolePolicy" and "vision-results-example" in str(r.inputs) for r in run.registrations)
    said = [r.getMessage() for r in caplog.records if "pulumi up and preview refuse" in r.getMessage()]
    assert len(said) == 1 and "tenants.vision.s3[1].bucket" in said[0]
