"""The CI workflows users copy parse, pin their actions, name stacks that exist, run where the
cluster is reachable (a runner label from a repository variable) and check that first."""

import json
import re

import pytest
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
    rows = doc["jobs"]["preview"]["strategy"]["matrix"]["include"]
    assert rows
    for row in rows:  # a TrainJob stack's file is in its project's directory (work-dir), its platform's at the top
        assert (PROJECT / row.get("work-dir", ".") / f"Pulumi.{row['stack']}.yaml").exists(), row
        assert (PROJECT / row.get("work-dir", ".") / "Pulumi.yaml").exists() and (PROJECT / f"Pulumi.{row.get('platform', row['stack'])}.yaml").exists(), row
    pulumi = [s for s in steps(doc) if s.get("uses", "").startswith("pulumi/actions@")][0]
    assert pulumi["with"]["command"] == "preview" and pulumi["with"]["policyPacks"] == "${{ github.workspace }}/policy"
    assert pulumi["with"]["work-dir"] == "${{ matrix.work-dir || '.' }}"
    assert pulumi["with"]["comment-on-pr"] is True
    aws = [s for s in steps(doc) if s.get("uses", "").startswith("aws-actions/configure-aws-credentials@")][0]
    assert "role-to-assume" in aws["with"] and "aws-access-key-id" not in aws["with"]


def test_a_trainjob_stack_is_previewed():
    """``pulumi preview`` of a TrainJob stack (workloads/), on the platform stack it references."""
    rows = load(PROJECT / ".github" / "workflows" / "preview.yml")["jobs"]["preview"]["strategy"]["matrix"]["include"]
    runs = [r for r in rows if r.get("work-dir") == "workloads"]
    assert runs
    for row in runs:
        config = yaml.safe_load((PROJECT / "workloads" / f"Pulumi.{row['stack']}.yaml").read_text())["config"]
        assert config["training-platform-workloads:platform"].endswith(f"/training-platform/{row['platform']}")


def test_deploy_is_opt_in_for_dev_on_main():
    doc = load(PROJECT / ".github" / "workflows" / "deploy-dev.yml")
    assert doc["on"]["push"]["branches"] == ["main"]
    job = doc["jobs"]["up"]
    assert "DEPLOY_DEV" in job["if"]
    pulumi = [s for s in job["steps"] if s.get("uses", "").startswith("pulumi/actions@")][0]
    assert pulumi["with"]["command"] == "up" and pulumi["with"]["stack-name"] == "dev"
    assert (PROJECT / "Pulumi.dev.yaml").exists()


# GitHub Actions: `jobs.<job_id>.runs-on` may use the github, needs, strategy, matrix, vars and inputs
# contexts (GitHub Docs, "Contexts reference", context availability); fromJSON turns a variable's JSON
# text into a label or a list of labels.
RUNS_ON = re.compile(r"^\$\{\{ fromJSON\(vars(\.(?P<name>[A-Z0-9_]+)|\[matrix\.(?P<key>[a-z]+)\]) \|\| '(?P<default>[^']+)'\) \}\}$")


def _runner_variables(job: dict) -> tuple[list[str], str]:
    """(the repository variables a job's runs-on reads, its JSON default)."""
    m = RUNS_ON.match(job["runs-on"])
    assert m, f"runs-on is not taken from a repository variable: {job['runs-on']!r}"
    if m["name"]:
        return [m["name"]], m["default"]
    return [row[m["key"]] for row in job["strategy"]["matrix"]["include"]], m["default"]


@pytest.mark.parametrize("workflow, job", [("preview", "preview"), ("deploy-dev", "up")])
def test_runner_comes_from_a_repository_variable_per_stack(workflow, job):
    doc = load(PROJECT / ".github" / "workflows" / f"{workflow}.yml")
    spec = doc["jobs"][job]
    names, default = _runner_variables(spec)
    assert json.loads(default) == "ubuntu-24.04"  # a JSON string: what fromJSON needs
    stacks = [row["stack"] for row in spec["strategy"]["matrix"]["include"]] if "strategy" in spec else ["dev"]
    assert len(set(names)) == len(names) == len(stacks)  # one variable per stack: each stack's network differs
    for name, stack in zip(names, stacks, strict=True):
        assert re.fullmatch(r"[A-Z][A-Z0-9_]*", name) and name.endswith(f"_{stack.upper()}"), name


@pytest.mark.parametrize("workflow, job", [("preview", "preview"), ("deploy-dev", "up")])
def test_reachability_is_checked_before_pulumi_runs(workflow, job):
    doc = load(PROJECT / ".github" / "workflows" / f"{workflow}.yml")
    spec = doc["jobs"][job]
    names = [s.get("uses", s.get("run", "")) for s in spec["steps"]]
    check = next(i for i, n in enumerate(names) if "-m tools.ci_reach" in n)
    creds = next(i for i, n in enumerate(names) if n.startswith("aws-actions/configure-aws-credentials@"))
    pulumi = next(i for i, n in enumerate(names) if n.startswith("pulumi/actions@"))
    assert creds < check < pulumi
    variables, _ = _runner_variables(spec)
    run = names[check]
    if "strategy" in spec:
        # a TrainJob stack's cluster is its platform's
        assert "--runner-variable \"${{ matrix.runner }}\"" in run and "--stack \"${{ matrix.platform || matrix.stack }}\"" in run
    else:
        assert f"--runner-variable {variables[0]}" in run and "--stack dev" in run
