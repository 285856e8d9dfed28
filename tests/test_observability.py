"""Operating the platform: observability per mode, the dashboard, training metric lines, job
lifecycle (deadline, cleanup), the GPU smoke check and the runbook's commands."""

from __future__ import annotations

import json
import pathlib
import re
import shlex
import subprocess
import sys

import pytest
import yaml

import versions
from config.schema import ConfigError
from config.settings import LOG_RETENTION_DAYS, load_settings
from infra import observability as obs
from k8s.builders import gpu_objects as g
from k8s.builders import operations as kobs
from k8s.pods import trainjob_cleanup as tc
from tests.conftest import PROJECT, dev_config, find, objects, run_config, run_stack
from tools import validate as v
from workloads.builders import trainjobs as tj
from workloads.programs import trainlib

ADDON = "aws:eks/addon:Addon"
RELEASE = "kubernetes:helm.sh/v3:Release"
LOG_GROUP = "aws:cloudwatch/logGroup:LogGroup"
DASHBOARD = "aws:cloudwatch/dashboard:Dashboard"
ASSOCIATION = "aws:eks/podIdentityAssociation:PodIdentityAssociation"


def _addon(run, name: str):
    found = [r for r in run.by_type(ADDON) if r.inputs["addonName"] == name]
    return found[0] if found else None


def _container_insights_groups(run) -> dict[str, int]:
    return {r.inputs["name"]: r.inputs["retentionInDays"] for r in run.by_type(LOG_GROUP) if r.inputs["name"].startswith("/aws/containerinsights/")}


# --- cloudwatch mode (default) ------------------------------------------------------------------


