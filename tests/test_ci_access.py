"""The CI workflows' roles get EKS access entries with the one access policy their job needs; the
``cluster.ci`` keys are validated one line per problem; the reachability preflight tells a runner
that cannot reach the endpoint what to change; the preview role's IAM policy is read-only and
covers what a preview looks up.

Facts: EKS access policies (EKS User Guide, "Review access policy permissions"): ClusterAdmin is `*`,
View has no write verb. Kubernetes api-concepts "Dry-run authorization": a dry-run is authorized like
the write. pulumi-kubernetes v4 provider.go: a preview's forbidden dry-run is previewed from inputs.
"""

from __future__ import annotations

import fnmatch
import json
import os
import socket
import stat

import pytest

import tools.mock_runtime as mock_runtime
from config.schema import ConfigError
from config.settings import load_settings
from infra import deploy_state
from infra.cluster import CLUSTER_ADMIN_POLICY, VIEW_POLICY
from tests.conftest import PROJECT, dev_config, run_config, run_stack
from tools import ci_reach

PREVIEW = "arn:aws:iam::123456789012:role/ci-preview"
DEPLOY = "arn:aws:iam::123456789012:role/ci/ci-deploy"
CI = {"previewRoleArn": PREVIEW, "deployRoleArn": DEPLOY}


def entries(run) -> dict:
    return run.one("eks:index:Cluster").inputs["accessEntries"]


def _policies(entry: dict) -> dict[str, str]:
    return {assoc["policyArn"]: assoc["accessScope"]["type"] for assoc in entry["accessPolicies"].values()}


def test_ci_roles_get_exactly_the_policy_their_job_needs_cluster_wide():
    found = entries(run_config(dev_config(cluster={"ci": CI})))
    assert found["ci-deploy"]["principalArn"] == DEPLOY and _policies(found["ci-deploy"]) == {CLUSTER_ADMIN_POLICY: "cluster"}
    assert found["ci-preview"]["principalArn"] == PREVIEW and _policies(found["ci-preview"]) == {VIEW_POLICY: "cluster"}
    assert VIEW_POLICY.endswith("/AmazonEKSViewPolicy") and CLUSTER_ADMIN_POLICY.endswith("/AmazonEKSClusterAdminPolicy")
    assert found["admin-0"]["principalArn"].endswith(":role/PlatformAdmin")  # the admins keep their keys


def _without_ci(**cluster) -> dict:
    config = dev_config()
    config["training-platform:cluster"].pop("ci", None)
    config["training-platform:cluster"].update(cluster)
    return config


def test_preview_dry_run_gives_the_preview_role_cluster_admin():
    found = entries(run_config(_without_ci(ci={"previewRoleArn": PREVIEW, "previewDryRun": True})))
    assert _policies(found["ci-preview"]) == {CLUSTER_ADMIN_POLICY: "cluster"}
    assert "ci-deploy" not in found


def test_no_ci_roles_no_ci_entries():
    assert not [k for k in entries(run_config(_without_ci())) if k.startswith("ci-")]


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_shipped_stacks_give_their_preview_role_read_access(stack):
    found = entries(run_stack(stack))
    assert _policies(found["ci-preview"]) == {VIEW_POLICY: "cluster"}
    assert found["ci-preview"]["principalArn"].endswith(":role/training-ci-preview")


def test_the_role_that_created_the_cluster_gets_no_second_entry():
    # CI's deploy role ran the first pulumi up: EKS gave it the bootstrap admin entry, recorded in SSM
    config = dev_config(cluster={"ci": CI})
    run = mock_runtime.run_program(str(PROJECT), "dev", stack_config={"config": config}, caller_arn="arn:aws:sts::123456789012:assumed-role/ci-deploy/gha-run-1")
    found = entries(run)
    assert "ci-deploy" not in found and "ci-preview" in found


def _errors(raw: dict, region: str = "us-west-2") -> list[ConfigError]:
    with pytest.raises(ConfigError) as info:
        load_settings(raw, stack="dev", region=region)
    return list(getattr(info.value, "errors", [info.value]))


