"""trainctl and the portal when the API server refuses a read (HTTP 403), and what they say of a job
Kueue holds: the Workload's reason and message, its priority and its place in the LocalQueue (Kueue's
visibility API, else an estimate that says so). Against the fake API server of tests/test_trainctl.py,
answering as the API server does (its 403 Status message: k8s.io/apiserver v0.34.4
pkg/endpoints/handlers/responsewriters/errors.go forbiddenMessage)."""

from __future__ import annotations

import json

from tests.test_trainctl import NS, TRAINER, _serve_jobs, _status, api, run  # noqa: F401  (api: the fixture)
from trainctl import diagnose, jobstate
from trainctl.kube import KubeApi, NotAllowed, not_allowed

KUEUE = f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{NS}/workloads"
PENDING = f"/apis/visibility.kueue.x-k8s.io/v1beta2/namespaces/{NS}/localqueues/default/pendingworkloads"
EMPTY_PODS = {"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": []}
EMPTY_EVENTS = {"apiVersion": "v1", "kind": "EventList", "metadata": {"resourceVersion": "1"}, "items": []}
QUOTA_MESSAGE = ("couldn't assign flavors to pod set node: insufficient quota for nvidia.com/gpu in flavor gpu-pool, previously considered podsets requests (0) "
                 "+ current podset request (36) > maximum capacity (32)")


def forbidden(verb: str, resource: str, group: str, ns: str = NS) -> dict:
    return _status(403, "Forbidden", f'{resource.split("/")[0]} is forbidden: User "arn:aws:iam::123456789012:role/ml" cannot {verb} resource "{resource}" in API group "{group}" in the namespace "{ns}"')


