"""Every encrypted topic or queue an AWS service writes to lets that service write: its key's
policy and its own policy, evaluated with IAM's rules (tests/iam_eval.py) for each writer the
rendered plan wires to it, and refused to those that must not write.

Writers are read from the plan: a CloudWatch alarm whose actions name a topic writes to it as
``cloudwatch.amazonaws.com`` with ``aws:SourceArn`` = the alarm's ARN; an EventBridge target
writes to its ``arn`` as ``events.amazonaws.com`` with ``aws:SourceArn`` = the rule's ARN.

AWS facts encoded here:
* SNS Developer Guide, "Key management", "Enable compatibility between event sources from AWS
  services and encrypted topics": a customer-managed key whose policy grants the service
  ``kms:GenerateDataKey*`` and ``kms:Decrypt``; ``aws:SourceAccount``/``aws:SourceArn`` may scope
  it, except for EventBridge, whose KMS requests do not carry them (so they are left out of the
  request context for ``events.amazonaws.com`` below). The AWS-managed ``alias/aws/<service>``
  keys' policies cannot be changed (SNS and SQS Developer Guides, "Key management").
* SQS Developer Guide, "Key management", "Configure KMS permissions for AWS services": an event
  source needs a customer-managed key that grants it; a queue with SQS-managed encryption
  (SSE-SQS, ``SqsManagedSseEnabled``) uses no KMS key of the account, and is what Karpenter's
  reference CloudFormation (v1.14.1, website/content/en/docs/getting-started/
  getting-started-with-karpenter/cloudformation.yaml) gives the queue its EventBridge rules feed.
* AWS re:Post Knowledge Center, "cloudwatch-receive-sns-for-alarm-trigger": CloudWatch publishes
  to the topic as ``cloudwatch.amazonaws.com`` on behalf of the alarm ARN; EventBridge User Guide,
  "Using resource-based policies for Amazon EventBridge": SQS targets are authorised by the queue
  policy, ``aws:SourceArn`` = the rule's ARN.
"""

from __future__ import annotations

import copy
import json

import pytest

from tests.conftest import dev_config, run_config, run_stack
from tests.iam_eval import Request, allowed
from tools.mock_runtime import ACCOUNT, ProgramRun

OTHER_ACCOUNT = "210987654321"
WRITE_ACTION = {"sns": "sns:Publish", "sqs": "sqs:SendMessage"}
KEY_ACTIONS = ["kms:GenerateDataKey", "kms:Decrypt"]  # what SNS/SQS ask KMS for on a writer's behalf
CARRIES_SOURCE_TO_KMS = {"cloudwatch.amazonaws.com": True, "events.amazonaws.com": False}
NOT_A_WRITER = "s3.amazonaws.com"


def writers(run: ProgramRun) -> dict[str, list[tuple[str, str]]]:
    """Target ARN -> [(service principal, source ARN)] as the plan wires them."""
    out: dict[str, list[tuple[str, str]]] = {}
    for alarm in run.by_type("aws:cloudwatch/metricAlarm:MetricAlarm"):
        for key in ("alarmActions", "okActions", "insufficientDataActions"):
            for arn in alarm.inputs.get(key) or []:
                out.setdefault(arn, []).append(("cloudwatch.amazonaws.com", alarm.state["arn"]))
    rules = {r.state["name"]: r for r in run.by_type("aws:cloudwatch/eventRule:EventRule")}
    for target in run.by_type("aws:cloudwatch/eventTarget:EventTarget"):
        out.setdefault(target.inputs["arn"], []).append(("events.amazonaws.com", rules[target.inputs["rule"]].state["arn"]))
    return out


def _context(service: str, source_arn: str, *, to_kms: bool, account: str = ACCOUNT) -> dict[str, str]:
    if to_kms and not CARRIES_SOURCE_TO_KMS[service]:
        return {}
    return {"aws:SourceAccount": account, "aws:SourceArn": source_arn, "aws:SecureTransport": "true"}


def _key_policy(run: ProgramRun, key_ref: str | None) -> tuple[dict | None, str]:
    if not key_ref:
        return None, "not encrypted with a KMS key"
    if key_ref.startswith("alias/aws/") or ":alias/aws/" in key_ref:
        return None, f"encrypted with the AWS-managed {key_ref}, whose policy no service grant can be added to"
    keys = [k for k in run.by_type("aws:kms/key:Key") if key_ref in (k.state["arn"], k.id)]
    if len(keys) != 1:
        return None, f"its key {key_ref} is not a customer-managed key of the stack"
    key = keys[0]
    if not key.inputs.get("enableKeyRotation"):
        return None, f"key {key.name} does not rotate"
    return json.loads(key.inputs["policy"]), ""