BAD = [
    ({"ci": {"previewRoleArn": "arn:aws:iam::123456789012:user/alice"}}, "cluster.ci.previewRoleArn", "IAM role ARN"),
    ({"ci": {"deployRoleArn": "arn:aws:sts::123456789012:assumed-role/ci/run"}}, "cluster.ci.deployRoleArn", "not an assumed-role session"),
    ({"ci": {"deployRoleArn": "ci-deploy"}}, "cluster.ci.deployRoleArn", "IAM role ARN"),
    ({"ci": {"previewRole": PREVIEW}}, "cluster.ci.previewRole", "unknown key; did you mean 'previewRoleArn'?"),
    ({"ci": {"previewDryRun": True}}, "cluster.ci.previewDryRun", "needs ci.previewRoleArn"),
    ({"ci": {"previewRoleArn": PREVIEW, "deployRoleArn": "arn:aws:iam::123456789012:role/x/ci-preview"}}, "cluster.ci.deployRoleArn", "same role as previewRoleArn"),
    ({"adminPrincipalArns": ["arn:aws:iam::123456789012:role/ci-deploy"], "ci": {"deployRoleArn": DEPLOY}}, "cluster.ci.deployRoleArn", "also adminPrincipalArns[0]"),
]


@pytest.mark.parametrize("cluster, key, allowed", BAD)
def test_bad_ci_config_is_one_line_naming_the_key(cluster, key, allowed):
    errors = _errors({"cluster": cluster})
    mine = [e for e in errors if e.key == key]
    assert len(mine) == 1, [str(e) for e in errors]
    assert allowed in mine[0].allowed and "\n" not in str(mine[0])


def test_ci_roles_are_of_the_stack_partition():
    errors = _errors({"cluster": {"ci": {"previewRoleArn": PREVIEW}}}, region="cn-north-1")
    assert [e.key for e in errors if e.key.startswith("cluster.ci")] == ["cluster.ci.previewRoleArn"]


# --- the preflight -------------------------------------------------------------------------------


def test_preflight_names_the_runner_variable_for_a_private_endpoint():
    code, line = ci_reach.check("prod", "PREVIEW_RUNNER_PROD", describe=lambda name, region: f"https://X.gr7.{region}.eks.amazonaws.com", connect=lambda endpoint: "timed out")
    assert code == 1 and line.startswith("::error::prod:") and "\n" not in line
    assert "PREVIEW_RUNNER_PROD" in line and "private" in line and "us-east-1" in line


def test_preflight_names_the_allowed_cidrs_for_a_restricted_public_endpoint():
    code, line = ci_reach.check("dev", "PREVIEW_RUNNER_DEV", describe=lambda name, region: "https://X", connect=lambda endpoint: "timed out")
    assert code == 1 and "203.0.113.0/24" in line and "PREVIEW_RUNNER_DEV" in line


def test_preflight_passes_when_reachable_or_before_the_first_deploy():
    assert ci_reach.check("prod", "V", describe=lambda n, r: "https://X", connect=lambda e: None)[0] == 0

    def missing(name, region):
        raise ci_reach.NoCluster(name)

    code, line = ci_reach.check("prod", "V", describe=missing, connect=lambda e: pytest.fail("nothing to connect to"))
    assert code == 0 and "training-prod" in line


def test_connect_error_opens_a_real_connection():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        assert ci_reach.connect_error(f"https://127.0.0.1:{port}", timeout=5) is None
    assert ci_reach.connect_error(f"https://127.0.0.1:{port}", timeout=5) is not None  # closed now


