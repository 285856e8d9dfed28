"""Customer-managed KMS keys for the encrypted topics and queues AWS services write to.

An AWS service that publishes to an encrypted SNS topic (CloudWatch alarms, EventBridge rules)
encrypts with the topic's key as itself, so the key's policy must grant the service principal
``kms:GenerateDataKey*`` and ``kms:Decrypt``; the AWS-managed ``alias/aws/sns`` key's policy
cannot be changed to do so, so such a topic needs a customer-managed key (SNS Developer Guide,
"Key management", "Enable compatibility between event sources from AWS services and encrypted
topics", steps 1-2; CloudWatch is ``cloudwatch.amazonaws.com``, EventBridge
``events.amazonaws.com``). Step 3: scope the grant with ``aws:SourceAccount`` and
``aws:SourceArn``, which is "not supported for EventBridge-to-encrypted topics".

SQS: EventBridge can deliver to a queue with SQS-managed encryption (SSE-SQS) but not to one
encrypted with the AWS-managed ``alias/aws/sqs`` key, whose policy cannot grant
``events.amazonaws.com``; a customer-managed key would need the same grant (EventBridge User
Guide, "Troubleshooting Amazon EventBridge": "My rule runs but ... not delivered to my Amazon SQS
queue"; SQS Developer Guide, "Key management", "Enable compatibility between AWS services such
as Amazon CloudWatch Events ... and encrypted queues"). Karpenter's interruption queue keeps
SSE-SQS, as Karpenter's reference CloudFormation does (``SqsManagedSseEnabled: true``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

# the actions a writing service needs on the key (SNS Developer Guide, step 2)
WRITER_KEY_ACTIONS = ["kms:GenerateDataKey*", "kms:Decrypt"]
# AWS KMS Developer Guide, "Deleting AWS KMS keys": a waiting period of 7-30 days during which
# the deletion can be cancelled; the longest is kept
KEY_DELETION_WINDOW_DAYS = 30


@dataclass(frozen=True)
class Writer:
    """A service that writes to an encrypted topic or queue, and the ARNs it writes from
    (``aws:SourceArn``); ``source_arns`` is empty where the service sends no such key."""

    service: str
    source_arns: tuple[str, ...] = ()


# Service principals that may carry aws:SourceAccount/aws:SourceArn to KMS (SNS Developer Guide,
# step 3: every event source except EventBridge).
SOURCE_CONDITIONS_SUPPORTED = {"cloudwatch.amazonaws.com": True, "events.amazonaws.com": False}


def key_policy(*, partition: str, account: str, writers: list[Writer]) -> dict:
    """The key's policy: the account administers it through IAM (KMS Developer Guide, "Default
    key policy": the root statement, which also keeps the key manageable), and each writer may
    encrypt and decrypt data keys, from this account and its own resources where the service
    supports those conditions."""
    root = f"arn:{partition}:iam::{account}:root"
    statements: list[dict] = [{"Sid": "AccountAdministersTheKey", "Effect": "Allow", "Principal": {"AWS": root}, "Action": "kms:*", "Resource": "*"}]
    for w in writers:
        stmt: dict = {"Sid": f"{w.service.split('.')[0].capitalize()}Writes", "Effect": "Allow", "Principal": {"Service": w.service}, "Action": list(WRITER_KEY_ACTIONS), "Resource": "*"}
        if SOURCE_CONDITIONS_SUPPORTED[w.service]:
            if not w.source_arns:
                raise ValueError(f"{w.service} writes from no resource: scope its grant with the ARNs it writes from")
            stmt["Condition"] = {"StringEquals": {"aws:SourceAccount": account}, "ArnLike": {"aws:SourceArn": sorted(w.source_arns)}}
        statements.append(stmt)
    return {"Version": "2012-10-17", "Statement": statements}


def customer_key(name: str, *, description: str, policy: pulumi.Input[str], tags: dict[str, str], opts: pulumi.ResourceOptions) -> aws.kms.Key:
    """A symmetric customer-managed key with yearly automatic rotation (KMS Developer Guide,
    "Rotating AWS KMS keys"), its policy set at creation, so whatever encrypts with it (and so
    references it) waits for the policy."""
    return aws.kms.Key(
        name, description=description, enable_key_rotation=True, deletion_window_in_days=KEY_DELETION_WINDOW_DAYS,
        policy=policy, tags=tags, opts=opts,
    )


def dumps(doc: dict) -> str:
    return json.dumps(doc, sort_keys=True)
