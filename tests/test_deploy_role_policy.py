"""docs/deploy-role-policy.json, the deploying role's identity policy, covers every kind of AWS
resource the shipped stacks register (a new kind fails here until the policy grants it)."""

from __future__ import annotations

import fnmatch
import json
import re

import pytest

from tests.conftest import PROJECT
from tools.mock_runtime import run_program

POLICY = json.loads((PROJECT / "docs" / "deploy-role-policy.json").read_text())

# Pulumi resource type (module/resource) -> the IAM actions its create needs, at least
NEEDS = {
    "aws:ec2/vpc:Vpc": ["ec2:CreateVpc"], "aws:ec2/subnet:Subnet": ["ec2:CreateSubnet"], "aws:ec2/eip:Eip": ["ec2:AllocateAddress"],
    "aws:ec2/internetGateway:InternetGateway": ["ec2:CreateInternetGateway", "ec2:AttachInternetGateway"], "aws:ec2/natGateway:NatGateway": ["ec2:CreateNatGateway"],
    "aws:ec2/routeTable:RouteTable": ["ec2:CreateRouteTable", "ec2:CreateRoute"], "aws:ec2/routeTableAssociation:RouteTableAssociation": ["ec2:AssociateRouteTable"],
    "aws:ec2/flowLog:FlowLog": ["ec2:CreateFlowLogs"], "aws:ec2/vpcEndpoint:VpcEndpoint": ["ec2:CreateVpcEndpoint", "ec2:ModifyVpcEndpoint", "ec2:DeleteVpcEndpoints"],
    "aws:iam/serviceLinkedRole:ServiceLinkedRole": ["iam:CreateServiceLinkedRole"], "aws:ec2/tag:Tag": ["ec2:CreateTags"], "aws:ec2/securityGroup:SecurityGroup": ["ec2:CreateSecurityGroup"],
    "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule": ["ec2:AuthorizeSecurityGroupIngress"], "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule": ["ec2:AuthorizeSecurityGroupEgress"],
    "aws:ec2/launchTemplate:LaunchTemplate": ["ec2:CreateLaunchTemplate"], "aws:ec2/placementGroup:PlacementGroup": ["ec2:CreatePlacementGroup"],
    "aws:eks/accessEntry:AccessEntry": ["eks:CreateAccessEntry", "eks:AssociateAccessPolicy"], "aws:eks/addon:Addon": ["eks:CreateAddon"],
    "aws:eks/podIdentityAssociation:PodIdentityAssociation": ["eks:CreatePodIdentityAssociation", "iam:PassRole"],
    "eks:index:Cluster": ["eks:CreateCluster", "eks:DescribeCluster", "iam:CreateRole", "iam:PassRole", "iam:CreateOpenIDConnectProvider", "ec2:CreateSecurityGroup"],
    "eks:index:ManagedNodeGroup": ["eks:CreateNodegroup", "iam:PassRole", "ec2:CreateLaunchTemplate", "ec2:RunInstances"],
    "aws:iam/role:Role": ["iam:CreateRole"], "aws:iam/policy:Policy": ["iam:CreatePolicy"], "aws:iam/rolePolicy:RolePolicy": ["iam:PutRolePolicy"],
    "aws:iam/rolePolicyAttachment:RolePolicyAttachment": ["iam:AttachRolePolicy"],
    "aws:fsx/lustreFileSystem:LustreFileSystem": ["fsx:CreateFileSystem"], "aws:efs/fileSystem:FileSystem": ["elasticfilesystem:CreateFileSystem"],
    "aws:efs/fileSystemPolicy:FileSystemPolicy": ["elasticfilesystem:PutFileSystemPolicy"], "aws:efs/backupPolicy:BackupPolicy": ["elasticfilesystem:PutBackupPolicy"],
    "aws:efs/mountTarget:MountTarget": ["elasticfilesystem:CreateMountTarget"], "aws:efs/accessPoint:AccessPoint": ["elasticfilesystem:CreateAccessPoint"],
    "aws:kms/key:Key": ["kms:CreateKey", "kms:EnableKeyRotation"],
    "aws:ecr/repository:Repository": ["ecr:CreateRepository"], "aws:ecr/lifecyclePolicy:LifecyclePolicy": ["ecr:PutLifecyclePolicy"],
    "docker-build:index:Image": ["ecr:GetAuthorizationToken", "ecr:InitiateLayerUpload", "ecr:PutImage"], "docker-build:index:Index": ["ecr:PutImage"],
    "aws:cloudwatch/eventRule:EventRule": ["events:PutRule"], "aws:cloudwatch/eventTarget:EventTarget": ["events:PutTargets"],
    "aws:cloudwatch/logGroup:LogGroup": ["logs:CreateLogGroup", "logs:PutRetentionPolicy"], "aws:cloudwatch/logMetricFilter:LogMetricFilter": ["logs:PutMetricFilter"],
    "aws:cloudwatch/dashboard:Dashboard": ["cloudwatch:PutDashboard"], "aws:cloudwatch/metricAlarm:MetricAlarm": ["cloudwatch:PutMetricAlarm"],
    "aws:sns/topic:Topic": ["sns:CreateTopic"], "aws:sns/topicPolicy:TopicPolicy": ["sns:SetTopicAttributes"], "aws:sns/topicSubscription:TopicSubscription": ["sns:Subscribe"],
    "aws:sqs/queue:Queue": ["sqs:CreateQueue"], "aws:sqs/queuePolicy:QueuePolicy": ["sqs:SetQueueAttributes"],
    "aws:ssm/parameter:Parameter": ["ssm:PutParameter"],
}


