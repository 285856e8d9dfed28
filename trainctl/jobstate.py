"""A TrainJob's state as trainctl and the portal report it, and the cluster operations both run
(submit, delete, diagnosis evidence, progress): one copy, used by ``trainctl`` (cli.py) and the
portal (trainctl/portal). Pure functions read objects as the API server serves them; the
operations take a :class:`~trainctl.kube.KubeApi` already bound to the caller's identity."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from k8s.builders.tenants import LOCAL_QUEUE, QUEUE_LABEL
from trainctl import diagnose, objects, progress, usage
from trainctl.code import CodeBundle
from trainctl.kube import ClusterError, KubeApi, NotAllowed

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
                if term and term.get("exitCode", 0) != 0 and str(term.get("message") or "").startswith(diagnose.DEPS_CAUSE):
                    # the launcher's termination message: "dependencies failed to install: <pip's last error line>"
                    ended.append((term.get("finishedAt") or "", f"pod {p['metadata']['name']}: {str(term['message']).strip()}"))
                elif term and term.get("exitCode", 0) != 0:
                    ended.append((term.get("finishedAt") or "", f"pod {p['metadata']['name']} container {cs['name']} exited {term['exitCode']} ({term.get('reason') or 'Error'})"))
    if ended:
        return max(ended)[1]
    warning = _latest([e for e in job_events if e.get("type") == "Warning"])
    return f"{warning.get('reason')}: {warning.get('message')}" if warning else None


def status_report(tj: dict, pods: list[dict], job_events: list[dict], workload_events: list[dict], steps: list[Any], *, queue: dict | None = None, refused: list[str] | None = None) -> dict:
    """``queue``: :func:`queue_report`'s (Kueue's word from the job's Workload, its priority and
    position); ``refused``: the reads the API server refused (each a "not allowed: ..." line)."""
    started, finished = times(tj, pods)
    trainer = tj["spec"].get("trainer") or {}
    said = admission(tj, job_events, workload_events)
    if queue and queue.get("kueue"):  # the Workload's conditions say more than the events
        said = (f"queued in {queue['queue']}: " if phase(tj) == "Queued" else "") + queue["kueue"]
    extra = {k: v for k, v in {"priority": (queue or {}).get("priority"), "queuePosition": (queue or {}).get("position")}.items() if v is not None}
    return {
        "name": tj["metadata"]["name"],
        "namespace": tj["metadata"].get("namespace"),
        "phase": phase(tj),
        "admission": said,
        **extra,
        "runtime": tj["spec"]["runtimeRef"]["name"],
        "nodes": trainer.get("numNodes"),
        "restarts": restarts(pods),
        "created": tj["metadata"].get("creationTimestamp"),
        "started": started,
        "finished": finished,
        "lastFailure": last_failure(tj, pods, job_events),
        "steps": [{"name": s.name, "status": s.status, "pod": s.pod_name} for s in steps],
        **({"notAllowed": list(dict.fromkeys(refused))} if refused else {}),
    }


# --- Kueue: why a job waits, and where ---------------------------------------------------------


def readable(refused: list[str] | None, fn, *args: Any, default: Any = None) -> Any:
    """``fn(*args)``; where the API server refuses the read and ``refused`` is a list, the refusal's
    line is added to it and ``default`` returned (the rest of a report still shows)."""
    try:
        return fn(*args)
    except NotAllowed as err:
        if refused is None:
            raise
        refused.append(str(err))
        return default


def _wcond(w: dict, kind: str) -> dict | None:
    return next((c for c in (w.get("status") or {}).get("conditions") or [] if c.get("type") == kind), None)


def _true(w: dict, kind: str) -> bool:
    return (_wcond(w, kind) or {}).get("status") == "True"


def workload_of(workloads: list[dict], name: str) -> dict | None:
    """The TrainJob's current Workload (owned by it; the newest if a restart left an old one)."""
    mine = [w for w in workloads if usage.job_of(w) == name]
    return max(mine, key=lambda w: w["metadata"].get("creationTimestamp") or "", default=None)


