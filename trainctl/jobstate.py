"""A TrainJob's state as trainctl and the portal report it, and the cluster operations both run
(submit, delete, diagnosis evidence, progress): one copy, used by ``trainctl`` (cli.py) and the
portal (trainctl/portal). Pure functions read objects as the API server serves them; the
operations take a :class:`~trainctl.kube.KubeApi` already bound to the caller's identity."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from k8s.builders.tenants import QUEUE_LABEL
from trainctl import diagnose, objects, progress
from trainctl.code import CodeBundle
from trainctl.kube import ClusterError, KubeApi

RESTART_LABEL = "jobset.sigs.k8s.io/restart-attempt"
"""The JobSet restart attempt a pod belongs to (kubernetes-sigs/jobset pkg/constants RestartsKey)."""
KUEUE_STARTED = "Started"
"""Kueue's event on a job it admitted, "Admitted by clusterQueue <name>" (kubernetes-sigs/kueue
v0.19.2 pkg/controller/jobframework/reconciler.go startJob)."""
KUEUE_PENDING = "Pending"
"""Kueue's event on a Workload it could not admit, with the reason (kueue v0.19.2
pkg/scheduler/scheduler.go requeueAndUpdate). A TrainJob's Workload is named
``trainjob-<job name>-<hash>`` (kueue pkg/controller/jobframework/workload_names.go)."""


def _conditions(tj: dict) -> dict[str, dict]:
    return {c["type"]: c for c in (tj.get("status") or {}).get("conditions") or []}


def phase(tj: dict) -> str:
    """Complete, Failed, Queued (suspended with a Kueue queue label), Suspended, Running (a node
    Job has active pods) or Created."""
    conds = _conditions(tj)
    for final in ("Complete", "Failed"):
        if conds.get(final, {}).get("status") == "True":
            return final
    if conds.get("Suspended", {}).get("status") == "True":
        return "Queued" if QUEUE_LABEL in (tj["metadata"].get("labels") or {}) else "Suspended"
    jobs = (tj.get("status") or {}).get("jobsStatus") or []
    if any(j.get("active", 0) or j.get("ready", 0) for j in jobs):
        return "Running"
    return "Created"


def _latest(events: list[dict], reason: str | None = None) -> dict | None:
    picked = [e for e in events if reason is None or e.get("reason") == reason]
    return max(picked, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or e.get("firstTimestamp") or "", default=None)


def admission(tj: dict, job_events: list[dict], workload_events: list[dict]) -> str:
    """Admitted or queued and why, from Kueue's events (the job's "Started", its Workload's "Pending")."""
    queue = (tj["metadata"].get("labels") or {}).get(QUEUE_LABEL)
    if not queue:
        return "not queued (no Kueue queue label)"
    started = _latest(job_events, KUEUE_STARTED)
    if phase(tj) != "Queued" and started:
        return f"admitted: {started.get('message')}"
    pending = _latest(workload_events, KUEUE_PENDING)
    if phase(tj) == "Queued":
        return f"queued in {queue}: {pending.get('message')}" if pending else f"queued in {queue}: waiting for Kueue to consider it"
    return f"queue {queue}"


def restarts(pods: list[dict]) -> int:
    return max((int((p["metadata"].get("labels") or {}).get(RESTART_LABEL, 0)) for p in pods), default=0)


def times(tj: dict, pods: list[dict]) -> tuple[str | None, str | None]:
    """(started: the first pod start, finished: when Complete or Failed became true)."""
    starts = sorted(s for p in pods if (s := (p.get("status") or {}).get("startTime")))
    conds = _conditions(tj)
    finished = next((conds[t].get("lastTransitionTime") for t in ("Complete", "Failed") if conds.get(t, {}).get("status") == "True"), None)
    return (starts[0] if starts else None), finished


def last_failure(tj: dict, pods: list[dict], job_events: list[dict]) -> str | None:
    """The Failed condition's reason and message, else the latest container that ended with a
    non-zero exit code, else the latest Warning event on the job."""
    failed = _conditions(tj).get("Failed")
    if failed and failed.get("status") == "True":
        return f"{failed.get('reason')}: {failed.get('message')}"
    ended = []
    for p in pods:
        for cs in (p.get("status") or {}).get("containerStatuses") or []:
            for state in (cs.get("state") or {}, cs.get("lastState") or {}):
                term = state.get("terminated")
                if term and term.get("exitCode", 0) != 0:
                    ended.append((term.get("finishedAt") or "", f"pod {p['metadata']['name']} container {cs['name']} exited {term['exitCode']} ({term.get('reason') or 'Error'})"))
    if ended:
        return max(ended)[1]
    warning = _latest([e for e in job_events if e.get("type") == "Warning"])
    return f"{warning.get('reason')}: {warning.get('message')}" if warning else None


def status_report(tj: dict, pods: list[dict], job_events: list[dict], workload_events: list[dict], steps: list[Any]) -> dict:
    started, finished = times(tj, pods)
    trainer = tj["spec"].get("trainer") or {}
    return {
        "name": tj["metadata"]["name"],
        "namespace": tj["metadata"].get("namespace"),
        "phase": phase(tj),
        "admission": admission(tj, job_events, workload_events),
        "runtime": tj["spec"]["runtimeRef"]["name"],
        "nodes": trainer.get("numNodes"),
        "restarts": restarts(pods),
        "created": tj["metadata"].get("creationTimestamp"),
        "started": started,
        "finished": finished,
        "lastFailure": last_failure(tj, pods, job_events),
        "steps": [{"name": s.name, "status": s.status, "pod": s.pod_name} for s in steps],
    }


