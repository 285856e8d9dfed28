"""Day two: bad GPU nodes found and replaced, jobs ranked by priority, alarms, and GPU-hours
per team. Upstream facts encoded here:
* Karpenter v1.14.1 (sigs.k8s.io/karpenter pkg/controllers/node/health/controller.go): node repair
  runs only with the NodeRepair feature gate; it sets the NodeClaim's termination timestamp to now
  before deleting it, so do-not-disrupt and budgets do not hold it; it waits while more than 20%
  of a NodePool's nodes are unhealthy. The AWS provider (karpenter-provider-aws
  pkg/cloudprovider/cloudprovider.go RepairPolicies) repairs AcceleratedHardwareReady=False after
  10 min, Ready False/Unknown and the other agent conditions after 30 min.
* Kueue v0.19.2: WorkloadPriorityClass (value), the job label kueue.x-k8s.io/priority-class;
  ClusterQueue preemption borrowWithinCohort {policy: LowerPriority, maxPriorityThreshold}."""

from __future__ import annotations

from k8s.builders import kueue as kq
from tests.conftest import dev_config, objects, run_config, run_stack

HELM = "kubernetes:helm.sh/v3:Release"
TEAMS = {"vision": {"gpuQuota": 8, "defaultPriority": "low"}, "nlp": {"gpuQuota": 8}}


def test_the_node_monitoring_agent_and_node_repair_in_karpenter_mode():
    run = run_config(dev_config(tenants=TEAMS))
    addon = run.one("aws:eks/addon:Addon", "node-health-node-monitoring-agent").inputs
    assert addon["addonName"] == "eks-node-monitoring-agent" and addon["addonVersion"].startswith("v1.")
    karpenter = next(r for r in run.by_type(HELM) if r.name == "karpenter")
    assert karpenter.inputs["values"]["settings"]["featureGates"] == {"nodeRepair": True}
    off = run_config(dev_config(gpuPool={"nodeRepair": False}))
    assert next(r for r in off.by_type(HELM) if r.name == "karpenter").inputs["values"]["settings"]["featureGates"] == {"nodeRepair": False}


def test_auto_mode_adds_neither_its_own_repair_does_it():
    run = run_config(dev_config(gpuPool={"mode": "auto"}))
    assert not [r for r in run.by_type("aws:eks/addon:Addon") if r.inputs.get("addonName") == "eks-node-monitoring-agent"]


def test_at_least_two_priority_classes_and_preemption_by_priority_in_the_cohort():
    run = run_config(dev_config(tenants=TEAMS))
    objs = objects(run).values()
    classes = {o["metadata"]["name"]: o["value"] for o in objs if o["kind"] == "WorkloadPriorityClass"}
    assert classes == kq.PRIORITIES and classes["low"] < classes["normal"] < classes["high"]
    for cq in (o for o in objs if o["kind"] == "ClusterQueue"):
        pre = cq["spec"]["preemption"]
        assert pre["withinClusterQueue"] == "LowerPriority" and pre["borrowWithinCohort"] == {"policy": "LowerPriority", "maxPriorityThreshold": classes["low"]}
    jobs = [o for o in objs if o["kind"] == "TrainJob"]
    assert jobs and all(j["metadata"]["labels"][kq.PRIORITY_LABEL] in classes for j in jobs)
    facts = {o["metadata"]["namespace"]: o["data"] for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "platform-facts"}
    assert '"defaultPriority": "low"' in facts["vision"]["facts.json"] and '"defaultPriority": "normal"' in facts["nlp"]["facts.json"]


def test_a_stack_job_takes_its_configured_priority():
    run = run_config(dev_config(tenants=TEAMS, trainjobs={"ddp": {"enabled": True, "priority": "high"}}))
    ddp = next(o for o in objects(run).values() if o["kind"] == "TrainJob" and o["metadata"]["name"] == "ddp-mnist")
    assert ddp["metadata"]["labels"][kq.PRIORITY_LABEL] == "high"


def test_without_kueue_no_priority_label():
    run = run_stack("dev")
    assert all(kq.PRIORITY_LABEL not in o["metadata"].get("labels", {}) for o in objects(run).values() if o["kind"] == "TrainJob")