def _resource_policy(run: ProgramRun, kind: str, target) -> dict | None:
    if kind == "sns":
        found = [p for p in run.by_type("aws:sns/topicPolicy:TopicPolicy") if p.inputs["arn"] == target.state["arn"]]
    else:
        found = [p for p in run.by_type("aws:sqs/queuePolicy:QueuePolicy") if p.inputs["queueUrl"] == target.state["url"]]
    return json.loads(found[0].inputs["policy"]) if len(found) == 1 else None


def problems(run: ProgramRun) -> list[str]:
    """Why a writer wired in the plan could not write, or one that must not could; empty if none."""
    out = []
    wired = writers(run)
    targets = [("sns", t) for t in run.by_type("aws:sns/topic:Topic")] + [("sqs", q) for q in run.by_type("aws:sqs/queue:Queue")]
    for kind, target in targets:
        arn = target.state["arn"]
        if arn not in wired:
            continue
        key_ref = target.inputs.get("kmsMasterKeyId")
        sse_sqs = kind == "sqs" and target.inputs.get("sqsManagedSseEnabled") and not key_ref
        key_doc, why = (None, "") if sse_sqs else _key_policy(run, key_ref)
        if not sse_sqs and key_doc is None:
            out.append(f"{target.name}: {why}")
            continue
        doc = _resource_policy(run, kind, target)
        if doc is None:
            out.append(f"{target.name}: no policy of its own naming its writers")
            continue
        for service, source in wired[arn]:
            if key_doc is not None:
                for action in KEY_ACTIONS:
                    if not allowed(key_doc, Request({"Service": service}, action, "*", _context(service, source, to_kms=True))):
                        out.append(f"{target.name}: its key refuses {service} {action} for {source}")
                    if allowed(key_doc, Request({"Service": NOT_A_WRITER}, action, "*", {"aws:SourceAccount": ACCOUNT, "aws:SourceArn": f"arn:aws:s3:::{ACCOUNT}-bucket"})):
                        out.append(f"{target.name}: its key lets {NOT_A_WRITER} {action}")
                    if CARRIES_SOURCE_TO_KMS[service] and allowed(key_doc, Request({"Service": service}, action, "*", _context(service, source.replace(ACCOUNT, OTHER_ACCOUNT), to_kms=True, account=OTHER_ACCOUNT))):
                        out.append(f"{target.name}: its key lets {service} {action} for another account's {source.split(':')[2]} resource")
            write = WRITE_ACTION[kind]
            if not allowed(doc, Request({"Service": service}, write, arn, _context(service, source, to_kms=False))):
                out.append(f"{target.name}: its policy refuses {service} {write} from {source}")
            if allowed(doc, Request({"Service": service}, write, arn, _context(service, source.replace(ACCOUNT, OTHER_ACCOUNT), to_kms=False, account=OTHER_ACCOUNT))):
                out.append(f"{target.name}: its policy lets {service} {write} for another account's resource")
            if allowed(doc, Request({"Service": NOT_A_WRITER}, write, arn, {"aws:SourceAccount": ACCOUNT, "aws:SourceArn": f"arn:aws:s3:::{ACCOUNT}-bucket", "aws:SecureTransport": "true"})):
                out.append(f"{target.name}: its policy lets {NOT_A_WRITER} {write}")
    return out


