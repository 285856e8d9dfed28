"""The job page and the jobs list, followed live: server-sent events on the log stream's machinery
(trainctl/portal/logs.py ``relay``: a reader thread, heartbeats, the end when the client leaves).

``job_stream``: ``event: state`` with what the job page shows (state, message, workers, restarts,
progress, queue position, the actions that apply) each time it changes, then one ``event: end``
when the job has finished (``reason: finished``), is gone (``gone``) or cannot be read (``error``).
``list_stream``: ``event: jobs`` with the namespace's rows each time they change, never ending for
want of a running job (a job submitted later must appear): it reads ``SLOW`` times less often while
every job has finished. Every read is the backend's own (``Portal.status`` as the caller, the API
server judging; ``LocalPortal.status`` on this machine): this module only polls and compares."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

from trainctl.kube import ClusterError, NotAllowed
from trainctl.portal.logs import relay

FINISHED = ("Complete", "Failed")
JOB_KEYS = ("trainjob_name", "status", "message", "nodes", "gpus", "restarts", "progress_text", "started_at", "completed_at", "last_failure", "queue_text")
SLOW = 3  # a list with nothing left running is read every SLOW * poll_s
WORKER_KEYS = ("worker", "pod", "phase", "waiting", "restarts")
ROW_KEYS = ("trainjob_name", "status", "nodes", "gpus", "created_at", "progress")


def _queue(found: Any) -> dict[str, Any] | None:
    if not isinstance(found, dict) or found.get("position") is None:
        return None
    return {"position": int(found["position"]) + 1, "ahead": [str(a) for a in found.get("ahead") or []], "estimated": bool(found.get("estimated")), "source": found.get("source")}


def snapshot(status: dict[str, Any]) -> dict[str, Any]:
    """What the job page follows of a status (``Backend.status``'s answer), and the actions that apply."""
    finished = status.get("status") in FINISHED
    return {
        **{k: status.get(k) for k in JOB_KEYS},
        "progress": status.get("progress"),
        "queue": _queue(status.get("queue")),
        "workers": [{k: w.get(k) for k in WORKER_KEYS} for w in status.get("workers") or []],
        "finished": finished,
        "actions": {"cancel": not finished},
    }


def row(job: dict[str, Any]) -> dict[str, Any]:
    """What the jobs list follows of one of its rows (``Backend.list``'s)."""
    return {**{k: job.get(k) for k in ROW_KEYS}, "queue": _queue(job.get("queue")), "finished": job.get("status") in FINISHED}


def _gone(err: Exception, gone: tuple[type[Exception], ...]) -> bool:
    return isinstance(err, gone) or (isinstance(err, ClusterError) and not isinstance(err, NotAllowed) and (" not found in namespace " in str(err) or "(HTTP 404)" in str(err)))


def _follow(read: Callable[[], Any], first: Any, shape: Callable[[Any], Any], done: Callable[[Any], dict[str, Any] | None], *, kind: str, poll_s: float,
            gone: tuple[type[Exception], ...], slow: Callable[[Any], bool] = lambda _: False) -> Callable[[Callable[[str, Any], None], threading.Event], None]:
    """A reader for :func:`relay`: ``shape(read())`` every ``poll_s`` (``SLOW`` times that while
    ``slow`` says so), put as ``kind`` when it changed, until ``done`` names an end or the client
    leaves (``stop``)."""

    def reader(put: Callable[[str, Any], None], stop: threading.Event) -> None:
        current, last = first, None
        while True:
            shaped = shape(current)
            if shaped != last:
                put(kind, shaped)
                last = shaped
            end = done(shaped)
            if end is not None:
                put("end", end)
                return
            if stop.wait(poll_s * SLOW if slow(shaped) else poll_s):
                return
            try:
                current = read()
            except Exception as err:  # noqa: BLE001  (said to the page as the stream's end, never a traceback)
                if _gone(err, gone):
                    put("end", {"reason": "gone", "message": "the job is gone (deleted)", "status": None})
                elif isinstance(err, ClusterError):
                    put("end", {"reason": "error", "message": str(err), "status": None})
                else:
                    put("end", {"reason": "error", "message": f"reading the job broke ({type(err).__name__})", "status": None})
                return

    return reader


def job_stream(read: Callable[[], dict[str, Any]], first: dict[str, Any], *, name: str, heartbeat_s: float, poll_s: float,
               gone: tuple[type[Exception], ...] = ()) -> AsyncIterator[str]:
    """The job's state as server-sent events; ``first``: the status read before the stream began
    (a job the caller may not read, or that does not exist, is refused then, as an HTTP status)."""

    def done(snap: dict[str, Any]) -> dict[str, Any] | None:
        return {"reason": "finished", "message": f"the job has finished ({snap['status']})", "status": snap["status"]} if snap["finished"] else None

    reader = _follow(read, first, snapshot, done, kind="state", poll_s=poll_s, gone=gone)
    return relay(reader, name=name, heartbeat_s=heartbeat_s)


def list_stream(read: Callable[[], list[dict[str, Any]]], first: list[dict[str, Any]], *, namespace: str, heartbeat_s: float, poll_s: float) -> AsyncIterator[str]:
    """The namespace's jobs as server-sent events, until the client leaves (or a read fails: the
    end says so, and the page opens the stream again); slower while none of them is running."""

    def shape(jobs: list[dict[str, Any]]) -> dict[str, Any]:
        return {"namespace": namespace, "items": [row(j) for j in jobs]}

    def idle(rows: dict[str, Any]) -> bool:
        return all(r["finished"] for r in rows["items"])

    return relay(_follow(read, first, shape, lambda _: None, kind="jobs", poll_s=poll_s, gone=(), slow=idle), name=f"list-{namespace}", heartbeat_s=heartbeat_s)