def test_alarms_on_a_topic_with_their_metrics_and_thresholds():
    run = run_config(dev_config(tenants=TEAMS, observability={"alarms": {"emails": ["oncall@example.com"], "httpsEndpoints": ["https://hooks.example.com/x"]}}))
    topic = run.one("aws:sns/topic:Topic")
    # a customer-managed key CloudWatch may use (alias/aws/sns refuses it: tests/test_encrypted_writers.py)
    assert topic.inputs["kmsMasterKeyId"] == run.one("aws:kms/key:Key").state["arn"]
    subs = {(s.inputs["protocol"], s.inputs["endpoint"]) for s in run.by_type("aws:sns/topicSubscription:TopicSubscription")}
    assert subs == {("email", "oncall@example.com"), ("https", "[secret]")}  # a webhook URL is a Pulumi secret, masked in the plan
    alarms = {a.name.removeprefix("alarms-"): a.inputs for a in run.by_type("aws:cloudwatch/metricAlarm:MetricAlarm")}
    assert len(alarms) >= 3 and all(a["alarmActions"] == [topic.state["arn"]] for a in alarms.values())
    expected = {
        "trainjobs-failed": ("TrainingPlatform", "TrainJobsFailed", "Sum", "GreaterThanOrEqualToThreshold", 1),
        "trainjobs-stalled": ("TrainingPlatform", "TrainJobsStalled", "Sum", "GreaterThanOrEqualToThreshold", 1),
        "gpus-idle": ("ContainerInsights", "node_gpu_utilization", "Average", "LessThanThreshold", 5),
        "nodes-not-ready": ("ContainerInsights", "cluster_failed_node_count", "Maximum", "GreaterThanThreshold", 0),
    }
    for key, (ns, metric, stat, op, threshold) in expected.items():
        a = alarms[key]
        assert (a["namespace"], a["metricName"], a["statistic"], a["comparisonOperator"], a["threshold"]) == (ns, metric, stat, op, threshold), key
        assert a["treatMissingData"] == "notBreaching"  # no GPU node or no job: no alarm
    assert alarms["gpus-idle"]["period"] * alarms["gpus-idle"]["evaluationPeriods"] == 60 * 60  # idleMinutes 60
    # a Container Insights alarm names a dimension set the CloudWatch agent publishes (infra/alarms.py)
    from infra.alarms import CONTAINER_INSIGHTS_DIMENSIONS

    for key in ("gpus-idle", "nodes-not-ready"):
        a = alarms[key]
        assert tuple(sorted(a["dimensions"])) in [tuple(sorted(d)) for d in CONTAINER_INSIGHTS_DIMENSIONS[a["metricName"]]], (key, a["dimensions"])
        assert a["dimensions"]["ClusterName"] == run.one("eks:index:Cluster").inputs["name"]
    filters = {f.inputs["metricTransformation"]["name"]: f.inputs["pattern"] for f in run.by_type("aws:cloudwatch/logMetricFilter:LogMetricFilter")}
    assert set(filters) == {"TrainJobsFailed", "TrainJobsStalled"}


def test_the_metric_filters_match_the_lines_the_programs_print():
    """The filter's pattern is a quoted term: CloudWatch Logs matches it as a substring of the
    event (Filter and pattern syntax); Fluent Bit ships the line inside a JSON "log" field, its
    quotes escaped. The programs' own metric lines must contain it."""
    import json

    import trainlib

    from infra.alarms import ALERT_TOKENS, metric_filters

    assert ALERT_TOKENS == trainlib.ALERT_TOKENS  # one list, on both sides of the pipe
    for kind, f in metric_filters("c").items():
        term = json.loads(f["pattern"])  # the quoted term, as CloudWatch reads it
        assert term.isidentifier()  # nothing an escape could change
        line = trainlib.metric_line(kind, job="j", node=0, rank=0, alert=trainlib.ALERT_TOKENS[kind])
        shipped = json.dumps({"log": line, "stream": "stdout"})  # what Fluent Bit sends
        assert term in shipped and term in line, (term, shipped)


def test_prometheus_mode_has_the_same_alerts_as_rules():
    run = run_config(dev_config(observability={"mode": "prometheus"}))
    rule = next(o for o in objects(run).values() if o["kind"] == "PrometheusRule")
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert alerts == {"TrainJobFailed", "TrainJobStalled", "GpusHeldIdle", "NodeNotReady"}
    assert not run.by_type("aws:cloudwatch/metricAlarm:MetricAlarm")


def test_the_dashboard_has_a_widget_per_team():
    import json

    run = run_config(dev_config(tenants=TEAMS))
    body = json.loads(run.one("aws:cloudwatch/dashboard:Dashboard").inputs["dashboardBody"])
    titles = [w["properties"]["title"] for w in body["widgets"]]
    for team in TEAMS:
        widget = next(w for w in body["widgets"] if w["properties"]["title"] == f"Team {team}: GPUs requested by its pods")
        assert f'Namespace="{team}"' in widget["properties"]["metrics"][0][0]["expression"]
    assert len(titles) == len(set(titles))