VARIANTS = {
    "dev": lambda: run_stack("dev"),
    "prod": lambda: run_stack("prod"),
    "teams": lambda: run_stack("teams"),
    "dev-alarms-by-mail-and-webhook": lambda: run_config(dev_config(observability={"alarms": {"emails": ["oncall@example.com"], "httpsEndpoints": ["https://hooks.example.com/x"]}})),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_writer_can_write_and_no_one_else(variant):
    run = VARIANTS[variant]()
    assert problems(run) == []


def test_the_stack_has_both_kinds_of_writer():
    """The check is exercised: dev wires CloudWatch alarms to its topic and EventBridge rules to
    Karpenter's queue."""
    run = run_stack("dev")
    services = {(arn.split(":")[2], service) for arn, ws in writers(run).items() for service, _ in ws}
    assert services == {("sns", "cloudwatch.amazonaws.com"), ("sqs", "events.amazonaws.com")}


def test_the_alarm_topic_key_and_policy():
    run = run_stack("dev")
    topic = run.one("aws:sns/topic:Topic")
    key = run.one("aws:kms/key:Key")
    assert topic.inputs["kmsMasterKeyId"] == key.state["arn"] and key.urn in topic.depends_on
    assert key.inputs["enableKeyRotation"] is True and key.inputs["deletionWindowInDays"] == 30
    policy = json.loads(key.inputs["policy"])
    alarms = sorted(a.state["arn"] for a in run.by_type("aws:cloudwatch/metricAlarm:MetricAlarm"))
    grant = next(s for s in policy["Statement"] if s.get("Principal", {}).get("Service") == "cloudwatch.amazonaws.com")
    assert grant["Condition"] == {"StringEquals": {"aws:SourceAccount": ACCOUNT}, "ArnLike": {"aws:SourceArn": alarms}}
    root = f"arn:aws:iam::{ACCOUNT}:root"
    assert allowed(policy, Request({"AWS": f"arn:aws:iam::{ACCOUNT}:role/admin"}, "kms:PutKeyPolicy")), "the account keeps managing its key"
    assert not allowed(policy, Request({"AWS": f"arn:aws:iam::{OTHER_ACCOUNT}:root"}, "kms:Decrypt")), root
    # an alarm of another stack in the same account is not this topic's writer
    stranger = alarms[0].rsplit(":", 1)[0] + ":someone-elses-alarm"
    assert not allowed(policy, Request({"Service": "cloudwatch.amazonaws.com"}, "kms:Decrypt", "*", {"aws:SourceAccount": ACCOUNT, "aws:SourceArn": stranger}))
    # the alarms wait for the topic's policy, so their first OK action is allowed
    access = run.one("aws:sns/topicPolicy:TopicPolicy")
    assert all(access.urn in a.depends_on for a in run.by_type("aws:cloudwatch/metricAlarm:MetricAlarm"))


def test_karpenters_queue_takes_events_only_from_its_rules():
    run = run_stack("dev")
    queue = run.one("aws:sqs/queue:Queue")
    assert queue.inputs["sqsManagedSseEnabled"] is True and "kmsMasterKeyId" not in queue.inputs
    access = run.one("aws:sqs/queuePolicy:QueuePolicy")
    doc = json.loads(access.inputs["policy"])
    rules = [r.state["arn"] for r in run.by_type("aws:cloudwatch/eventRule:EventRule")]
    assert len(rules) == 5
    for rule in rules:
        assert allowed(doc, Request({"Service": "events.amazonaws.com"}, "sqs:SendMessage", queue.state["arn"], {"aws:SourceArn": rule, "aws:SecureTransport": "true"}))
        assert not allowed(doc, Request({"Service": "events.amazonaws.com"}, "sqs:SendMessage", queue.state["arn"], {"aws:SourceArn": rule, "aws:SecureTransport": "false"}))
    forged = f"arn:aws:events:us-west-2:{OTHER_ACCOUNT}:rule/spot-interruption"
    assert not allowed(doc, Request({"Service": "events.amazonaws.com"}, "sqs:SendMessage", queue.state["arn"], {"aws:SourceArn": forged, "aws:SecureTransport": "true"}))
    # no event is routed before the queue accepts it
    assert all(access.urn in t.depends_on for t in run.by_type("aws:cloudwatch/eventTarget:EventTarget"))


def _with_inputs(run: ProgramRun, typ: str, change) -> ProgramRun:
    out = copy.deepcopy(run)
    for r in out.by_type(typ):
        change(r)
    return out


def test_the_check_fails_what_the_issue_describes():
    """The topic encrypted with alias/aws/sns (as before), a key without the CloudWatch grant, an
    unscoped grant, and a queue on alias/aws/sqs are each caught."""
    run = run_stack("dev")
    aws_managed = _with_inputs(run, "aws:sns/topic:Topic", lambda r: r.inputs.update(kmsMasterKeyId="alias/aws/sns"))
    assert any("AWS-managed alias/aws/sns" in p for p in problems(aws_managed))

    def drop_grant(r):
        doc = json.loads(r.inputs["policy"])
        doc["Statement"] = [s for s in doc["Statement"] if "Service" not in s.get("Principal", {})]
        r.inputs["policy"] = json.dumps(doc)

    assert any("refuses cloudwatch.amazonaws.com kms:GenerateDataKey" in p for p in problems(_with_inputs(run, "aws:kms/key:Key", drop_grant)))

    def unscope(r):
        doc = json.loads(r.inputs["policy"])
        for s in doc["Statement"]:
            if s["Effect"] == "Allow":
                s.pop("Condition", None)
        r.inputs["policy"] = json.dumps(doc)

    assert any("another account" in p for p in problems(_with_inputs(run, "aws:kms/key:Key", unscope)))
    assert any("another account" in p for p in problems(_with_inputs(run, "aws:sqs/queuePolicy:QueuePolicy", unscope)))
    on_aws_key = _with_inputs(run, "aws:sqs/queue:Queue", lambda r: r.inputs.update(kmsMasterKeyId="alias/aws/sqs", sqsManagedSseEnabled=False))
    assert any("AWS-managed alias/aws/sqs" in p for p in problems(on_aws_key))