def test_dev_has_the_cloudwatch_addon_with_pod_identity_log_retention_and_dashboard():
    run = run_stack("dev")
    addon = _addon(run, obs.ADDON_NAME)
    assert addon is not None and addon.inputs["addonVersion"] == versions.CLOUDWATCH_OBSERVABILITY_ADDON_VERSION
    config = json.loads(addon.inputs["configurationValues"])
    assert kobs.tolerates(config["tolerations"], g.GPU_TAINT)  # Fluent Bit, the agent and DCGM reach GPU nodes
    assert config["containerLogs"]["enabled"] is True
    assert config["agent"]["config"]["logs"]["metrics_collected"]["kubernetes"] == {"enhanced_container_insights": True, "accelerated_compute_metrics": True}

    assoc = [r for r in run.by_type(ASSOCIATION) if r.inputs["serviceAccount"] == obs.AGENT_SERVICE_ACCOUNT]
    assert len(assoc) == 1 and assoc[0].inputs["namespace"] == obs.AGENT_NAMESPACE
    role = run.one("aws:iam/role:Role", "observability-cloudwatch-agent")
    trust = json.loads(role.inputs["assumeRolePolicy"])["Statement"][0]
    assert trust["Principal"] == {"Service": "pods.eks.amazonaws.com"} and "sts:TagSession" in trust["Action"]
    attached = [r.inputs["policyArn"] for r in run.by_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment") if r.name == "observability-cloudwatch-agent"]
    assert attached == ["arn:aws:iam::aws:policy/CloudWatchAgentServerPolicy"]  # no X-Ray: no traces are collected
    agent = _addon(run, "eks-pod-identity-agent")
    assert agent is not None and agent.urn in assoc[0].depends_on  # the association needs the Pod Identity agent
    assert assoc[0].urn in addon.depends_on  # the agents start with their credentials

    groups = _container_insights_groups(run)
    assert groups == {f"/aws/containerinsights/training-dev/{k}": 30 for k in obs.LOG_GROUP_KINDS}
    group_urns = {r.urn for r in run.by_type(LOG_GROUP) if r.inputs["name"] in groups}
    assert group_urns <= set(addon.depends_on)  # created (with retention) before Fluent Bit could auto-create them

    dash = run.one(DASHBOARD)
    assert dash.inputs["dashboardName"] == "training-dev-training"
    body = json.loads(dash.inputs["dashboardBody"])
    assert body == obs.dashboard_body(cluster_name="training-dev", region="us-west-2", training_namespaces=["training"], karpenter=True)


def test_dashboard_body_is_well_formed_and_shows_what_operators_need():
    body = obs.dashboard_body(cluster_name="c1", region="eu-west-1", training_namespaces=["training", "vision"], karpenter=True)
    titles = [w["properties"]["title"] for w in body["widgets"]]
    text = json.dumps(body)
    for metric in ("node_gpu_utilization", "node_gpu_memory_utilization", "node_efa_rx_bytes", "node_efa_tx_bytes", "pod_status_pending", "cluster_node_count"):
        assert f'MetricName=\\"{metric}\\"' in text, metric
    assert any("launched nodeclaim" in w["properties"].get("query", "") for w in body["widgets"])
    assert any("attempts" in t.lower() for t in titles)  # job restarts
    cells = set()
    for w in body["widgets"]:
        assert w["type"] in ("metric", "log") and w["properties"]["region"] == "eu-west-1"
        assert 0 <= w["x"] and w["x"] + w["width"] <= obs.DASHBOARD_GRID_WIDTH and w["height"] > 0
        cell = {(x, y) for x in range(w["x"], w["x"] + w["width"]) for y in range(w["y"], w["y"] + w["height"])}
        assert not cell & cells, f"widgets overlap at {w['properties']['title']}"
        cells |= cell
        if w["type"] == "log":  # every query reads a log group the stack creates
            assert w["properties"]["query"].startswith(f"SOURCE '{obs.log_group_name('c1', 'application')}' | ")
        else:
            for row in w["properties"]["metrics"]:
                expr = row[0]["expression"]
                assert expr.count("(") == expr.count(")") and 'ClusterName="c1"' in expr
    pending = next(w for w in body["widgets"] if "pod_status_pending" in json.dumps(w))
    assert 'Namespace=\\"training\\" OR Namespace=\\"vision\\"' in json.dumps(pending)
    auto = obs.dashboard_body(cluster_name="c1", region="eu-west-1", training_namespaces=["training"], karpenter=False)
    assert "launched nodeclaim" not in json.dumps(auto)  # Auto Mode: no Karpenter logs of ours


def test_dashboard_preview_png_is_in_the_readme_and_small():
    png = PROJECT / "docs" / "dashboard.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size < 150_000
    readme = (PROJECT / "README.md").read_text()
    assert "docs/dashboard.png" in readme and "layout preview" in readme
    from tools.dashboard_preview import layout

    body = obs.dashboard_body(cluster_name="training-dev", region="us-west-2", training_namespaces=["training"], karpenter=True)
    assert [b.title for b in layout(body)] == [w["properties"]["title"] for w in body["widgets"]]


def test_log_retention_comes_from_config_and_is_checked():
    run = run_config(dev_config(observability={"logRetentionDays": 7}))
    assert set(_container_insights_groups(run).values()) == {7}
    with pytest.raises(ConfigError) as err:
        load_settings({"observability": {"logRetentionDays": 10}}, stack="dev", region="us-west-2")
    assert err.value.key == "observability.logRetentionDays" and "14" in str(err.value) and "3653" in str(err.value)
    # CloudWatch Logs API Reference, PutRetentionPolicy retentionInDays
    assert LOG_RETENTION_DAYS == (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653)


@pytest.mark.parametrize(("raw", "key"), [
    ({"observability": {"mode": "datadog"}}, "observability.mode"),
    ({"observability": {"logRetentionDays": 0}}, "observability.logRetentionDays"),
    ({"smokeChecks": {"enabled": True, "instanceType": "m5.large"}}, "smokeChecks.instanceType"),
    ({"gpuPool": {"instanceFamilies": ["g6"]}, "smokeChecks": {"enabled": True, "instanceType": "g5.xlarge"}}, "smokeChecks.instanceType"),
    ({"trainjobs": {"finishedJobRetention": "7d"}}, "trainjobs.finishedJobRetention"),
    ({"trainjobs": {"ddp": {"enabled": True, "activeDeadlineSeconds": 0}}}, "trainjobs.ddp.activeDeadlineSeconds"),
])
def test_bad_operate_config_is_refused_naming_the_key(raw, key):
    with pytest.raises(ConfigError) as err:
        load_settings(raw, stack="dev", region="us-west-2")
    assert err.value.key == key


# --- prometheus and none modes ------------------------------------------------------------------


def test_prometheus_mode_installs_pinned_charts_that_tolerate_the_gpu_taint():
    run = run_config(dev_config(observability={"mode": "prometheus"}))
    assert _addon(run, obs.ADDON_NAME) is None and not run.by_type(DASHBOARD) and not _container_insights_groups(run)
    releases = {r.inputs["chart"]: r for r in run.by_type(RELEASE)}
    pins = {versions.DCGM_EXPORTER_CHART: (versions.DCGM_EXPORTER_VERSION, versions.DCGM_EXPORTER_REPO),
            versions.KUBE_PROMETHEUS_STACK_CHART: (versions.KUBE_PROMETHEUS_STACK_VERSION, versions.KUBE_PROMETHEUS_STACK_REPO)}
    for chart, (version, repo) in pins.items():
        rel = releases[chart]
        assert rel.inputs["version"] == version and rel.inputs["repositoryOpts"]["repo"] == repo and rel.inputs["namespace"] == kobs.MONITORING_NAMESPACE
        values = rel.inputs["values"]
        # only values the chart reads (its values.yaml at the pinned version)
        assert kobs.value_paths(values) <= kobs.CHART_VALUE_PATHS[chart], kobs.value_paths(values) - kobs.CHART_VALUE_PATHS[chart]
        for path in kobs.DAEMONSET_TOLERATIONS[chart]:
            assert kobs.tolerates(kobs.get_path(values, path), g.GPU_TAINT), path
        for path in kobs.SYSTEM_AFFINITIES[chart]:
            assert kobs.get_path(values, path) == g.SYSTEM_NODE_AFFINITY, path
    stack = releases[versions.KUBE_PROMETHEUS_STACK_CHART]
    assert stack.urn in releases[versions.DCGM_EXPORTER_CHART].depends_on  # its ServiceMonitor needs the operator's CRDs
    dcgm = releases[versions.DCGM_EXPORTER_CHART].inputs["values"]
    assert dcgm["affinity"] == g.nvidia_device_plugin_values()["affinity"]  # on GPU-pool nodes only
    cm = find(run, "ConfigMap", "training-platform-dashboard")
    assert cm["metadata"]["labels"] == {"grafana_dashboard": "1"}
    panels = json.loads(cm["data"]["training-platform.json"])["panels"]
    assert any("DCGM_FI_DEV_GPU_UTIL" in p["targets"][0]["expr"] for p in panels)


def test_tolerations_follow_kubernetes_matching_rules():
    taint = {"key": "nvidia.com/gpu", "effect": "NoSchedule"}
    assert kobs.tolerates([{"operator": "Exists"}], taint)
    assert kobs.tolerates([{"key": "nvidia.com/gpu", "operator": "Exists"}], taint)
    assert kobs.tolerates([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}], taint)
    assert not kobs.tolerates([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}], taint)
    assert not kobs.tolerates([{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}], taint)  # dcgm-exporter's default
    assert kobs.tolerates([{"effect": "NoSchedule", "operator": "Exists"}], taint)  # node-exporter's default
    assert not kobs.tolerates([{"key": "nvidia.com/gpu", "value": "true"}], taint)  # Equal compares the (empty) value
    assert not kobs.tolerates([], taint)


