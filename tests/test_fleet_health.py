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

from manifests import kueue as kq
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
