"""What the portal does for a caller, on trainctl's own modules: the job model and builders
(trainctl/objects.py), submit/delete/diagnosis/progress (trainctl/jobstate.py), GPU-hours
(trainctl/usage.py) and the API access (trainctl/kube.py), every call as the caller. What a
submission is and how it is judged: trainctl/portal/submission.py."""

from __future__ import annotations

import hashlib
import pathlib
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes import client

from trainctl import jobstate, objects, progress, usage
from trainctl.code import CodeError, collect
from trainctl.kube import ClusterError, KubeApi
from trainctl.portal.identity import Caller
from trainctl.portal.submission import JobSpec, Problems, _from_trainctl, _problem, request_of
from trainctl.portal.upload import Part, UploadError, unpack

WEEK = timedelta(days=7)
SERIES_LINES = 20000  # the lines of worker 0's log the chart reads (its newest)
SERIES_KEEP_S = 3.0  # a series read is reused this long (the page's /progress, then its chart.svg)


def _when(ts: str | None) -> datetime | None:
    return usage.parse_time(ts) if ts else None


class Portal:
    """The portal's cluster access: one API client per identity (cached: a request reuses the
    connections of the last one with the same identity), every call as that identity. The routes
    call what trainctl/portal/backend.py names; trainctl/portal/local_service.py answers the same
    for the jobs of this machine (``trainctl ui --local``)."""

    mode_note: str | None = None  # a line for the page header (local mode says so)
    local = False  # the jobs run on a cluster

    def __init__(self, base: client.Configuration, *, base_headers: dict[str, list[str]] | None = None, cache_size: int = 64):
        self.base = base
        self.base_headers = base_headers or {}
        self._clients: OrderedDict[tuple, KubeApi] = OrderedDict()
        self._lock = threading.Lock()
        self._cache_size = cache_size
        self._series: dict[tuple, tuple[float, dict[str, Any]]] = {}

    def _identity(self, caller: Caller, namespace: str) -> tuple:
        headers = caller.headers or self.base_headers
        return (namespace, tuple(sorted((k, tuple(v)) for k, v in headers.items())), hashlib.sha256(caller.token.encode()).hexdigest() if caller.token else None)

    def kube(self, caller: Caller, namespace: str) -> KubeApi:
        headers = caller.headers or self.base_headers
        key = self._identity(caller, namespace)
        with self._lock:
            found = self._clients.get(key)
            if found is not None:
                self._clients.move_to_end(key)
                return found
        cfg = self.base
        if caller.token is not None:  # the caller's own token, nothing of the portal's
            cfg = client.Configuration()
            cfg.host, cfg.ssl_ca_cert, cfg.verify_ssl = self.base.host, self.base.ssl_ca_cert, self.base.verify_ssl
            cfg.api_key = {"authorization": f"Bearer {caller.token}"}
        api = KubeApi(namespace=namespace, configuration=cfg, headers=headers or {"User-Agent": ["training-platform-portal"]})
        with self._lock:
            self._clients[key] = api
            while len(self._clients) > self._cache_size:
                self._clients.popitem(last=False)
        return api

    # --- jobs ----------------------------------------------------------------------------------

    def create(self, caller: Caller, spec: JobSpec, files: list[Part]) -> dict[str, Any]:
        kube = self.kube(caller, spec.namespace)
        req = request_of(spec, None)  # every input problem before any cluster read
        facts = kube.platform_facts()
        if spec.instance_type is None:
            req = request_of(spec, facts)
        with tempfile.TemporaryDirectory(prefix="portal-upload-") as tmp:
            root = pathlib.Path(tmp) / (req.name or "code")
            root.mkdir()
            try:
                unpack(files, root)
                bundle = collect(root)
                bundle = replace(bundle, root=pathlib.Path(req.name or "job"))
                done = jobstate.submit(kube, req, bundle, instance_type_given=True, replace_finished_job=spec.replace_finished)
            except (UploadError, CodeError) as err:
                raise Problems([_problem("training_code", line.replace(str(root), "the upload")) for line in str(err).splitlines()]) from None
            except objects.SubmitError as err:
                raise Problems(_from_trainctl([line.replace(str(root), "the upload") for line in str(err).splitlines()])) from None
        return {**done, "instanceType": req.instance_type}

    def delete(self, caller: Caller, namespace: str, name: str) -> dict[str, Any]:
        return jobstate.delete(self.kube(caller, namespace), name, direct=True)

    def status(self, caller: Caller, namespace: str, name: str, *, light: bool = False) -> dict[str, Any]:
        """The job as its page shows it. ``light`` (the state stream's reads, every ``poll_s``): the
        TrainJob's own events only, not the namespace's Pod and Workload events (two lists of the
        whole namespace; the Workload's conditions, read all the same, say what Kueue says)."""
        kube = self.kube(caller, namespace)
        tj = kube.get_trainjob(name)
        refused: list[str] = []  # reads the caller may not make: named, never taken for "none" (as trainctl status)
        pods = jobstate.readable(refused, kube.pods, name, default=[])
        if light:
            own, of_workloads = jobstate.readable(refused, kube.events, "TrainJob", name, default=[]), []
        else:
            own, _of_pods, of_workloads = jobstate.job_events(kube, name, refused=refused)
        started, finished = jobstate.times(tj, pods)
        state = jobstate.phase(tj)
        failure = jobstate.last_failure(tj, pods, own)
        queue = jobstate.queue_report(kube, tj, refused=refused)
        report = jobstate.status_report(tj, pods, own, of_workloads, [], queue=queue)
        message = failure if state == "Failed" and failure else report["admission"]
        out: dict[str, Any] = {
            "trainjob_name": name, "namespace": namespace, "status": "Pending" if state == "Created" else state, "message": message,
            "created_at": tj["metadata"].get("creationTimestamp"), "started_at": started, "completed_at": finished,
            "nodes": (tj["spec"].get("trainer") or {}).get("numNodes"), "gpus": gpus_of(tj), "restarts": jobstate.restarts(pods), "last_failure": failure,
            "workers": [worker_state(p) for p in sorted(pods, key=lambda p: p["metadata"]["name"])],
        }
        found = jobstate.progress_of(kube, tj, pods)
        out["progress"] = found
        out["progress_text"] = progress.text(found)
        out["priority"] = queue.get("priority")
        if state == "Queued":
            out["queue"] = queue.get("positionDetail") or self.queue_position(caller, namespace, name)
            out["queue_text"] = queue.get("position")
        out["not_allowed"] = list(dict.fromkeys(refused))
        return out

    def list(self, caller: Caller, namespace: str, *, with_progress: bool = True) -> list[dict[str, Any]]:
        kube = self.kube(caller, namespace)
        jobs = sorted(kube.list_trainjobs(), key=lambda t: t["metadata"].get("creationTimestamp") or "", reverse=True)
        now = datetime.now(UTC)
        queue = self._pending(kube) if any(jobstate.phase(t) == "Queued" for t in jobs) else None
        rows = []
        for t in jobs:
            state = jobstate.phase(t)
            created = _when(t["metadata"].get("creationTimestamp"))
            row = {
                "trainjob_name": t["metadata"]["name"], "status": "Pending" if state == "Created" else state, "nodes": (t["spec"].get("trainer") or {}).get("numNodes"),
                "gpus": gpus_of(t), "created_at": t["metadata"].get("creationTimestamp"), "age_s": int((now - created).total_seconds()) if created else None,
                "progress": progress.text(jobstate.progress_of(kube, t)) if with_progress and state == "Running" else "-",
            }
            if queue is not None and state == "Queued":
                row["queue"] = _position(queue, t["metadata"]["name"])
            rows.append(row)
        return rows

    def events(self, caller: Caller, namespace: str, name: str) -> list[dict[str, Any]]:
        kube = self.kube(caller, namespace)
        kube.get_trainjob(name)  # a job the caller may read
        own, of_pods, of_workloads = jobstate.job_events(kube, name)
        rows = [
            {"time": e.get("lastTimestamp") or e.get("eventTime") or e.get("firstTimestamp"), "type": e.get("type"), "reason": e.get("reason"),
             "object": f"{e['involvedObject'].get('kind')}/{e['involvedObject'].get('name')}", "message": e.get("message"), "count": e.get("count")}
            for e in own + of_pods + of_workloads
        ]
        return sorted(rows, key=lambda r: r["time"] or "")

    def diagnosis(self, caller: Caller, namespace: str, name: str) -> list[dict[str, Any]]:
        from trainctl import diagnose

        return [f.as_dict() for f in diagnose.diagnose(jobstate.evidence(self.kube(caller, namespace), name))]

    # --- queue and team ----------------------------------------------------------------------------

    def _pending(self, kube: KubeApi) -> dict[str, Any]:
        """The LocalQueue's pending Workloads in Kueue's order, as trainctl status reads them (trainctl/jobstate.py pending_queue)."""
        return jobstate.pending_queue(kube)

    def queue_position(self, caller: Caller, namespace: str, name: str) -> dict[str, Any]:
        kube = self.kube(caller, namespace)
        kube.get_trainjob(name)
        return _position(self._pending(kube), name)

    def team(self, caller: Caller, namespace: str) -> dict[str, Any]:
        """GPUs in use: what the namespace's running jobs ask for (:func:`gpus_of`); the quota: the
        team's (the stack's ``tenants.<team>.gpuQuota``, the nominal quota of its Kueue ClusterQueue);
        borrowed: what Kueue admitted beyond it (trainctl/usage.py ``borrowed``); GPU-hours from Kueue's Workloads."""
        kube = self.kube(caller, namespace)
        now = datetime.now(UTC)
        try:
            workloads = kube.all_workloads(all_namespaces=False)
            jobs = [t for t in kube.list_trainjobs() if jobstate.phase(t) == "Running"]
        except ClusterError as err:
            return {"namespace": namespace, "team": caller.team, "error": str(err)}
        admitted = [r for r in usage.rows(workloads, since=now - timedelta(seconds=1), now=now) if r.end is None]
        week = usage.rows(workloads, since=now - WEEK, now=now)
        quota = caller.gpu_quota
        if quota is None:
            quota = (kube.platform_facts() or {}).get("gpuQuota")
        since = {r.job: r.start.isoformat(timespec="seconds") for r in admitted}
        running = [{"job": t["metadata"]["name"], "gpus": gpus_of(t) or 0, "since": since.get(t["metadata"]["name"]) or t["metadata"].get("creationTimestamp")} for t in jobs]
        return {
            "namespace": namespace, "team": caller.team, "local": False, "gpu_quota": quota, "gpus_used": sum(r["gpus"] for r in running),
            "gpus_borrowed": usage.borrowed(workloads, quota) if quota is not None else None,
            "gpu_hours_week": round(sum(r.gpu_hours for r in week), 3), "since": (now - WEEK).isoformat(timespec="seconds"), "queue": self._pending(kube), "running": running,
        }

    # --- logs ------------------------------------------------------------------------------------

    def submitted_form(self, caller: Caller, namespace: str, name: str) -> dict[str, Any]:
        """What the job was submitted with (Clone & edit): its TrainJob and its code ConfigMap
        (``data``, ``binaryData`` base64 as the API has it), or None with why it could not be read."""
        kube = self.kube(caller, namespace)
        tj = kube.get_trainjob(name)
        cm = objects.code_configmap_of(tj)
        if not cm:
            return {"trainjob": tj, "configmap": None, "code_problem": "the job mounts no code ConfigMap"}
        try:
            found: Any = kube.core.read_namespaced_config_map(cm, namespace)
        except Exception as err:  # noqa: BLE001  (the code may be gone: the form stays editable, and says so)
            why = f"HTTP {err.status}" if isinstance(err, client.ApiException) else type(err).__name__
            return {"trainjob": tj, "configmap": None, "code_problem": f"its code ConfigMap {cm} could not be read ({why})"}
        return {"trainjob": tj, "configmap": {"data": dict(found.data or {}), "binaryData": dict(found.binary_data or {})}, "code_problem": None}

    def platform_facts(self, caller: Caller, namespace: str) -> dict[str, Any] | None:
        """The cluster's published facts as the caller reads them (the form's choices: its pools, its
        priorities), or None where there are none or they cannot be read (the form then offers what
        trainctl would, and the submission is judged on them all the same)."""
        try:
            return self.kube(caller, namespace).platform_facts()
        except ClusterError:
            return None

    def log_tail(self, caller: Caller, namespace: str, name: str, worker: int, tail: int) -> tuple[int, dict[str, Any]]:
        """(HTTP status, body): the last ``tail`` lines of worker N's pod; 410 when a finished job's pods are gone."""
        from trainctl.portal.logs import GONE

        kube, tj, pod = self.worker_pod(caller, namespace, name, worker)
        state = jobstate.phase(tj)
        head = {"trainjob_name": name, "namespace": namespace, "worker": worker}
        if pod is None:
            if state in ("Complete", "Failed"):
                return 410, {**head, "logs": None, "message": GONE}
            return 200, {**head, "logs": "", "message": f"worker {worker} has no pod yet ({'Pending' if state == 'Created' else state})"}
        try:
            resp = kube.pod_log(pod["metadata"]["name"], follow=False, tail_lines=tail)
            text = resp.data.decode("utf-8", errors="replace")
        except ClusterError as err:
            if "(HTTP 400)" in str(err):  # the container has not started
                return 200, {**head, "logs": "", "message": f"worker {worker}'s container has not started"}
            raise
        return 200, {**head, "pod": pod["metadata"]["name"], "logs": text}

    def log_stream(self, caller: Caller, namespace: str, name: str, worker: int, *, heartbeat_s: float):
        """Worker N's log as server-sent events (trainctl/portal/logs.py); may the caller read it,
        is the worker in range: answered here, before the stream starts."""
        from trainctl.portal import logs

        self.worker_pod(caller, namespace, name, worker)
        return logs.stream(self, caller, namespace, name, worker, heartbeat_s=heartbeat_s)

    def state_stream(self, caller: Caller, namespace: str, name: str, *, heartbeat_s: float, poll_s: float):
        """The job's state as server-sent events (trainctl/portal/live.py), every read a
        :meth:`status` (``light``) as the caller; the first before the stream starts (a refusal is its HTTP status)."""
        from trainctl.portal import live

        first = self.status(caller, namespace, name, light=True)
        return live.job_stream(lambda: self.status(caller, namespace, name, light=True), first, name=name, heartbeat_s=heartbeat_s, poll_s=poll_s)

    def jobs_stream(self, caller: Caller, namespace: str, *, heartbeat_s: float, poll_s: float):
        """The namespace's jobs as server-sent events, every read a :meth:`list` as the caller."""
        from trainctl.portal import live

        first = self.list(caller, namespace)
        return live.list_stream(lambda: self.list(caller, namespace), first, namespace=namespace, heartbeat_s=heartbeat_s, poll_s=poll_s)

    def progress_series(self, caller: Caller, namespace: str, name: str) -> dict[str, Any]:
        """Every step event of worker 0's log (its last ``SERIES_LINES`` lines; trainctl/progress.py
        ``series``). One read serves the page's /progress and the chart.svg that follows it: the
        series is kept ``SERIES_KEEP_S`` for the same identity and job."""
        kube, _tj, pod = self.worker_pod(caller, namespace, name, 0)
        key = (self._identity(caller, namespace), name, pod["metadata"].get("uid") if pod is not None else None)
        now = time.monotonic()
        with self._lock:
            kept = self._series.get(key)
            if kept is not None and now - kept[0] < SERIES_KEEP_S:
                return kept[1]
        lines = kube.log_tail(pod["metadata"]["name"], lines=SERIES_LINES) if pod is not None else []
        found = {"trainjob_name": name, "namespace": namespace, "source": "the log of worker 0", "points": progress.series(lines)}
        with self._lock:
            self._series = {k: v for k, v in self._series.items() if now - v[0] < SERIES_KEEP_S}
            self._series[key] = (now, found)
        return found

    def worker_pod(self, caller: Caller, namespace: str, name: str, worker: int) -> tuple[KubeApi, dict, dict | None]:
        """(client, TrainJob, the pod of worker N or None). Raises Problems for a worker out of range."""
        kube = self.kube(caller, namespace)
        tj = kube.get_trainjob(name)
        nodes = int((tj["spec"].get("trainer") or {}).get("numNodes") or 1)
        if not 0 <= worker < nodes:
            raise Problems([_problem("worker", f"{worker}: allowed: 0 to {nodes - 1} ({name} has {nodes} workers)")])
        pods = [p for p in kube.pods(name) if _worker_index(p) == worker]
        pods.sort(key=lambda p: (int((p["metadata"].get("labels") or {}).get(jobstate.RESTART_LABEL, 0)), p["metadata"].get("creationTimestamp") or ""))
        return kube, tj, (pods[-1] if pods else None)


REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
"""The JobSet replicated job of a pod (kubernetes-sigs/jobset api/jobset/v1alpha2 ReplicatedJobNameKey);
the Trainer's node job is ``node`` (kubeflow/trainer pkg/constants Node)."""
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
"""An indexed Job's pod index (Kubernetes batch/v1 JobCompletionIndexAnnotation, also a label since 1.28)."""


def _worker_index(pod: dict) -> int | None:
    labels = pod["metadata"].get("labels") or {}
    if labels.get(REPLICATED_JOB_LABEL) != "node":
        return None
    try:
        return int(labels.get(INDEX_LABEL, ""))
    except ValueError:
        return None


def worker_state(pod: dict) -> dict[str, Any]:
    status = pod.get("status") or {}
    waiting = next((cs["state"]["waiting"].get("reason") for cs in status.get("containerStatuses") or [] if (cs.get("state") or {}).get("waiting")), None)
    return {"pod": pod["metadata"]["name"], "worker": _worker_index(pod), "phase": status.get("phase"), "waiting": waiting, "node": (pod.get("spec") or {}).get("nodeName"),
            "restarts": sum(cs.get("restartCount", 0) for cs in status.get("containerStatuses") or [])}


def gpus_of(tj: dict) -> int | None:
    """GPUs the job asks for: nodes times GPUs per node (``numProcPerNode`` on the torch runtime, as trainctl writes it)."""
    trainer = tj["spec"].get("trainer") or {}
    per = ((trainer.get("resourcesPerNode") or {}).get("limits") or {}).get("nvidia.com/gpu")
    try:
        return int(trainer.get("numNodes") or 1) * int(per) if per is not None else None
    except (TypeError, ValueError):
        return None


_position = jobstate.queue_position  # one copy: trainctl status and the portal place a job alike
