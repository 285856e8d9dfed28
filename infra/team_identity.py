"""A team's AWS identity (``tenants.<team>.s3``): an IAM role that EKS Pod Identity hands to the
team's jobs, allowed exactly the S3 buckets and folders the stack file lists for the team.

* The role trusts ``pods.eks.amazonaws.com`` (``infra/gpu_aws.py`` pod_identity_trust), and one Pod
  Identity association names it for (the team's namespace, the team's jobs' service account,
  ``k8s/builders/tenants.py`` TEAM_SERVICE_ACCOUNT). EKS then injects, into every pod of that
  service account, ``AWS_CONTAINER_CREDENTIALS_FULL_URI=http://169.254.170.23/v1/credentials``,
  ``AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE`` and a projected token of audience
  ``pods.eks.amazonaws.com`` (EKS User Guide, "Understand how EKS Pod Identity works"), which the AWS
  SDKs' container credential provider reads (AWS SDKs and Tools Reference Guide, "Container
  credential provider"). The team's egress NetworkPolicy opens the agent's address for it.
* The inline policy (:func:`s3_access_policy`): ``s3:ListBucket`` on each bucket, limited by the
  ``s3:prefix`` condition key to the team's folders (Amazon S3 User Guide, bucket policy examples:
  "Restrict listing to a folder"; Service Authorization Reference, Amazon S3: ListBucket takes
  ``s3:prefix``); ``s3:GetObject`` on the objects under them; with ``access: readwrite`` also
  ``s3:PutObject`` (multipart uploads' create, upload part and complete are authorised as PutObject),
  ``s3:DeleteObject``, ``s3:AbortMultipartUpload`` and ``s3:ListMultipartUploadParts`` (Amazon S3
  User Guide, "Multipart upload API and permissions"). Nothing else: no bucket settings, no other
  service. Buckets encrypted with a customer-managed KMS key also need the key's policy to allow the
  role (docs/teams-aws-access.md).
* Every statement also holds only while the bucket belongs to the stack's own account
  (``StringEquals: {"s3:ResourceAccount": <account>}``), unless the grant says ``crossAccount: true``:
  S3 names are global, so a mistyped or deleted-and-reclaimed name would otherwise grant someone
  else's bucket. s3:ResourceAccount is the bucket owner's account ID, for IAM identity policies
  restricting access to buckets owned by given accounts (Service Authorization Reference, Amazon S3
  condition keys: "Filters access by the resource owner AWS account ID"; AWS What's New 2020-12-21
  "New IAM condition keys for Amazon S3 ..."; AWS Storage Blog "Limit access to Amazon S3 buckets
  owned by specific AWS accounts", its identity policy example with s3:ListBucket and s3:GetObject).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

import pulumi
import pulumi_aws as aws

from config.names import IAM_POLICY, IAM_ROLE
from config.team_models import S3Access
from infra.gpu_aws import aws_partition, pod_identity_trust
from k8s.builders.tenants import TEAM_LABEL, TEAM_SERVICE_ACCOUNT

POLICY_NAME = "s3-access"
"""The role's one inline policy."""
assert IAM_POLICY.fits(POLICY_NAME)
READ_ACTIONS = ("s3:GetObject",)
WRITE_ACTIONS = ("s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts")


def team_role_name(cluster_name: str, team: str) -> str:
    """``<cluster>-team-<team>``, shortened with a hash when longer than IAM's 64 characters."""
    return IAM_ROLE.name(cluster_name, "team", team)


def _sid(prefix: str, i: int) -> str:
    return re.sub(r"[^A-Za-z0-9]", "", prefix) + str(i)


def s3_access_policy(grants: Sequence[S3Access], *, account: str, partition: str = "aws") -> dict:
    """The role's identity policy for ``grants`` (:class:`config.team_models.S3Access`, checked by the
    config): per bucket one ListBucket statement (a ``s3:prefix`` condition unless a grant is the whole
    bucket), then one statement for the objects it may read and one for those it may also write, each
    held to buckets of ``account`` (s3:ResourceAccount); the ``crossAccount`` grants' objects get
    statements of their own, without that condition."""
    if not grants:
        raise ValueError("a team without S3 grants gets no role")
    s3 = f"arn:{partition}:s3:::"
    owner = {"s3:ResourceAccount": account}
    buckets: dict[str, list[str]] = {}
    for g in grants:
        assert g.bucket is not None
        buckets.setdefault(g.bucket, []).append(g.prefix or "")
    cross = {g.bucket for g in grants if g.cross_account}
    statements: list[dict] = []
    for i, (bucket, prefixes) in enumerate(buckets.items()):
        stmt: dict = {"Sid": _sid("List", i), "Effect": "Allow", "Action": "s3:ListBucket", "Resource": f"{s3}{bucket}"}
        condition: dict = {} if bucket in cross else {"StringEquals": dict(owner)}
        if "" not in prefixes:  # listing only under the folders ('data/*' also matches 'data/' itself)
            condition["StringLike"] = {"s3:prefix": sorted(f"{p}*" for p in set(prefixes))}
        if condition:
            stmt["Condition"] = condition
        statements.append(stmt)

    def objects(of: Sequence[S3Access]) -> list[str]:
        return sorted({f"{s3}{g.bucket}/{g.prefix or ''}*" for g in of})

    writable = [g for g in grants if g.access == "readwrite"]
    for sid, actions, of in (("Read", READ_ACTIONS, grants), ("Write", WRITE_ACTIONS, writable)):
        own, other = [g for g in of if g.bucket not in cross], [g for g in of if g.bucket in cross]
        if own:
            statements.append({"Sid": sid, "Effect": "Allow", "Action": list(actions), "Resource": objects(own), "Condition": {"StringEquals": dict(owner)}})
        if other:
            statements.append({"Sid": f"{sid}CrossAccount", "Effect": "Allow", "Action": list(actions), "Resource": objects(other)})
    return {"Version": "2012-10-17", "Statement": statements}


class TeamIdentity(pulumi.ComponentResource):
    """One team's role, its inline S3 policy and its Pod Identity association."""

    def __init__(
        self,
        name: str,
        *,
        cluster_name: str,
        eks_cluster_name: pulumi.Input[str],
        region: str,
        team: str,
        namespace: str,
        grants: Sequence[S3Access],
        tags: dict[str, str],
        pod_identity_agent: pulumi.Resource | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("training-platform:infra:TeamIdentity", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.role_name = team_role_name(cluster_name, team)
        role = aws.iam.Role(name, name=self.role_name, assume_role_policy=pod_identity_trust(), tags={**tags, TEAM_LABEL: team}, opts=child)
        account = aws.get_caller_identity_output(opts=pulumi.InvokeOptions(parent=self)).account_id  # the stack's account
        document = account.apply(lambda a: json.dumps(s3_access_policy(grants, account=a, partition=aws_partition(region)), sort_keys=True))
        policy = aws.iam.RolePolicy(name, role=role.id, name=POLICY_NAME, policy=document, opts=child)
        # pods get credentials once the role holds its grants, and from the Pod Identity agent (as the observability and
        # portal associations: infra/gpu_aws.py pod_identity_agent)
        self.association = aws.eks.PodIdentityAssociation(
            name, cluster_name=eks_cluster_name, namespace=namespace, service_account=TEAM_SERVICE_ACCOUNT, role_arn=role.arn, tags=tags,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[policy, *([pod_identity_agent] if pod_identity_agent is not None else [])]),
        )
        self.role = role
        self.register_outputs({"roleName": self.role_name, "namespace": namespace, "serviceAccount": TEAM_SERVICE_ACCOUNT})