def _restarted(cs: dict) -> bool:
    return bool((cs.get("lastState") or {}).get("terminated"))


def progress_of(cluster: KubeApi, trainjob: dict, pods: list[dict] | None = None) -> dict | None:
    """What the Trainer holds for the job (``status.trainerStatus``), else the newest step event in
    the log of its first node (JobSet names its pods ``<job>-node-0-0-<suffix>``)."""
    found = progress.of_trainjob(trainjob)
    if found:
        return found
    name = trainjob["metadata"]["name"]
    try:
        pods = cluster.pods(name) if pods is None else pods
    except ClusterError:  # progress is a nicety: a listing never fails for it
        return None
    node0 = next((p["metadata"]["name"] for p in pods if p["metadata"]["name"].startswith(f"{name}-node-0-0")), None)
    return progress.of_lines(cluster.log_tail(node0, lines=200)) if node0 else None


def job_events(cluster: KubeApi, name: str) -> tuple[list[dict], list[dict], list[dict]]:
    """(the TrainJob's events, its pods' events, its Kueue Workloads' events)."""
    pods = [e for e in cluster.events("Pod") if e["involvedObject"]["name"].startswith(f"{name}-")]
    workloads = [e for e in cluster.events("Workload") if e["involvedObject"]["name"].startswith(f"trainjob-{name}-")]
    return cluster.events("TrainJob", name), pods, workloads


def evidence(cluster: KubeApi, name: str) -> diagnose.Evidence:
    """Everything :func:`trainctl.diagnose.diagnose` reads about one job, as the caller may read it."""
    tj = cluster.get_trainjob(name)
    pods = cluster.pods(name)
    own, of_pods, of_workloads = job_events(cluster, name)
    nodes = cluster.nodes({p["spec"]["nodeName"] for p in pods if p.get("spec", {}).get("nodeName")})
    failed_pods = [p["metadata"]["name"] for p in pods if (p.get("status") or {}).get("phase") == "Failed" or any(_restarted(cs) for cs in (p.get("status") or {}).get("containerStatuses") or [])]
    return diagnose.Evidence(trainjob=tj, pods=pods, workloads=cluster.workloads(name), events=own + of_pods + of_workloads, nodes=nodes, log_lines={p: cluster.log_tail(p) for p in failed_pods[:4]})


def submit(cluster: KubeApi, req: objects.Request, bundle: CodeBundle, *, instance_type_given: bool, trainer_version: str | None = None, runtime_name: str | None = None) -> dict[str, Any]:
    """Create the code ConfigMap and the TrainJob of a checked request as the caller (the cluster's
    Trainer version, current runtime and published facts shape it, as :func:`objects.with_facts`);
    nothing is left behind when the TrainJob is refused. Raises :class:`objects.SubmitError` for bad
    input, :class:`ClusterError` for what the API server refused."""
    for group, resource in (("trainer.kubeflow.org", "trainjobs"), ("", "configmaps")):
        allowed, reason = cluster.can("create", group, resource)
        if not allowed:
            raise ClusterError(f"you may not create {resource} in namespace {cluster.namespace}" + (f" ({reason})" if reason else "") + ": ask the platform team for access to it")
    version = trainer_version or cluster.served_trainer_version()
    if runtime_name or req.grace_seconds is None:
        runtime_name = runtime_name or cluster.current_runtime(objects.RUNTIMES[req.runtime])
    else:  # the runtime's variant with that grace period, if the platform offers one
        runtime_name = objects.runtime_for(req, cluster.runtimes_of(objects.RUNTIMES[req.runtime]))
    req = replace(req, trainer_version=version, runtime_name=runtime_name)
    req = objects.with_facts(req, cluster.platform_facts(), instance_type_given=instance_type_given)
    objects.check(req)
    cm, tj = objects.build(req, bundle)
    created_cm = cluster.create_configmap(cm)
    try:
        created = cluster.create_trainjob(tj)
    except ClusterError:
        if created_cm:  # leave nothing behind
            cluster.delete_configmap(cm["metadata"]["name"])
        raise
    return {
        "trainjob": tj["metadata"]["name"], "namespace": cluster.namespace, "configmap": cm["metadata"]["name"], "configmapCreated": created_cm, "runtime": runtime_name,
        "trainerVersion": version, "nodes": req.nodes, "created": (created or {}).get("metadata", {}).get("creationTimestamp"),
    }


def delete(cluster: KubeApi, name: str, *, direct: bool = False) -> dict[str, Any]:
    """Delete a TrainJob and its code ConfigMap unless another job of the namespace mounts it.
    ``direct``: through the API (every call with the client's own headers) instead of the SDK."""
    tj = cluster.get_trainjob(name)
    cm = objects.code_configmap_of(tj)
    if direct:
        cluster.delete_trainjob_direct(name)
    else:
        cluster.delete_trainjob(name)
    result: dict[str, Any] = {"trainjob": name, "deleted": True, "configmap": cm, "configmapDeleted": False}
    if cm:
        users = sorted(t["metadata"]["name"] for t in cluster.list_trainjobs() if t["metadata"]["name"] != name and objects.code_configmap_of(t) == cm)
        if users:
            result["configmapKeptFor"] = users
        else:
            result["configmapDeleted"] = cluster.delete_configmap(cm)
    return result