def workload_state(w: dict) -> str:
    """Kueue's word on a job, from its Workload's conditions (kueue v0.19.2
    apis/kueue/v1beta2/workload_types.go: QuotaReserved, Admitted, Evicted, Finished; a
    QuotaReserved False carries the scheduler's reason and message, e.g. reason Pending "couldn't
    assign flavors to pod set node: insufficient quota for nvidia.com/gpu in flavor gpu-pool,
    previously considered podsets requests (0) + current podset request (36) > maximum capacity
    (32)", pkg/scheduler/flavorassigner/flavorassigner.go)."""
    cq = ((w.get("status") or {}).get("admission") or {}).get("clusterQueue")
    if _true(w, "Finished"):
        f = _wcond(w, "Finished") or {}
        return f"finished ({f.get('reason')})"
    if _true(w, "Admitted"):
        return f"admitted by ClusterQueue {cq}"
    evicted = _wcond(w, "Evicted")
    lead = f"evicted ({evicted.get('reason')}: {evicted.get('message')}), requeued; " if evicted and evicted.get("status") == "True" else ""
    if _true(w, "QuotaReserved"):
        return f"{lead}quota reserved in ClusterQueue {cq}, waiting for its admission checks"
    qr = _wcond(w, "QuotaReserved")
    if qr and qr.get("status") == "False":
        return f"{lead}{qr.get('reason')}: {qr.get('message')}"
    return f"{lead}waiting for Kueue to consider it"


def priority_of(w: dict) -> str | None:
    """The Workload's priority class and value (``spec.priorityClassRef.name``, ``spec.priority``)."""
    spec = w.get("spec") or {}
    name, value = (spec.get("priorityClassRef") or {}).get("name"), spec.get("priority")
    if name is None and value is None:
        return None
    return f"{name} ({value})" if name else str(value)


def pending_queue(cluster: KubeApi, queue: str = LOCAL_QUEUE) -> dict[str, Any]:
    """The LocalQueue's pending Workloads in Kueue's order: its visibility API where served and
    allowed (:meth:`KubeApi.pending_workloads`), else the namespace's queued Workloads ordered by
    Kueue's rules, marked estimated; ``why`` says why it is an estimate. Kueue v0.19.2
    pkg/cache/queue/cluster_queue.go baseCompareFunc: a sticky workload (one the scheduler is
    retrying) first, then higher priority, then the earlier queue-order time
    (:func:`queue_order_time`), then the uid; with admission fair sharing on, the LocalQueue's usage
    comes before all that (queueOrderingFunc). Neither stickiness nor fair-sharing usage can be
    seen from the Workloads. Left out, as Kueue's list leaves them out: inactive Workloads
    (``spec.active`` false, e.g. past the requeue limit: pkg/workload/workload.go IsAdmissible).
    A Workload in requeue backoff stays in (Kueue keeps it among the inadmissible ones its
    pending list includes: cluster_queue.go PushOrUpdate, Snapshot)."""
    why = "the visibility API is not served"
    try:
        found = cluster.pending_workloads(queue)
    except NotAllowed as err:
        found, why = None, str(err)
    if found is not None:
        items = [{"workload": i["metadata"]["name"], "job": usage.job_of(i), "position_in_local_queue": i.get("positionInLocalQueue"), "position_in_cluster_queue": i.get("positionInClusterQueue"), "priority": i.get("priority")} for i in found]
        return {"source": "kueue visibility API", "estimated": False, "items": items}
    try:
        workloads = cluster.all_workloads(all_namespaces=False)
    except ClusterError as err:
        return {"source": "unavailable", "estimated": True, "items": [], "why": f"{why}; {err}"}
    pending = [w for w in workloads if (w.get("spec") or {}).get("queueName", queue) == queue and not _true(w, "QuotaReserved") and not _true(w, "Finished") and _queued(w)]
    pending.sort(key=lambda w: (-int((w.get("spec") or {}).get("priority") or 0), queue_order_time(w), w["metadata"].get("uid") or ""))
    items = [{"workload": w["metadata"]["name"], "job": usage.job_of(w), "position_in_local_queue": i, "position_in_cluster_queue": None, "priority": (w.get("spec") or {}).get("priority")} for i, w in enumerate(pending)]
    return {"source": f"estimated from the namespace's Workloads by Kueue's ordering ({why})", "estimated": True, "items": items, "why": why}


# Evictions whose time orders the requeued Workload (kueue v0.19.2 pkg/workload/workload.go
# GetQueueOrderTimestamp; PodsReadyTimeout counts with requeuingStrategy.timestamp Eviction, which
# the platform sets: k8s/builders/kueue.py)
REQUEUE_TIME_REASONS = ("PodsReadyTimeout", "AdmissionCheck")


def queue_order_time(w: dict) -> str:
    """The time Kueue orders a Workload by (RFC 3339, so it sorts as text): its Evicted condition's
    when evicted for a pods-ready timeout or an admission check, else its creation."""
    evicted = _wcond(w, "Evicted") or {}
    if evicted.get("status") == "True" and evicted.get("reason") in REQUEUE_TIME_REASONS and evicted.get("lastTransitionTime"):
        return evicted["lastTransitionTime"]
    return w["metadata"].get("creationTimestamp") or ""