def granted(action: str) -> bool:
    return any(s["Effect"] == "Allow" and any(fnmatch.fnmatchcase(action.lower(), a.lower()) for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])) for s in POLICY["Statement"])


def test_the_policy_is_well_formed_and_grants_nothing_service_wide():
    assert POLICY["Version"] == "2012-10-17"
    for s in POLICY["Statement"]:
        assert set(s) == {"Sid", "Effect", "Action", "Resource"} and s["Effect"] == "Allow"
        for a in s["Action"]:
            assert re.fullmatch(r"[a-z0-9-]+:[A-Za-z*]+", a), a
            assert a != "*" and not a.endswith(":*") or (a == "eks:*" and s["Resource"] != "*"), f"{s['Sid']}: {a} on {s['Resource']}"
    ssm = next(s for s in POLICY["Statement"] if s["Sid"] == "DeployState")
    assert ssm["Resource"] == "arn:aws:ssm:*:*:parameter/training-platform/*"  # infra/deploy_state.py parameter_name


@pytest.mark.parametrize("stack", ["dev", "prod", "teams", "workshop"])
def test_every_kind_of_resource_a_shipped_stack_registers_is_granted(stack):
    run = run_program(str(PROJECT), stack)
    kinds = {r.type for r in run.registrations if r.type.startswith(("aws:", "eks:", "docker-build:"))}
    unknown = sorted(kinds - set(NEEDS))
    assert unknown == [], f"add these kinds to NEEDS and the policy: {unknown}"
    missing = sorted({a for k in kinds for a in NEEDS[k] if not granted(a)})
    assert missing == []


# What the program reads from the account before it registers anything (provider functions) -> the action
READS = {
    "aws:ecr/getImages:getImages": "ecr:ListImages",  # infra/registry.py held_tags
    "aws:iam/getRoles:getRoles": "iam:ListRoles",  # infra/gpu_aws.py, the EC2 Spot service-linked role
    "aws:ec2/getVpcEndpointService:getVpcEndpointService": "ec2:DescribeVpcEndpointServices",  # infra/network.py
    "aws:ec2/getNetworkInterface:getNetworkInterface": "ec2:DescribeNetworkInterfaces",
    "aws:ssm/getParameter:getParameter": "ssm:GetParameter",  # infra/deploy_state.py
    # infra/gpu_aws.py, by the quota's name: terraform-provider-aws service_quota_data_source.go finds the code
    # through ListAWSDefaultServiceQuotas (findServiceQuotaDefaultByName), then calls GetServiceQuota
    "aws:servicequotas/getServiceQuota:getServiceQuota": ("servicequotas:ListAWSDefaultServiceQuotas", "servicequotas:GetServiceQuota"),
}


def test_what_the_program_reads_from_the_account_is_granted():
    assert sorted(a for v in READS.values() for a in ((v,) if isinstance(v, str) else v) if not granted(a)) == []
    source = "\n".join(p.read_text() for p in (PROJECT / "infra").glob("*.py"))
    for token in READS:  # each read is still made (a renamed call would leave its grant unexplained)
        module, fn = token.split(":")[1].split("/")[0], token.split(":")[-1]
        assert re.search(rf"aws\.{module}\.{re.sub(r'(?<!^)(?=[A-Z])', '_', fn).lower()}", source), token
