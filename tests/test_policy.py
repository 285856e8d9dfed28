"""Each policy rule passes on the platform as rendered and fails when its property breaks."""

import copy

import pytest

from policy.rules import RULES, Resource, evaluate, from_plan
from tests.conftest import dev_config, run_config, run_stack


def plan_resources(run):
    return from_plan(run.plan())


def rules_hit(resources, config=None):
    return {v.rule for v in evaluate(resources, config)}


def mutate(resources, type_suffix, fn, name=None):
    out = []
    for r in resources:
        if r.type.endswith(type_suffix) and (name is None or r.name == name):
            props = copy.deepcopy(r.props)
            fn(props)
            r = Resource(r.type, r.name, r.urn, props, r.property_dependencies)
        out.append(r)
    return out


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_rendered_stacks_pass_every_rule(stack):
    assert evaluate(plan_resources(run_stack(stack))) == []


def test_auto_mode_and_efa_pass_every_rule():
    run = run_config(dev_config(gpuPool={"mode": "auto"}, efa={"enabled": True, "availabilityZone": "us-west-2a"}))
    assert evaluate(plan_resources(run)) == []


def _public_subnet_for_node_groups(res):
    by_name = {r.name: r for r in res if r.type == "aws:ec2/subnet:Subnet"}
    pub = [by_name["net-public-0"].urn, by_name["net-public-1"].urn]
    return [Resource(r.type, r.name, r.urn, r.props, {**r.property_dependencies, "subnetIds": pub}) if r.type == "eks:index:ManagedNodeGroup" else r for r in res]


BREAKS = [
    ("node-groups-private", _public_subnet_for_node_groups),
    ("node-groups-private", lambda res: mutate(res, "eks:index:Cluster", lambda p: p.update(nodeAssociatePublicIpAddress=True))),
    ("imdsv2-required", lambda res: mutate(res, "ManagedNodeGroup", lambda p: p.pop("launchTemplate"))),
    ("imdsv2-required", lambda res: mutate(res, "launchTemplate:LaunchTemplate", lambda p: p["metadataOptions"].update(httpPutResponseHopLimit=2))),
    ("imdsv2-required", lambda res: mutate(res, ":EC2NodeClass", lambda p: p["spec"]["metadataOptions"].update(httpTokens="optional"))),
    ("public-endpoint-restricted", lambda res: mutate(res, "eks:index:Cluster", lambda p: p.update(publicAccessCidrs=["0.0.0.0/0"]))),
    ("public-endpoint-restricted", lambda res: mutate(res, "eks:index:Cluster", lambda p: p.update(publicAccessCidrs=["0.0.0.0/1", "128.0.0.0/1"]))),
    ("public-endpoint-restricted", lambda res: mutate(res, "eks:index:Cluster", lambda p: p.pop("publicAccessCidrs"))),
    ("control-plane-logging", lambda res: mutate(res, "eks:index:Cluster", lambda p: p.update(enabledClusterLogTypes=["api"]))),
    ("gpu-nodepools-tainted", lambda res: mutate(res, ":NodePool", lambda p: p["spec"]["template"]["spec"].update(taints=[]))),
    ("training-runtimes-resilient", lambda res: mutate(res, ":ClusterTrainingRuntime", lambda p: p["spec"]["template"]["spec"]["failurePolicy"].update(maxRestarts=0))),
    (
        "training-runtimes-resilient",
        lambda res: mutate(res, ":ClusterTrainingRuntime", lambda p: p["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"].update(annotations={})),
    ),
    ("no-latest-images", lambda res: mutate(res, ":TrainJob", lambda p: p["spec"]["trainer"].update(image="pytorch/pytorch:latest"))),
    ("no-latest-images", lambda res: mutate(res, ":ClusterTrainingRuntime", lambda p: p["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0].update(image="busybox"))),
    ("no-plaintext-secrets", lambda res: mutate(res, ":TrainJob", lambda p: p["spec"]["trainer"]["env"].append({"name": "WANDB_API_KEY", "value": "abc123"}))),
]


@pytest.mark.parametrize("rule,brk", BREAKS, ids=[f"{r}-{i}" for i, (r, _) in enumerate(BREAKS)])
def test_each_rule_fails_when_its_property_breaks(rule, brk):
    resources = plan_resources(run_stack("dev"))
    assert rule not in rules_hit(resources)
    assert rule in rules_hit(brk(resources))


def test_public_anywhere_is_accepted_when_the_pack_allows_it():
    res = mutate(plan_resources(run_stack("dev")), "eks:index:Cluster", lambda p: p.update(publicAccessCidrs=["0.0.0.0/0"]))
    assert "public-endpoint-restricted" not in rules_hit(res, {"allowPublicEndpointAnywhere": True})


def test_secret_from_a_secret_ref_is_fine():
    res = mutate(plan_resources(run_stack("dev")), ":TrainJob", lambda p: p["spec"]["trainer"]["env"].append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}))
    assert "no-plaintext-secrets" not in rules_hit(res)


def test_every_rule_is_covered_by_a_failing_case():
    assert {r.name for r in RULES} == {rule for rule, _ in BREAKS}


def test_policy_pack_entry_point_wires_every_rule():
    import ast
    import pathlib

    tree = ast.parse((pathlib.Path(__file__).parent.parent / "policy" / "__main__.py").read_text())
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert {"PolicyPack", "StackValidationPolicy", "RULES"} <= names


def test_the_policy_pack_loads_its_rules_without_the_projects_dependencies():
    """The pack runs in its own virtualenv (policy/requirements.txt: pulumi-policy alone): its rules
    import nothing beyond the standard library and config/cidrs.py, as policy/__main__.py puts them on the path."""
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parent.parent
    code = f"import sys; sys.path[:0] = [{str(root / 'policy')!r}, {str(root)!r}]; import rules; print(len(rules.RULES))"
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, cwd=root / "policy")
    assert done.returncode == 0 and int(done.stdout) > 0, done.stderr