def _queued(w: dict) -> bool:
    """Whether Kueue lists the Workload as pending: not deactivated."""
    return (w.get("spec") or {}).get("active") is not False


def queue_position(queue: dict[str, Any], name: str) -> dict[str, Any]:
    """The job's place in :func:`pending_queue`'s list (positions from 0, as Kueue counts) and the jobs ahead."""
    items = queue["items"]
    mine = next((i for i in items if i["job"] == name), None)
    ahead = [i["job"] for i in items if mine is not None and i is not mine and (i["position_in_local_queue"] or 0) < (mine["position_in_local_queue"] or 0)]
    return {"position": mine["position_in_local_queue"] if mine else None, "position_in_cluster_queue": mine["position_in_cluster_queue"] if mine else None, "ahead": ahead,
            "source": queue["source"], "estimated": queue["estimated"]}


def position_text(pos: dict[str, Any], queue: str) -> str:
    """One line for people: 1-based, with who is ahead and where the figure comes from."""
    if pos["position"] is None:
        return f"not among the pending workloads of LocalQueue {queue} ({pos['source']})"
    text = f"{pos['position'] + 1} in LocalQueue {queue}"
    if pos.get("position_in_cluster_queue") is not None:
        text += f", {pos['position_in_cluster_queue'] + 1} in its ClusterQueue"
    if pos["ahead"]:
        text += f"; ahead: {', '.join(pos['ahead'][:5])}" + (f" and {len(pos['ahead']) - 5} more" if len(pos["ahead"]) > 5 else "")
    return text + (f" ({pos['source']})" if pos["estimated"] else "")


def queue_report(cluster: KubeApi, tj: dict, *, refused: list[str] | None = None) -> dict[str, Any]:
    """What Kueue says of a job, as the caller may read it: ``queue`` (its LocalQueue), ``kueue``
    (:func:`workload_state`, or the refusal), ``priority``, and for a job still waiting its
    ``position`` (text) and ``positionDetail`` (:func:`queue_position`). A refused read is named
    (and added to ``refused``), never taken for "none"."""
    name = tj["metadata"]["name"]
    queue = (tj["metadata"].get("labels") or {}).get(QUEUE_LABEL)
    out: dict[str, Any] = {"queue": queue}
    if not queue:
        return out
    try:
        workloads = cluster.workloads(name)
    except NotAllowed as err:
        if refused is not None:
            refused.append(str(err))
        out["kueue"] = f"unknown: {err}"
        return out
    wl = workload_of(workloads, name)
    if wl is None:  # none yet, or a cluster without Kueue's Workloads: the events say what there is
        return out
    out["kueue"], out["priority"] = workload_state(wl), priority_of(wl)
    if phase(tj) == "Queued" and not _true(wl, "QuotaReserved"):
        pending = pending_queue(cluster, queue)
        if pending.get("why", "").startswith("not allowed: ") and refused is not None:
            refused.append(pending["why"])
        detail = queue_position(pending, name)
        out["position"], out["positionDetail"] = position_text(detail, queue), detail
    return out


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
    try:
        return progress.of_lines(cluster.log_tail(node0, lines=200)) if node0 else None
    except ClusterError:
        return None


def job_events(cluster: KubeApi, name: str, *, refused: list[str] | None = None) -> tuple[list[dict], list[dict], list[dict]]:
    """(the TrainJob's events, its pods' events, its Kueue Workloads' events). With ``refused``, events
    the caller may not read are none and the refusal is added there (:func:`readable`)."""
    pods = [e for e in readable(refused, cluster.events, "Pod", default=[]) if e["involvedObject"]["name"].startswith(f"{name}-")]
    workloads = [e for e in readable(refused, cluster.events, "Workload", default=[]) if e["involvedObject"]["name"].startswith(f"trainjob-{name}-")]
    return readable(refused, cluster.events, "TrainJob", name, default=[]), pods, workloads


def evidence(cluster: KubeApi, name: str) -> diagnose.Evidence:
    """Everything :func:`trainctl.diagnose.diagnose` reads about one job, as the caller may read it;
    what the API server refuses is named in ``refused`` (the TrainJob itself must be readable).
    Nodes are cluster-scoped: a team reads none, by design, and none is asked of it."""
    tj = cluster.get_trainjob(name)
    refused: list[str] = []
    pods = readable(refused, cluster.pods, name, default=[])
    own, of_pods, of_workloads = job_events(cluster, name, refused=refused)
    nodes = cluster.nodes({p["spec"]["nodeName"] for p in pods if p.get("spec", {}).get("nodeName")})
    failed_pods = [p["metadata"]["name"] for p in pods if (p.get("status") or {}).get("phase") == "Failed" or any(_restarted(cs) for cs in (p.get("status") or {}).get("containerStatuses") or [])]
    logs = {p: readable(refused, cluster.log_tail, p, default=[]) for p in failed_pods[:4]}
    workloads = readable(refused, cluster.workloads, name, default=[])
    return diagnose.Evidence(trainjob=tj, pods=pods, workloads=workloads, events=own + of_pods + of_workloads, nodes=nodes, log_lines=logs, refused=list(dict.fromkeys(refused)))


