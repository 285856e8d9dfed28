"""The portal over trainctl's local mode (``trainctl ui --local``): the same pages and API, the jobs
run on this machine by the emulator as ``trainctl submit --local`` runs them (trainctl/local.py),
no Kubernetes anywhere.

:class:`LocalPortal` answers what :class:`trainctl.portal.service.Portal` answers for the routes
(trainctl/portal/backend.py names the methods), on trainctl's own modules: a submission is checked
by the same :func:`~trainctl.portal.submission.request_of` (every problem at once) and built by
:func:`trainctl.objects.build` into the ConfigMap and TrainJob the cluster path creates; status,
logs, cancel and diagnosis are ``trainctl status|logs|delete|diagnose --local``'s. The namespace
is the one a job was submitted in (``LOCAL_NAMESPACE`` by default, as ``trainctl submit --local`` writes it).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import yaml

from config.secrets import shown
from trainctl import diagnose, local, objects, progress
from trainctl.portal.identity import Caller
from trainctl.portal.service import gpus_of
from trainctl.portal.submission import JobSpec, Problems, code_bundle, request_of

LOCAL_NAMESPACE = "local"  # trainctl submit --local's namespace when none is given (trainctl/reports.py)
NOTE = "Local mode: jobs run on this machine's CPU through the emulator (trainctl submit --local); no Kubernetes, no queue"
SERIES_BYTES = 4 * 1024 * 1024  # what the chart reads of a job's output: its end
PHASES = {"Running": "Running", "Complete": "Complete", "Failed": "Failed"}


def caller() -> Caller:
    """The one caller of a local portal: whoever can reach 127.0.0.1 on this machine."""
    return Caller(name="you (this machine)", namespace=LOCAL_NAMESPACE, via="local")


def _iso(ts: float | None) -> str | None:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds") if ts else None


class LocalPortal:
    """The portal's job backend on this machine: trainctl's local jobs."""

    mode_note: str | None = NOTE
    local = True  # submissions are judged as trainctl submit --local judges them (no cluster Secrets)

    def _dir(self, namespace: str, name: str):
        """The job's directory, when a local job of that name was submitted in ``namespace`` (a
        local job keeps the namespace it was submitted in, ``local`` by default, as a cluster's job)."""
        try:
            d = local.job_dir(name)
        except local.LocalError as err:
            raise Problems([{"field": "name", "problem": str(err)}]) from None
        if not d.exists() or self._namespace(d) != namespace:
            raise LocalNotFound(f"no local job {name} in namespace {shown(namespace[:63])} (trainctl list --local)")
        return d

    def _namespace(self, d) -> str:
        return str((self._trainjob(d).get("metadata") or {}).get("namespace") or LOCAL_NAMESPACE)

    def _trainjob(self, d) -> dict:
        """The TrainJob as submitted (its ``objects.yaml``): the job's shape, for GPUs and clone."""
        try:
            docs = list(yaml.safe_load_all((d / "objects.yaml").read_text()))
        except (OSError, yaml.YAMLError):
            return {"metadata": {"name": d.name}, "spec": {}}
        return next((o for o in docs if isinstance(o, dict) and o.get("kind") == "TrainJob"), {"metadata": {"name": d.name}, "spec": {}})

    def _times(self, d) -> tuple[float | None, float | None]:
        """(submitted, ended): job.json's submission time, result.json's writing (the emulator's end)."""
        try:
            state = yaml.safe_load((d / "job.json").read_text()) or {}
        except (OSError, yaml.YAMLError):
            state = {}
        try:
            ended = (d / "result.json").stat().st_mtime
        except OSError:
            ended = None
        submitted = state.get("submitted_at")
        return (submitted if isinstance(submitted, int | float) else None), ended

    # --- jobs ----------------------------------------------------------------------------------

    def create(self, caller: Caller, spec: JobSpec, files: list) -> dict[str, Any]:  # noqa: ARG002
        problems: list[dict[str, str]] = []
        try:
            req = request_of(spec, None, local=True)  # the cluster path's checks, on the GPU catalog, and no Secret references
        except Problems as err:
            raise Problems(problems + err.problems) from None
        problems += [{"field": "config.num_nodes", "problem": line.removeprefix(f"--nodes {req.nodes}: ")} for line in local.node_problems(req.nodes, req.gpus_per_node or 1)]
        if problems:  # every problem at once, nothing started
            raise Problems(problems)
        if not spec.replace_finished and req.name and local.job_dir(req.name).exists():  # a name made for this request (the guide's, by the second): never another job's
            raise Problems([{"field": "name", "problem": f"{req.name} exists already (a job made this second): send the request again"}], status=409)
        bundle = code_bundle(files, req.name)
        try:
            cm, tj = objects.build(req, bundle)
            state = local.submit(cm, tj, grace_s=req.grace_seconds)
            # this process lives on (trainctl submit --local exits and leaves it to init): collect the emulator when it ends
            threading.Thread(target=_reap, args=(state["pid"],), daemon=True, name=f"reap-{state['name']}").start()
        except objects.SubmitError as err:
            raise Problems([{"field": "request", "problem": line} for line in str(err).splitlines()]) from None
        except local.LocalError as err:  # a running job of that name (a finished one is replaced, as trainctl submit --local does)
            raise Problems([{"field": "name", "problem": str(err)}]) from None
        return {"trainjob": state["name"], "namespace": req.namespace, "configmap": cm["metadata"]["name"], "configmapCreated": True, "runtime": "local emulator",
                "nodes": req.nodes, "created": _iso(state.get("submitted_at")), "instanceType": req.instance_type}

    def delete(self, caller: Caller, namespace: str, name: str) -> dict[str, Any]:  # noqa: ARG002
        self._dir(namespace, name)
        try:
            stopped = local.delete(name)
        except local.LocalError as err:
            raise Problems([{"field": "name", "problem": str(err)}]) from None
        return {"trainjob": name, "deleted": True, "stopped": stopped, "configmap": None, "configmapDeleted": True}

    def status(self, caller: Caller, namespace: str, name: str, *, light: bool = False) -> dict[str, Any]:  # noqa: ARG002  (light: a local status is light)
        d = self._dir(namespace, name)
        r = local.report(name)
        tj = self._trainjob(d)
        submitted, ended = self._times(d)
        state = PHASES.get(r["phase"], r["phase"])
        failure = r.get("failure")
        last = f"{failure['where']} exited with code {failure['exit_code']}" if failure else None
        message = r.get("message") or ("running on this machine" if state == "Running" else "")
        nodes = r.get("nodes") or 1
        return {
            "trainjob_name": name, "namespace": namespace, "status": state, "message": message, "created_at": _iso(submitted), "started_at": _iso(submitted),
            "completed_at": _iso(ended) if state in ("Complete", "Failed") else None, "nodes": r.get("nodes"), "gpus": gpus_of(tj), "restarts": r.get("restarts", 0),
            "last_failure": last, "workers": [{"pod": f"local node {i}", "worker": i, "phase": state, "waiting": None, "node": "this machine", "restarts": r.get("restarts", 0)} for i in range(nodes)],
            "progress": r.get("progress"), "progress_text": progress.text(r.get("progress")),
        }

    def list(self, caller: Caller, namespace: str, *, with_progress: bool = True) -> list[dict[str, Any]]:  # noqa: ARG002
        now = time.time()
        rows = []
        for r in local.jobs():
            d = local.job_dir(r["name"])
            if self._namespace(d) != namespace:
                continue
            submitted, _ = self._times(d)
            state = PHASES.get(r["phase"], r["phase"])
            rows.append({
                "trainjob_name": r["name"], "status": state, "nodes": r.get("nodes"), "gpus": gpus_of(self._trainjob(d)), "created_at": _iso(submitted),
                "age_s": int(now - submitted) if submitted else None, "progress": progress.text(r.get("progress")) if with_progress and state == "Running" else "-",
            })
        return sorted(rows, key=lambda row: row["created_at"] or "", reverse=True)

    def events(self, caller: Caller, namespace: str, name: str) -> list[dict[str, Any]]:  # noqa: ARG002
        """A local job has no Kubernetes events: its restarts and end are in its status and log."""
        self._dir(namespace, name)
        return []

    def diagnosis(self, caller: Caller, namespace: str, name: str) -> list[dict[str, Any]]:  # noqa: ARG002
        self._dir(namespace, name)
        return [f.as_dict() for f in diagnose.diagnose(local.evidence(name))]

    def queue_position(self, caller: Caller, namespace: str, name: str) -> dict[str, Any]:  # noqa: ARG002
        self._dir(namespace, name)
        return {"position": None, "position_in_cluster_queue": None, "ahead": [], "source": "local mode: no queue, a job starts when submitted", "estimated": False}

    def team(self, caller: Caller, namespace: str) -> dict[str, Any]:
        """GPUs in use: what the running jobs ask for (their TrainJobs' requests; the emulator runs
        them on this machine's CPU); no quota, no borrowing and no GPU-hours in local mode (no Kueue)."""
        running = [r for r in self.list(caller, namespace, with_progress=False) if r["status"] == "Running"]
        return {
            "namespace": namespace, "team": None, "local": True, "gpu_quota": None, "gpus_used": sum(r["gpus"] or 0 for r in running), "gpus_borrowed": None, "gpu_hours_week": None,
            "queue": {"source": "local mode: no queue", "estimated": False, "items": []},
            "running": [{"job": r["trainjob_name"], "gpus": r["gpus"] or 0, "since": r["created_at"]} for r in running],
        }

    def platform_facts(self, caller: Caller, namespace: str) -> dict[str, Any] | None:  # noqa: ARG002
        """None: the jobs run on this machine (no pools, no queue)."""
        return None

    def submitted_form(self, caller: Caller, namespace: str, name: str) -> dict[str, Any]:  # noqa: ARG002
        """What the job was submitted with (the form's Clone & edit): its objects.yaml's TrainJob and
        code ConfigMap (as the cluster's portal answers: trainctl/portal/service.py)."""
        d = self._dir(namespace, name)
        try:
            docs = [o for o in yaml.safe_load_all((d / "objects.yaml").read_text()) if isinstance(o, dict)]
        except (OSError, yaml.YAMLError):
            docs = []
        tj = next((o for o in docs if o.get("kind") == "TrainJob"), {"metadata": {"name": name}, "spec": {}})
        cm = next((o for o in docs if o.get("kind") == "ConfigMap"), None)
        return {"trainjob": tj, "configmap": cm, "code_problem": None if cm is not None else "its objects.yaml holds no code ConfigMap"}

    def state_stream(self, caller: Caller, namespace: str, name: str, *, heartbeat_s: float, poll_s: float) -> AsyncIterator[str]:
        """The job's state as server-sent events (trainctl/portal/live.py), every read a :meth:`status`."""
        from trainctl.portal import live

        first = self.status(caller, namespace, name)
        return live.job_stream(lambda: self.status(caller, namespace, name), first, name=name, heartbeat_s=heartbeat_s, poll_s=poll_s, gone=(LocalNotFound, local.LocalError))

    def jobs_stream(self, caller: Caller, namespace: str, *, heartbeat_s: float, poll_s: float) -> AsyncIterator[str]:
        from trainctl.portal import live

        first = self.list(caller, namespace)
        return live.list_stream(lambda: self.list(caller, namespace), first, namespace=namespace, heartbeat_s=heartbeat_s, poll_s=poll_s)

    def progress_series(self, caller: Caller, namespace: str, name: str) -> dict[str, Any]:  # noqa: ARG002
        """Every step event of node 0's lines (the newest ``SERIES_BYTES`` of the job's output)."""
        d = self._dir(namespace, name)
        lines = [line for line in local.tail_lines(d, SERIES_BYTES) if (m := local.NODE_LINE.match(line)) and m.group(2) == "0"]
        return {"trainjob_name": name, "namespace": namespace, "source": "the log of worker 0", "points": progress.series(lines)}

    # --- logs ------------------------------------------------------------------------------------

    def _node(self, d, name: str, worker: int) -> None:
        nodes = local.report(name).get("nodes") or 1
        if not 0 <= worker < nodes:
            raise Problems([{"field": "worker", "problem": f"{worker}: allowed: 0 to {nodes - 1} ({name} has {nodes} workers)"}])

    def log_tail(self, caller: Caller, namespace: str, name: str, worker: int, tail: int) -> tuple[int, dict[str, Any]]:  # noqa: ARG002
        d = self._dir(namespace, name)
        self._node(d, name, worker)
        lines = list(local.logs(name, node=worker, follow=False))[-tail:]
        return 200, {"trainjob_name": name, "namespace": namespace, "worker": worker, "pod": f"local node {worker}", "logs": "\n".join(lines) + ("\n" if lines else "")}

    def log_stream(self, caller: Caller, namespace: str, name: str, worker: int, *, heartbeat_s: float) -> AsyncIterator[str]:  # noqa: ARG002
        """Worker N's lines as they come, until the job ends (the same events as a pod's stream)."""
        from trainctl.portal.logs import relay

        d = self._dir(namespace, name)
        self._node(d, name, worker)

        def reader(put, stop: threading.Event) -> None:
            for line in local.logs(name, node=worker, follow=True, stop=stop.is_set):
                if stop.is_set():
                    return
                put("line", line)
            r = local.report(name) if local.job_dir(name).exists() else {"phase": "deleted"}
            put("end", {"reason": "ended", "message": f"the local job ended ({r['phase']})", "status": r["phase"]})

        return relay(reader, name=name, worker=worker, heartbeat_s=heartbeat_s)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


class LocalNotFound(LookupError):
    """No local job of that name (HTTP 404)."""
