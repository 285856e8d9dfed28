"""The CI workflows users copy parse, pin their actions, and name stacks that exist."""

import re

import yaml

from tests.conftest import PROJECT

WORKFLOWS = sorted((PROJECT / ".github" / "workflows").glob("*.yml"))


def load(path):
    doc = yaml.safe_load(path.read_text())
    doc["on"] = doc.pop(True, doc.get("on"))  # YAML 1.1 reads the key `on` as true
    return doc


def steps(doc):
    for job in doc["jobs"].values():
        yield from job.get("steps", [])


def test_workflows_exist_and_parse():
    names = {p.stem for p in WORKFLOWS}
    assert {"test", "preview", "deploy-dev"} <= names
    for p in WORKFLOWS:
        doc = load(p)
        assert doc["jobs"] and doc["on"]


def test_every_action_is_pinned_to_a_release():
    for p in WORKFLOWS:
        for step in steps(load(p)):
            if "uses" in step:
                assert re.search(r"@(v\d+\.\d+\.\d+|[0-9a-f]{40})$", step["uses"]), f"{p.name}: {step['uses']} is not pinned"


def test_preview_runs_for_existing_stacks_with_policy_and_oidc():
    doc = load(PROJECT / ".github" / "workflows" / "preview.yml")
    assert "pull_request" in doc["on"]
    assert doc["permissions"]["id-token"] == "write"
    stacks = doc["jobs"]["preview"]["strategy"]["matrix"]["stack"]
    for stack in stacks:
        assert (PROJECT / f"Pulumi.{stack}.yaml").exists(), stack
    pulumi = [s for s in steps(doc) if s.get("uses", "").startswith("pulumi/actions@")][0]
    assert pulumi["with"]["command"] == "preview" and pulumi["with"]["policyPacks"] == "policy"
    assert pulumi["with"]["comment-on-pr"] is True
    aws = [s for s in steps(doc) if s.get("uses", "").startswith("aws-actions/configure-aws-credentials@")][0]
    assert "role-to-assume" in aws["with"] and "aws-access-key-id" not in aws["with"]


def test_deploy_is_opt_in_for_dev_on_main():
    doc = load(PROJECT / ".github" / "workflows" / "deploy-dev.yml")
    assert doc["on"]["push"]["branches"] == ["main"]
    job = doc["jobs"]["up"]
    assert "DEPLOY_DEV" in job["if"]
    pulumi = [s for s in job["steps"] if s.get("uses", "").startswith("pulumi/actions@")][0]
    assert pulumi["with"]["command"] == "up" and pulumi["with"]["stack-name"] == "dev"
    assert (PROJECT / "Pulumi.dev.yaml").exists()