def submit(cluster: KubeApi, req: objects.Request, bundle: CodeBundle, *, instance_type_given: bool, trainer_version: str | None = None, runtime_name: str | None = None,
           replace_finished_job: bool = True) -> dict[str, Any]:
    """Create the code ConfigMap and the TrainJob of a checked request as the caller (the cluster's
    Trainer version, current runtime and published facts shape it, as :func:`objects.with_facts`);
    nothing is left behind when the TrainJob is refused. A finished job of the name is replaced
    (a resubmit), unless ``replace_finished_job`` is False (a name made for the request: the API
    server's 409 stands). Raises :class:`objects.SubmitError` for bad
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
    facts = cluster.platform_facts()
    req = objects.with_facts(req, facts, instance_type_given=instance_type_given)
    objects.check(req)
    cm, tj = objects.build(req, bundle)
    warning = objects.efa_image_warning(req, facts)
    created_cm = cluster.create_configmap(cm)
    replaced = None
    try:
        try:
            created = cluster.create_trainjob(tj)
        except ClusterError as err:
            # a job of that name: replaced when it finished (a resubmit of a fixed job), else refused
            if ALREADY_EXISTS not in str(err) or not replace_finished_job or (replaced := replace_finished(cluster, tj["metadata"]["name"], keep_configmap=cm["metadata"]["name"])) is None:
                raise
            created = cluster.create_trainjob(tj)
    except (ClusterError, objects.SubmitError):
        if created_cm:  # leave nothing behind
            cluster.delete_configmap(cm["metadata"]["name"])
        raise
    return {
        "trainjob": tj["metadata"]["name"], "namespace": cluster.namespace, "configmap": cm["metadata"]["name"], "configmapCreated": created_cm, "runtime": runtime_name,
        "trainerVersion": version, "nodes": req.nodes, "created": (created or {}).get("metadata", {}).get("creationTimestamp"),
        **({"replaced": replaced} if replaced else {}), **({"warnings": [warning]} if warning else {}),
    }


ALREADY_EXISTS = "already exists"
"""The API server's word for a name taken (apimachinery pkg/api/errors NewAlreadyExists: ``%s %q already exists``)."""
FINISHED = ("Complete", "Failed")
GONE_TIMEOUT_S = 120.0


def replace_finished(cluster: KubeApi, name: str, *, keep_configmap: str, timeout_s: float = GONE_TIMEOUT_S) -> str | None:
    """A resubmit of ``name``: the TrainJob of that name is deleted when it finished (Complete or
    Failed), with its JobSet and pods first (foreground deletion, waited for: the new job's JobSet
    has the same name), and its code ConfigMap unless it is ``keep_configmap`` (the new job's) or
    another job's; returns the phase it had (None: no such job any more). One still queued or
    running is refused: :class:`objects.SubmitError`. The checkpoints under
    ``/mnt/checkpoints/<name>`` stay: the new job resumes from them."""
    try:
        old = cluster.get_trainjob(name)
    except NotAllowed:
        raise
    except ClusterError as err:
        if f"trainjob {name} not found" in str(err):
            return None
        raise
    was = phase(old)
    if was not in FINISHED:
        raise objects.SubmitError(
            f"trainjob {name} exists and is {was}: a job of that name is replaced only once it finished (Complete or Failed); wait for it, trainctl delete {name}, or pass another --name"
        )
    old_cm = objects.code_configmap_of(old)
    cluster.delete_trainjob_foreground(name)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            cluster.get_trainjob(name)
        except NotAllowed:
            raise
        except ClusterError as err:
            if f"trainjob {name} not found" in str(err):
                break
            raise
        if time.monotonic() > deadline:
            raise ClusterError(f"trainjob {name}: still being deleted after {timeout_s:.0f} s (its pods end first); try again shortly")
        time.sleep(1.0)
    if old_cm and old_cm != keep_configmap and not any(objects.code_configmap_of(t) == old_cm for t in cluster.list_trainjobs()):
        cluster.delete_configmap(old_cm)
    return was


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