def test_none_mode_has_neither_stack():
    run = run_config(dev_config(observability={"mode": "none"}))
    assert _addon(run, obs.ADDON_NAME) is None and not run.by_type(DASHBOARD) and not _container_insights_groups(run)
    charts = {r.inputs["chart"] for r in run.by_type(RELEASE)}
    assert not charts & {versions.DCGM_EXPORTER_CHART, versions.KUBE_PROMETHEUS_STACK_CHART}


# --- training metric lines ------------------------------------------------------------------------


@pytest.mark.slow
def test_training_programs_metric_lines_parse_and_carry_job_and_node_rank(tmp_path, capsys):
    from tools.emulate import emulate, load_job

    job = load_job("dev", "ddp", str(tmp_path))
    result = emulate(job, fail_node=1, fail_at_step=5, timeout_s=300, quiet=False)
    assert result["status"] == "Complete" and result["restarts"] == 1
    records = []
    for line in capsys.readouterr().out.splitlines():
        m = re.match(r"^\[(?:attempt \d+ )?node (\d+)(?: ranks? [\d-]+)?\] (.*)$", line)
        if m and (rec := trainlib.parse_metric_line(m.group(2))):
            assert rec["node_rank"] == int(m.group(1))  # each node labels its own lines
            records.append(rec)
    assert records and {r["job"] for r in records} == {"ddp-mnist"}  # the TrainJob's TRAINING_JOB_NAME
    assert {r["node_rank"] for r in records} == {0, 1}
    starts = [r for r in records if r[trainlib.METRIC_KEY] == "start" and r["node_rank"] == 0]
    assert len(starts) == 2 and starts[1]["resumed_from_step"] is not None  # one per attempt: the restart shows
    steps = [r for r in records if r[trainlib.METRIC_KEY] == "step"]
    for r in steps:
        assert {"loss", "samples_per_s", "step_time_s", "memory_gib", "step", "time"} <= set(r) and r["memory_gib"] > 0
    assert any(r[trainlib.METRIC_KEY] == "result" for r in records)