def workload(job: str, *, created: str, priority: int = 100, cls: str = "normal", reserved: bool = False, message: str = QUOTA_MESSAGE) -> dict:
    cond = {"type": "QuotaReserved", "status": "True" if reserved else "False", "reason": "QuotaReserved" if reserved else "Pending", "message": "" if reserved else message,
            "lastTransitionTime": created}
    conds = [cond] + ([{"type": "Admitted", "status": "True", "reason": "Admitted", "message": "", "lastTransitionTime": created}] if reserved else [])
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "metadata": {"name": f"trainjob-{job}-0a1b2", "namespace": NS, "creationTimestamp": created, "uid": f"uid-{job}",
                     "ownerReferences": [{"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": job, "uid": f"tj-{job}", "controller": True}]},
        "spec": {"queueName": "default", "priority": priority, "priorityClassRef": {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": cls}, "podSets": []},
        "status": {"conditions": conds, **({"admission": {"clusterQueue": f"team-{NS}", "podSetAssignments": []}} if reserved else {})},
    }


def _queued(api) -> None:  # noqa: F811  (the fixture's name)
    _serve_jobs(api)
    api.on("GET", f"/api/v1/namespaces/{NS}/pods", EMPTY_PODS)
    api.on("GET", f"/api/v1/namespaces/{NS}/events", EMPTY_EVENTS)


def test_a_refused_read_names_verb_resource_and_namespace():
    from kubernetes.client.exceptions import ApiException

    err = ApiException(status=403, reason="Forbidden")
    err.body = json.dumps(forbidden("list", "workloads", "kueue.x-k8s.io"))
    found = not_allowed(err)
    assert isinstance(found, NotAllowed) and str(found) == f"not allowed: list workloads in {NS} (ask the platform team)"
    cluster_wide = ApiException(status=403, reason="Forbidden")
    cluster_wide.body = json.dumps(_status(403, "Forbidden", 'nodes "n1" is forbidden: User "u" cannot get resource "nodes" in API group "" at the cluster scope'))
    assert str(not_allowed(cluster_wide)) == "not allowed: get nodes at the cluster scope (ask the platform team)"
    other = ApiException(status=404, reason="Not Found")
    assert not_allowed(other) is None


def test_status_says_not_allowed_where_workloads_are_refused_never_none(api, capsys):  # noqa: F811
    _queued(api)
    api.on("GET", KUEUE, forbidden("list", "workloads", "kueue.x-k8s.io"), 403)
    rc, out, err = run(capsys, "status", "bert-9f8e7d", "-o", "json")
    assert rc == 0, err
    report = json.loads(out)
    line = f"not allowed: list workloads in {NS} (ask the platform team)"
    assert report["admission"] == f"queued in default: unknown: {line}"
    assert report["notAllowed"] == [line]
    rc, out, _ = run(capsys, "status", "bert-9f8e7d")
    assert "not allowed: list workloads" in out and "ask the platform team" in out


def test_status_of_pods_and_events_refused_still_reports_the_rest(api, capsys):  # noqa: F811
    _serve_jobs(api)
    api.on("GET", f"/api/v1/namespaces/{NS}/pods", forbidden("list", "pods", ""), 403)
    api.on("GET", f"/api/v1/namespaces/{NS}/events", forbidden("list", "events", ""), 403)
    rc, out, err = run(capsys, "status", "resnet-a1b2c3", "-o", "json")
    assert rc == 0, err
    report = json.loads(out)
    assert report["phase"] == "Running" and report["restarts"] == 0
    assert f"not allowed: list pods in {NS} (ask the platform team)" in report["notAllowed"]
    assert f"not allowed: list events in {NS} (ask the platform team)" in report["notAllowed"]


def test_a_refused_trainjob_is_one_line_exit_1(api, capsys):  # noqa: F811
    api.on("GET", f"{TRAINER}/namespaces/{NS}/trainjobs/secret-job", forbidden("get", "trainjobs", "trainer.kubeflow.org"), 403)
    rc, out, err = run(capsys, "status", "secret-job")
    assert rc == 1 and out == "" and err == f"trainctl: error: not allowed: get trainjobs in {NS} (ask the platform team)\n"
    api.on("GET", f"{TRAINER}/namespaces/{NS}/trainjobs", forbidden("list", "trainjobs", "trainer.kubeflow.org"), 403)
    rc, out, err = run(capsys, "list")
    assert rc == 1 and err == f"trainctl: error: not allowed: list trainjobs in {NS} (ask the platform team)\n"


def test_status_of_a_queued_job_names_kueues_reason_priority_and_position(api, capsys):  # noqa: F811
    _queued(api)
    api.on("GET", KUEUE, {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadList", "metadata": {}, "items": [workload("bert-9f8e7d", created="2026-11-23T09:30:01Z")]})
    # Kueue's visibility API: two jobs ahead of it (positions count from 0)
    items = [{"metadata": {"name": f"trainjob-{j}-0a1b2", "namespace": NS, "ownerReferences": [{"kind": "TrainJob", "name": j, "apiVersion": "trainer.kubeflow.org/v1alpha1", "uid": "x"}]},
              "priority": p, "localQueueName": "default", "positionInLocalQueue": i, "positionInClusterQueue": i + 1} for i, (j, p) in enumerate([("urgent", 1000), ("older", 100), ("bert-9f8e7d", 100)])]
    api.on("GET", PENDING, {"kind": "PendingWorkloadsSummary", "apiVersion": "visibility.kueue.x-k8s.io/v1beta2", "metadata": {}, "items": items})
    rc, out, err = run(capsys, "status", "bert-9f8e7d", "-o", "json")
    assert rc == 0, err
    report = json.loads(out)
    assert report["admission"] == f"queued in default: Pending: {QUOTA_MESSAGE}"
    assert report["priority"] == "normal (100)"
    assert report["queuePosition"] == "3 in LocalQueue default, 4 in its ClusterQueue; ahead: urgent, older"
    assert "notAllowed" not in report
    rc, out, _ = run(capsys, "status", "bert-9f8e7d")
    flat = "".join(c for c in out if c not in " \n│┃")  # the table folds long values
    assert "maximumcapacity(32)" in flat and "3inLocalQueuedefault" in flat and "normal(100)" in flat


def test_position_is_estimated_and_says_why_when_the_visibility_api_is_refused_or_absent(api, capsys):  # noqa: F811
    _queued(api)
    mine = workload("bert-9f8e7d", created="2026-11-23T09:30:01Z")
    high = workload("urgent", created="2026-11-23T09:40:00Z", priority=1000, cls="high")
    admitted = workload("running", created="2026-11-23T08:00:00Z", reserved=True)
    api.on("GET", KUEUE, {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadList", "metadata": {}, "items": [mine, high, admitted]})
    api.on("GET", PENDING, forbidden("get", "localqueues/pendingworkloads", "visibility.kueue.x-k8s.io"), 403)
    rc, out, err = run(capsys, "status", "bert-9f8e7d", "-o", "json")
    assert rc == 0, err
    report = json.loads(out)
    refusal = f"not allowed: get localqueues/pendingworkloads in {NS} (ask the platform team)"
    # Kueue's order: higher priority first, then the older; the admitted one holds no place
    assert report["queuePosition"] == f"2 in LocalQueue default; ahead: urgent (estimated from the namespace's Workloads by Kueue's ordering ({refusal}))"
    assert report["notAllowed"] == [refusal]
    # not served at all (no APIService: 404): estimated, and nothing is said to be refused
    del api.routes[("GET", PENDING)]
    rc, out, _ = run(capsys, "status", "bert-9f8e7d", "-o", "json")
    report = json.loads(out)
    assert report["queuePosition"].endswith("(estimated from the namespace's Workloads by Kueue's ordering (the visibility API is not served))")
    assert "notAllowed" not in report


def test_diagnose_names_the_evidence_it_may_not_read(api, capsys):  # noqa: F811
    _serve_jobs(api)
    api.on("GET", f"/api/v1/namespaces/{NS}/pods", EMPTY_PODS)
    api.on("GET", f"/api/v1/namespaces/{NS}/events", forbidden("list", "events", ""), 403)
    api.on("GET", KUEUE, forbidden("list", "workloads", "kueue.x-k8s.io"), 403)
    rc, out, err = run(capsys, "diagnose", "bert-9f8e7d", "-o", "json")
    assert rc == 0, err
    findings = {f["cause"]: f for f in json.loads(out)}
    assert findings[diagnose.NOT_ALLOWED]["evidence"] == [f"not allowed: list events in {NS} (ask the platform team)", f"not allowed: list workloads in {NS} (ask the platform team)"]


def test_the_portal_status_uses_the_same_queue_report(api):  # noqa: F811
    """The portal's status (trainctl/portal/service.py) gives the reason, the priority, the position and what was refused, from jobstate."""
    from kubernetes import client

    from trainctl.portal.identity import Caller
    from trainctl.portal.service import Portal

    _queued(api)
    api.on("GET", KUEUE, {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadList", "metadata": {}, "items": [workload("bert-9f8e7d", created="2026-11-23T09:30:01Z")]})
    api.on("GET", PENDING, forbidden("get", "localqueues/pendingworkloads", "visibility.kueue.x-k8s.io"), 403)
    cfg = client.Configuration()
    cfg.host = api.url
    portal = Portal(cfg)
    caller = Caller(name="alice", namespace=NS, team="vision", headers={"Impersonate-User": ["portal:vision"]})
    out = portal.status(caller, NS, "bert-9f8e7d")
    assert out["status"] == "Queued" and out["message"] == f"queued in default: Pending: {QUOTA_MESSAGE}"
    assert out["priority"] == "normal (100)" and out["queue"]["position"] == 0 and out["queue"]["estimated"] is True
    assert out["not_allowed"] == [f"not allowed: get localqueues/pendingworkloads in {NS} (ask the platform team)"]
    # the queue endpoint's answer is the same estimate
    assert portal.queue_position(caller, NS, "bert-9f8e7d")["position"] == 0


def test_readable_records_a_refusal_or_raises_without_a_list():
    def refuse():
        raise NotAllowed("list", "jobsets", NS)

    refused: list[str] = []
    assert jobstate.readable(refused, refuse, default=[]) == [] and refused == [f"not allowed: list jobsets in {NS} (ask the platform team)"]
    try:
        jobstate.readable(None, refuse)
    except NotAllowed as err:
        assert err.verb == "list" and err.resource == "jobsets"
    else:
        raise AssertionError("a refusal without a list to record it must raise")


def test_a_kube_api_without_kueue_has_no_workloads_but_a_refusal_is_not_none(api):  # noqa: F811
    kube = KubeApi(namespace=NS, kubeconfig=None)
    assert kube.workloads("bert-9f8e7d") == []  # 404: the cluster serves no Workloads
    api.on("GET", KUEUE, forbidden("list", "workloads", "kueue.x-k8s.io"), 403)
    try:
        kube.workloads("bert-9f8e7d")
    except NotAllowed as err:
        assert str(err) == f"not allowed: list workloads in {NS} (ask the platform team)"
    else:
        raise AssertionError("a 403 must not read as no workloads")


def test_a_refusal_keeps_whom_the_api_server_refused():
    """The portal answers a 403 with the user the API server judged (its impersonated user), never a guess of its own."""
    from kubernetes.client.exceptions import ApiException

    err = ApiException(status=403, reason="Forbidden")
    err.body = json.dumps(_status(403, "Forbidden", 'trainjobs.trainer.kubeflow.org "x" is forbidden: User "portal:nlp" cannot get resource "trainjobs" in API group "trainer.kubeflow.org" in the namespace "vision"'))
    found = not_allowed(err)
    assert found is not None and found.user == "portal:nlp" and str(found) == "not allowed: get trainjobs in vision (ask the platform team)"


def test_the_estimate_orders_as_kueue_and_leaves_out_what_kueue_does_not_queue():
    """kueue v0.19.2 GetQueueOrderTimestamp: a Workload evicted for a pods-ready timeout (the
    platform requeues by eviction time) or an admission check is ordered by that eviction's time;
    an inactive Workload is not in Kueue's list, one in requeue backoff is (among the inadmissible)."""
    from trainctl import jobstate

    class Cluster:
        def __init__(self, items):
            self.items = items

        def pending_workloads(self, queue):
            return None  # not served

        def all_workloads(self, all_namespaces=False):
            return self.items

    older = workload("older", created="2026-11-23T09:00:00Z")
    newer = workload("newer", created="2026-11-23T09:10:00Z")
    timed_out = workload("timed-out", created="2026-11-23T08:00:00Z")  # created first, requeued later
    timed_out["status"]["conditions"].append({"type": "Evicted", "status": "True", "reason": "PodsReadyTimeout", "message": "", "lastTransitionTime": "2026-11-23T09:05:00Z"})
    preempted = workload("preempted", created="2026-11-23T08:30:00Z")  # another eviction keeps its creation time
    preempted["status"]["conditions"].append({"type": "Evicted", "status": "True", "reason": "Preempted", "message": "", "lastTransitionTime": "2026-11-23T09:30:00Z"})
    inactive = workload("inactive", created="2026-11-23T07:00:00Z")
    inactive["spec"]["active"] = False
    backing_off = workload("backing-off", created="2026-11-23T07:30:00Z")
    backing_off["status"]["requeueState"] = {"count": 1, "requeueAt": "2999-01-01T00:00:00Z"}
    requeue_false = workload("requeue-false", created="2026-11-23T07:40:00Z")
    requeue_false["status"]["conditions"].append({"type": "Requeued", "status": "False", "reason": "Backoff", "message": "", "lastTransitionTime": "2026-11-23T07:41:00Z"})
    past_backoff = workload("past-backoff", created="2026-11-23T07:50:00Z")
    past_backoff["status"]["requeueState"] = {"count": 1, "requeueAt": "2026-11-23T07:55:00Z"}
    queue = jobstate.pending_queue(Cluster([newer, timed_out, older, preempted, inactive, backing_off, requeue_false, past_backoff]))
    assert queue["estimated"] and [i["job"] for i in queue["items"]] == ["backing-off", "requeue-false", "past-backoff", "preempted", "older", "timed-out", "newer"]
