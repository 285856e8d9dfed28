"""A worker's log as server-sent events: ``event: line`` per log line, a ``: heartbeat`` comment
every ``heartbeat_s`` while nothing comes (idle connections are cut by load balancers: the ALB's
idle timeout is 60 s by default, Elastic Load Balancing User Guide "Connection idle timeout"), and
one ``event: end`` with the reason. A finished job whose pods are gone (JobSet deletes a finished
job's pods when the job is cleaned up) ends at once, saying where its logs went."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from trainctl import jobstate
from trainctl.kube import ClusterError
from trainctl.portal.identity import Caller


class Pods(Protocol):
    """What :func:`stream` asks of the cluster's portal (trainctl/portal/service.py ``Portal``, which imports this module)."""

    def worker_pod(self, caller: Caller, namespace: str, name: str, worker: int) -> tuple[Any, dict, dict | None]: ...

GONE = ("the pods of this finished job are gone, and their logs with them: the platform's log shipping "
        "(CloudWatch Container Insights, log group /aws/containerinsights/<cluster>/application) keeps them")
MAX_LINE = 16384


def sse(event: str | None, data: Any) -> str:
    text = data if isinstance(data, str) else json.dumps(data)
    lines = text.replace("\r", "").split("\n")
    return (f"event: {event}\n" if event else "") + "".join(f"data: {line}\n" for line in lines) + "\n"


def _started(pod: dict) -> bool:
    return any((cs.get("state") or {}).get("running") or (cs.get("state") or {}).get("terminated") for cs in (pod.get("status") or {}).get("containerStatuses") or [])


def _ended(pod: dict) -> bool:
    """Every container of the pod has terminated (or the pod has, Succeeded or Failed)."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return True
    statuses = status.get("containerStatuses") or []
    return bool(statuses) and all((cs.get("state") or {}).get("terminated") for cs in statuses)


WAIT_POLL_S = 2.5  # how often a worker with no started pod is looked for again (two API reads each)


def stream(portal: Pods, caller: Caller, namespace: str, name: str, worker: int, *, heartbeat_s: float, poll_s: float = WAIT_POLL_S) -> AsyncIterator[str]:
    """Worker N's pod log, followed until its container ends."""
    holder: dict[str, Any] = {}

    def reader(put: Callable[[str, Any], None], stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                kube, tj, pod = portal.worker_pod(caller, namespace, name, worker)
                state = jobstate.phase(tj)
                if pod is None or not _started(pod):
                    if state in ("Complete", "Failed"):
                        put("end", {"reason": "gone", "message": GONE, "status": state})
                        return
                    put("wait", {"status": state})
                    if stop.wait(poll_s):
                        return
                    continue
                put("pod", {"pod": pod["metadata"]["name"]})
                # a container that has ended is read once (a follow of it may never end: kwok's does not)
                resp = kube.pod_log(pod["metadata"]["name"], follow=not _ended(pod))
                holder["resp"] = resp
                buf = b""
                try:
                    for chunk in resp.stream(4096):
                        if stop.is_set():
                            return
                        buf += chunk
                        *lines, buf = buf.split(b"\n")
                        for line in lines:
                            put("line", line[:MAX_LINE].decode("utf-8", errors="replace"))
                    if buf:
                        put("line", buf[:MAX_LINE].decode("utf-8", errors="replace"))
                finally:
                    resp.release_conn()
                put("end", {"reason": "ended", "message": f"worker {worker}'s container ended"})
                return
        except ClusterError as err:
            put("end", {"reason": "error", "message": str(err)})
        except Exception as err:  # noqa: BLE001  (a dropped connection: say so, no traceback)
            if not stop.is_set():
                put("end", {"reason": "error", "message": f"the log stream broke ({type(err).__name__})"})

    def close() -> None:
        resp = holder.get("resp")
        if resp is not None:
            # never on the event loop: closing a response another thread is reading blocks until that
            # read returns (a followed log may send nothing for hours), which would stop every request
            threading.Thread(target=_hang_up, args=(resp,), daemon=True, name=f"logs-close-{name}-{worker}").start()

    return relay(reader, name=name, worker=worker, heartbeat_s=heartbeat_s, on_close=close)


async def relay(reader: Callable[[Callable[[str, Any], None], threading.Event], None], *, name: str, worker: int | None = None, heartbeat_s: float,
                on_close: Callable[[], None] | None = None) -> AsyncIterator[str]:
    """The events a ``reader`` puts (``line``, ``wait``, ``pod``, ``end``; any other kind, such as
    the job page's ``state``, is sent as it is; the reader runs on a thread of its own and returns
    when ``stop`` is set) as server-sent events, with heartbeats; the pod logs of the cluster
    (:func:`stream`), the local jobs' logs (trainctl/portal/local_service.py) and the jobs' state
    (trainctl/portal/live.py, no ``worker``)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
    stop = threading.Event()

    def put(kind: str, value: Any) -> None:
        if stop.is_set():
            return
        try:
            loop.call_soon_threadsafe(queue.put_nowait, (kind, value))
        except RuntimeError:  # the loop is gone: the client left
            stop.set()

    thread = threading.Thread(target=reader, args=(put, stop), daemon=True, name=f"logs-{name}-{worker}" if worker is not None else f"state-{name}")
    thread.start()
    waited = False
    try:
        yield ": stream open\n\n"
        while True:
            try:
                kind, value = await asyncio.wait_for(queue.get(), timeout=heartbeat_s)
            except TimeoutError:
                yield ": heartbeat\n\n"
                continue
            if kind == "line":
                yield sse("line", value)
            elif kind == "wait":
                if not waited:
                    yield sse("status", {"message": f"worker {worker} has no started pod yet ({value['status']}); waiting"})
                    waited = True
            elif kind == "pod":
                yield sse("status", {"message": f"reading pod {value['pod']}"})
            elif kind == "end":
                yield sse("end", value)
                return
            else:
                yield sse(kind, value)
    finally:
        stop.set()
        if on_close is not None:
            on_close()


def _hang_up(resp: Any) -> None:
    """End the reader's blocking read (shut the socket down), then close the response."""
    sock = getattr(getattr(resp, "connection", None), "sock", None)
    try:
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        resp.close()
    except Exception:  # noqa: BLE001, S110  (it is going away)
        pass