def test_metric_lines_are_strict_json_with_labels(monkeypatch):
    line = trainlib.metric_line("step", job="fsdp-t5", node=3, rank=24, loss=float("nan"), tokens_per_s=1.5)
    rec = json.loads(line)  # strict: no NaN
    assert rec["loss"] is None and rec["job"] == "fsdp-t5" and rec["node_rank"] == 3 and rec["rank"] == 24
    assert trainlib.parse_metric_line(line) == rec and trainlib.parse_metric_line("epoch 1 step 2") is None
    monkeypatch.delenv(trainlib.JOB_NAME_ENV, raising=False)
    monkeypatch.setenv("PET_MASTER_ADDR", "my-job-node-0-0.my-job")
    assert trainlib.job_name() == "my-job"  # the address the Trainer gives every node
    monkeypatch.setenv(trainlib.JOB_NAME_ENV, "set-by-trainjob")
    assert trainlib.job_name() == "set-by-trainjob"


def test_trainjobs_set_the_job_name_env_the_programs_read():
    assert tj.JOB_NAME_ENV == trainlib.JOB_NAME_ENV
    for job in (o for o in objects(run_stack("dev")).values() if o["kind"] == "TrainJob"):
        env = {e["name"]: e.get("value") for e in job["spec"]["trainer"]["env"]}
        assert env[tj.JOB_NAME_ENV] == job["metadata"]["name"]


# --- lifecycle: deadline and cleanup --------------------------------------------------------------


def test_active_deadline_is_a_trainjob_field_on_v2_3_and_refused_on_v2_1(need_schemas):
    run = run_config(dev_config(trainjobs={"fsdp": {"activeDeadlineSeconds": 86400}}))
    fsdp, ddp = find(run, "TrainJob", "fsdp-t5"), find(run, "TrainJob", "ddp-mnist")
    assert fsdp["spec"]["activeDeadlineSeconds"] == 86400 and "activeDeadlineSeconds" not in ddp["spec"]
    assert v.validate(fsdp, "v2.3.0") == []
    new, old = (v.raw_crd_schema("trainer.kubeflow.org/v1alpha1", "TrainJob", ver) for ver in ("v2.3.0", "v2.1.0"))
    assert new is not None and old is not None
    assert new["properties"]["spec"]["properties"]["activeDeadlineSeconds"]["minimum"] == 1
    assert "activeDeadlineSeconds" not in old["properties"]["spec"]["properties"]
    raw = {"trainer": {"version": "v2.1.0"}, "trainjobs": {"ddp": {"enabled": True, "activeDeadlineSeconds": 3600}}}
    with pytest.raises(ConfigError) as err:
        load_settings(raw, stack="dev", region="us-west-2")
    assert err.value.key == "trainjobs.ddp.activeDeadlineSeconds" and "docs/runbook.md" in str(err.value)