def _fake_aws(tmp_path, monkeypatch, script: str) -> None:
    aws = tmp_path / "aws"
    aws.write_text("#!/bin/sh\n" + script)
    aws.chmod(aws.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


def test_endpoint_of_reads_describe_cluster(tmp_path, monkeypatch):
    _fake_aws(tmp_path, monkeypatch, """echo '{"cluster": {"name": "training-prod", "endpoint": "https://ABC.gr7.us-east-1.eks.amazonaws.com"}}'\n""")
    assert ci_reach.endpoint_of("training-prod", "us-east-1") == "https://ABC.gr7.us-east-1.eks.amazonaws.com"


def test_endpoint_of_a_missing_cluster_is_no_cluster(tmp_path, monkeypatch):
    # the AWS CLI's message for EKS DescribeCluster of an unknown name
    _fake_aws(tmp_path, monkeypatch, """echo 'An error occurred (ResourceNotFoundException) when calling the DescribeCluster operation: No cluster found for name: training-prod.' >&2\nexit 254\n""")
    with pytest.raises(ci_reach.NoCluster):
        ci_reach.endpoint_of("training-prod", "us-east-1")
    _fake_aws(tmp_path, monkeypatch, """echo 'An error occurred (AccessDeniedException) when calling the DescribeCluster operation' >&2\nexit 254\n""")
    with pytest.raises(RuntimeError, match="AccessDeniedException"):
        ci_reach.endpoint_of("training-prod", "us-east-1")


# --- the preview role's AWS side -----------------------------------------------------------------

# Pulumi AWS invokes -> the IAM action each calls (terraform-provider-aws data sources:
# aws_availability_zones DescribeAvailabilityZones, aws_ecr_authorization_token GetAuthorizationToken,
# aws_ssm_parameter GetParameter; STS GetCallerIdentity needs no permission, STS API Reference).
INVOKE_ACTIONS = {
    "aws:index/getAvailabilityZones:getAvailabilityZones": "ec2:DescribeAvailabilityZones",
    "aws:ecr/getAuthorizationToken:getAuthorizationToken": "ecr:GetAuthorizationToken",
    "aws:ssm/getParameter:getParameter": "ssm:GetParameter",
    "aws:index/getCallerIdentity:getCallerIdentity": None,
    "aws:index/getPartition:getPartition": None,
    "aws:index/getRegion:getRegion": None,
    # what the account holds before anything is registered (infra/registry.py held_tags, infra/gpu_aws.py,
    # infra/network.py): terraform-provider-aws aws_ecr_repositories DescribeRepositories, aws_ecr_images
    # ListImages, aws_vpc_endpoint_service DescribeVpcEndpointServices, aws_network_interface
    # DescribeNetworkInterfaces, aws_iam_roles ListRoles, aws_servicequotas_service_quota by name
    # ListAWSDefaultServiceQuotas then GetServiceQuota
    "aws:ecr/getRepositories:getRepositories": "ecr:DescribeRepositories",
    "aws:ecr/getImages:getImages": "ecr:ListImages",
    "aws:ec2/getVpcEndpointService:getVpcEndpointService": "ec2:DescribeVpcEndpointServices",
    "aws:ec2/getNetworkInterface:getNetworkInterface": "ec2:DescribeNetworkInterfaces",
    "aws:iam/getRoles:getRoles": "iam:ListRoles",
    "aws:servicequotas/getServiceQuota:getServiceQuota": ("servicequotas:ListAWSDefaultServiceQuotas", "servicequotas:GetServiceQuota"),
}
# inside pulumi-eks v4.3.0 (nodejs/eks/cluster/cluster.ts, addons/cni-addon.ts): getAddonVersion for
# kube-proxy and the VPC CNI; and the preflight's describe-cluster
OTHER_ACTIONS = {"eks:DescribeAddonVersions", "eks:DescribeCluster"}


def _policy() -> dict:
    return json.loads((PROJECT / "docs" / "ci" / "preview-role-policy.json").read_text())


def _actions(policy: dict) -> set[str]:
    out: set[str] = set()
    for st in policy["Statement"]:
        assert st["Effect"] == "Allow"
        out |= {st["Action"]} if isinstance(st["Action"], str) else set(st["Action"])
    return out


def test_preview_policy_is_read_only():
    for action in _actions(_policy()):
        service, _, verb = action.partition(":")
        assert verb.startswith(("Describe", "Get", "List")) and "*" not in verb, action


def test_preview_policy_covers_what_a_preview_looks_up(monkeypatch):
    seen: set[str] = set()
    original = mock_runtime.PlanMocks.call

    def recording(self, args):
        seen.add(args.token)
        return original(self, args)

    monkeypatch.setattr(mock_runtime.PlanMocks, "call", recording)
    for stack in ("dev", "prod"):
        mock_runtime.run_program(str(PROJECT), stack)
    # a stack deployed before (its repositories exist, its builds retained), with spot and interface endpoints:
    # the reads only such a stack makes
    held = {"training-dev-workloads": {}, **{deploy_state.parameter_name("training-dev", f"{deploy_state.RETAINED_BUILDS}-workloads"): {}}}
    mock_runtime.run_program(str(PROJECT), "dev", stack_config={"config": dev_config(gpuPool={"capacityTypes": ["on-demand", "spot"]}, network={"interfaceEndpoints": True})},
                             registry_images={"training-dev-workloads": {}}, ssm_parameters={k: "true" for k in held if k.startswith("/")})
    assert seen and seen <= set(INVOKE_ACTIONS), seen - set(INVOKE_ACTIONS)
    needed = {a for t in seen if INVOKE_ACTIONS[t] for a in ((INVOKE_ACTIONS[t],) if isinstance(INVOKE_ACTIONS[t], str) else INVOKE_ACTIONS[t])} | OTHER_ACTIONS
    assert needed == _actions(_policy())
    ssm = [st for st in _policy()["Statement"] if st["Action"] == "ssm:GetParameter"][0]
    # an SSM parameter's ARN is arn:<partition>:ssm:<region>:<account>:parameter/<name without its leading "/">
    for key in (deploy_state.BOOTSTRAP_ADMIN, deploy_state.TRAINER_VERSION):
        name = deploy_state.parameter_name("training-prod", key)
        assert fnmatch.fnmatchcase(f"arn:aws:ssm:us-east-1:210987654321:parameter/{name.lstrip('/')}", ssm["Resource"]), name