def _tj(name, *, cond=None, at="2026-11-01T00:00:00Z", label=None, ns="vision"):
    meta = {"name": name, "namespace": ns, "uid": f"uid-{name}", "labels": {tj.JOB_LABEL: label} if label else {}}
    status = {"conditions": [{"type": cond, "status": "True", "lastTransitionTime": at}]} if cond else {}
    return {"metadata": meta, "status": status}


def test_cleanup_selects_finished_jobs_past_retention_and_never_the_stacks_own():
    now = tc.finished_at(_tj("x", cond="Complete", at="2026-11-08T00:00:00Z"))
    assert now is not None
    jobs = [
        _tj("done-old", cond="Complete"), _tj("failed-old", cond="Failed"), _tj("done-new", cond="Complete", at="2026-11-07T12:00:00Z"),
        _tj("running"), _tj("stack-own", cond="Complete", label="ddp", ns="training"), _tj("trainctl", cond="Complete", label="trainctl"),
        _tj("team-labelled-ddp", cond="Complete", label="ddp"),  # a team's job with a stack label is still cleaned
        {"metadata": {"name": "suspended", "namespace": "vision", "uid": "u"}, "status": {"conditions": [{"type": "Suspended", "status": "True", "lastTransitionTime": "2026-10-01T00:00:00Z"}]}},
        {"metadata": {"name": "complete-false", "namespace": "vision", "uid": "u"}, "status": {"conditions": [{"type": "Complete", "status": "False", "lastTransitionTime": "2026-10-01T00:00:00Z"}]}},
    ]
    keep = sorted({w.kind for w in tj.WORKLOADS.values()})
    retention = tc.parse_duration("168h")
    assert retention == 7 * 24 * 3600
    names = [j["metadata"]["name"] for j in tc.expired(jobs, now=now, retention_s=retention, keep_kinds=keep, job_label=tj.JOB_LABEL, keep_namespace="training")]
    assert names == ["done-old", "failed-old", "trainctl", "team-labelled-ddp"]
    assert tc.parse_duration("1h30m") == 5400 and tc.parse_duration("Never") is None
    with pytest.raises(ValueError):
        tc.parse_duration("7d")


def test_a_jobs_own_ttl_is_honoured_up_to_the_stacks_maximum():
    now = tc.finished_at(_tj("x", cond="Complete", at="2026-11-08T00:00:00Z"))
    assert now is not None

    def asking(name: str, ttl: str, at: str = "2026-11-07T23:00:00Z") -> dict:  # finished an hour before now
        job = _tj(name, cond="Complete", at=at)
        job["metadata"]["annotations"] = {tj.TTL_ANNOTATION: ttl}
        return job

    jobs = [asking("short", "1800"), asking("long", "7200"), asking("days-ago-long", "864000", at="2026-11-01T00:00:00Z"), asking("junk", "2h"), asking("neg", "-5"),
            _tj("plain-recent", cond="Complete", at="2026-11-07T23:00:00Z"), _tj("plain-old", cond="Complete")]

    def names(**kw) -> list[str]:
        return [j["metadata"]["name"] for j in tc.expired(jobs, now=now, keep_kinds=[], job_label=tj.JOB_LABEL, keep_namespace="training", ttl_annotation=tj.TTL_ANNOTATION, **kw)]

    # the stack keeps jobs a week, at most 30 days: a job asking for 30 min goes after 30 min, one asking 10 days after 10 days
    assert names(retention_s=7 * 86400, max_s=30 * 86400) == ["short", "plain-old"]  # junk and -5 are no number of seconds: the stack's retention
    # a maximum of 3 days cuts the 10 days one asked for
    assert names(retention_s=7 * 86400, max_s=3 * 86400) == ["short", "days-ago-long", "plain-old"]
    # Never by default: only the jobs that ask are deleted
    assert names(retention_s=None, max_s=None) == ["short"]
    assert tc.retention_of(asking("a", "100"), retention_s=None, max_s=50, ttl_annotation=tj.TTL_ANNOTATION) == 50


def test_cleanup_deletes_by_uid_and_skips_jobs_already_gone():
    import urllib.error

    class FakeApi:
        def __init__(self):
            self.deleted = []
            self.selectors = []

        def list_trainjobs(self, label_selector):
            self.selectors.append(label_selector)
            return [_tj("a", cond="Complete"), _tj("b", cond="Failed")]

        def delete_trainjob(self, namespace, name, uid):
            if name == "b":
                raise urllib.error.HTTPError("u", 409, "precondition failed: uid", None, None)  # type: ignore[arg-type]  # re-created under the same name
            self.deleted.append((namespace, name, uid))

    api = FakeApi()
    out = tc.run(api, now=tc.finished_at(_tj("x", cond="Complete", at="2026-12-01T00:00:00Z")), retention_s=3600, keep_kinds=["ddp"], job_label=tj.JOB_LABEL, keep_namespace="training")  # type: ignore[arg-type]
    assert out == ["vision/a"] and api.deleted == [("vision", "a", "uid-a")] and api.selectors == [""]


def test_cleanup_cronjob_is_least_privilege_and_configured_from_settings(need_schemas):
    run = run_stack("dev")
    objs = objects(run)
    cron = find(run, "CronJob", kobs.CLEANUP)
    role = find(run, "ClusterRole", kobs.CLEANUP)
    assert role["rules"] == [{"apiGroups": ["trainer.kubeflow.org"], "resources": ["trainjobs"], "verbs": ["list", "delete"]}]
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    c = pod["containers"][0]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env == {"RETENTION": "168h", "RETENTION_MAX": "720h", "TTL_ANNOTATION": tj.TTL_ANNOTATION, "KEEP_JOB_KINDS": "ddp,fsdp,nccl-check,tf", "JOB_LABEL": tj.JOB_LABEL, "KEEP_NAMESPACE": "training"}
    assert cron["spec"]["schedule"] == "*/10 * * * *" and cron["spec"]["concurrencyPolicy"] == "Forbid"
    assert c["image"] == versions.TRAINJOB_CLEANUP_IMAGE and pod["securityContext"]["runAsNonRoot"] is True and c["securityContext"]["readOnlyRootFilesystem"] is True
    cm = next(o for o in objs.values() if o["kind"] == "ConfigMap" and o["metadata"]["name"] == pod["volumes"][0]["configMap"]["name"])
    assert cm["data"]["trainjob_cleanup.py"] == kobs.CLEANUP_SCRIPT.read_text()
    for obj in objs.values():
        if obj["metadata"].get("namespace") == kobs.OPS_NAMESPACE or obj["metadata"]["name"] in (kobs.CLEANUP, kobs.OPS_NAMESPACE):
            assert v.validate(obj) == [], obj["metadata"]["name"]
    # Never keeps the jobs that ask for nothing; one that asks for a TTL is still deleted (the CronJob stays)
    never = run_config(dev_config(trainjobs={"finishedJobRetention": "Never"}))
    env = {e["name"]: e["value"] for e in find(never, "CronJob", kobs.CLEANUP)["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["RETENTION"] == "Never" and env["RETENTION_MAX"] == "Never"  # unset: no shorter than the default


# --- smoke check ----------------------------------------------------------------------------------


def test_smoke_check_job_runs_on_one_gpu_of_the_gpu_pool_and_pulumi_waits_for_it():
    run = run_stack("dev")
    job = find(run, "Job", kobs.SMOKE_CHECK)
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"][g.POOL_LABEL] == g.GPU_POOL and pod["nodeSelector"]["node.kubernetes.io/instance-type"] == "g5.xlarge"  # fewest GPUs in the pool
    assert kobs.tolerates(pod["tolerations"], g.GPU_TAINT) and pod["restartPolicy"] == "Never"
    c = pod["containers"][0]
    # the training image's CUDA/PyTorch base, as the stack's ECR copy of it (infra/registry.py ImageMirror)
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1 and c["image"].startswith("123456789012.dkr.ecr.us-west-2.amazonaws.com/training-dev-mirror/docker.io/" + versions.WORKLOAD_BASE_IMAGE + "@sha256:")
    assert c["command"][-1].startswith("nvidia-smi && exec python3 ")
    assert job["spec"]["backoffLimit"] <= 1 and "ttlSecondsAfterFinished" not in job["spec"]  # Pulumi keeps tracking the Job it waited for
    assert v.validate(job) == []
    reg = next(r for r in run.by_type("kubernetes:batch/v1:Job") if r.inputs["metadata"]["name"] == kobs.SMOKE_CHECK)
    assert "pulumi.com/skipAwait" not in (reg.inputs["metadata"].get("annotations") or {})  # pulumi-kubernetes waits for Complete
    pools = {r.urn for r in run.registrations if r.type.endswith(":NodePool")}
    plugin = next(r.urn for r in run.by_type(RELEASE) if r.inputs["chart"] == versions.NVIDIA_DEVICE_PLUGIN_CHART)
    assert pools | {plugin} <= set(reg.depends_on)
    assert reg.replace_on_changes == ["spec"]
    off = run_config(dev_config(smokeChecks={"enabled": False}))
    assert not [o for o in objects(off).values() if o["kind"] == "Job" and o["metadata"]["name"] == kobs.SMOKE_CHECK]


def test_smoke_check_script_fails_without_a_gpu():
    p = subprocess.run([sys.executable, str(kobs.SMOKE_CHECK_SCRIPT)], capture_output=True, text=True, timeout=120, env={"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"})
    assert p.returncode == 1
    result = json.loads(p.stdout)["gpu_smoke_check"]
    assert result["ok"] is False and "no CUDA device" in result["error"]


# --- runbook --------------------------------------------------------------------------------------

RUNBOOK = PROJECT / "docs" / "runbook.md"
# Resource names kubectl accepts for the kinds the runbook names: built-in kinds, and the CRDs the
# platform installs (their names.plural / singular, read from the CRD files where present).
BUILTIN_RESOURCES = {"pods", "nodes", "events", "jobs", "cronjobs", "resourcequotas", "configmaps", "namespaces", "daemonsets", "deployments"}
CRD_FILES = {
    "trainjobs": "kubeflow-trainer/v2.3.0/trainer.kubeflow.org_trainjobs.yaml", "jobsets": "jobset/v0.12.0/jobset.x-k8s.io_jobsets.yaml",
    "nodepools": "karpenter/v1.14.1/karpenter.sh_nodepools.yaml", "nodeclaims": "karpenter/v1.14.1/karpenter.sh_nodeclaims.yaml",
    "workloads": "kueue/v0.19.2/kueue.x-k8s.io_workloads.yaml",
}
# Labels the runbook selects on and who sets them: JobSet on every pod of a JobSet (the Kubeflow SDK
# finds a TrainJob's pods by it: kubeflow/sdk constants.py JOBSET_NAME_LABEL), the Karpenter and NVIDIA
# device plugin charts (app.kubernetes.io/name), Kueue on each Workload (the owning job's uid:
# kueue v0.19.2 pkg/controller/constants JobUIDLabel), and the platform's own node labels.
KNOWN_LABELS = {"jobset.sigs.k8s.io/jobset-name", "app.kubernetes.io/name", "kueue.x-k8s.io/job-uid", g.POOL_LABEL, g.EFA_LABEL}
# Namespaces the commands may name: the platform's (rendered), the system ones, and those charts create.
OTHER_NAMESPACES = {"kube-system", kobs.MONITORING_NAMESPACE}


def runbook_commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", RUNBOOK.read_text(), re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip() and not line.strip().startswith("#")]


def _check_kubectl(args: list[str], namespaces: set[str]) -> None:
    verb = args[1]
    assert verb in {"get", "describe", "logs", "patch", "delete", "create"}, verb
    flags = {a.split("=", 1)[0] for a in args if a.startswith("-") and not a.lstrip("-").isdigit()}
    # no --previous: trainer pods are replaced, never restarted in place (restartPolicy Never, backoffLimit 0)
    assert flags <= {"-n", "-l", "-o", "-L", "-c", "-p", "--prefix", "--tail", "--field-selector", "--type", "--from"}, flags
    if "-n" in args:
        ns = args[args.index("-n") + 1]
        assert ns == "<ns>" or ns in namespaces, ns
    if "-l" in args:
        for term in args[args.index("-l") + 1].split(","):
            assert term.split("=")[0] in KNOWN_LABELS, term
    if verb in ("get", "describe", "patch", "delete") and not args[2].startswith("-"):
        resource = args[2].split("/")[0]
        assert resource in BUILTIN_RESOURCES | set(CRD_FILES), resource
    if verb == "create":
        assert args[2] == "job" and "--from=cronjob/" + kobs.CLEANUP in args
    if verb == "logs" and "job/" in " ".join(args):
        assert f"job/{kobs.SMOKE_CHECK}" in args


def test_runbook_commands_are_ones_the_platform_supports(need_schemas):
    dev = objects(run_stack("dev"))
    namespaces = {o["metadata"]["name"] for o in dev.values() if o["kind"] == "Namespace"} | {o["metadata"].get("namespace") for o in dev.values()} - {None}
    namespaces |= OTHER_NAMESPACES
    for plural, rel in CRD_FILES.items():  # the CRDs name themselves so
        names = yaml.safe_load((v.schemas_dir() / rel).read_text())["spec"]["names"]
        assert names["plural"] == plural
    makefile = (PROJECT / "Makefile").read_text()
    commands = runbook_commands()
    assert len(commands) >= 20
    seen = set()
    for command in commands:
        first = command.split(" | ")[0]  # a pipe's filter (grep) is the shell's
        args = shlex.split(first)
        seen.add(args[0])
        if args[0] == "kubectl":
            _check_kubectl(args, namespaces)
        elif args[0] == "make":
            assert re.search(rf"^{args[1]}:", makefile, re.M), args[1]
        elif args[0] == "aws":
            assert (args[1], args[2]) in {("logs", "tail"), ("cloudwatch", "get-dashboard"), ("eks", "describe-addon-versions")}, args[:3]
            if args[1] == "logs":
                assert args[3] == obs.log_group_name("<cluster>", "application")
            if args[1] == "cloudwatch":
                assert args[args.index("--dashboard-name") + 1] == obs.dashboard_name("training-dev").replace("training-dev", "<cluster>")
            if args[1] == "eks":
                assert args[args.index("--addon-name") + 1] == obs.ADDON_NAME
        elif args[0] == "pulumi":
            assert args[1] in {"destroy", "import", "up", "preview"}
            if args[1] == "import":  # under its parent component, with the logical name the stack gives it
                run = run_stack("dev")
                assert args[2] == "--parent"
                parent, _ = args[3].split("=", 1)
                (group,) = [r for r in run.by_type(LOG_GROUP) if r.name == args[5]]
                assert args[4] == LOG_GROUP and group.parent.endswith(f"::{parent}"), (group.parent, parent)
        else:
            pytest.fail(f"unknown command in the runbook: {command}")
    assert {"kubectl", "aws", "make", "pulumi"} <= seen
    for title in ("Where logs and metrics are", "A job stays pending", "A job keeps restarting", "A node is not initialised", "EFA is not used", "Upgrade and destroy order"):
        assert f"## {title}" in RUNBOOK.read_text()
    for cause in ("Queue", "Quota", "Karpenter limits", "No capacity", "Taint", "EFA zone"):
        assert f"**{cause}" in RUNBOOK.read_text()


def test_runbook_paths_are_the_project_paths():
    text = RUNBOOK.read_text()
    for link in re.findall(r"\]\(([^)#]+)\)", text):
        assert (RUNBOOK.parent / link).exists(), link
    assert pathlib.Path(PROJECT / "docs" / "trainer-upgrade.md").exists()
