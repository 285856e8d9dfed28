"""The portal, live: the job's state and the jobs list as server-sent events for both backends (the
cluster's Portal, every read as the caller; LocalPortal with a real short local job), the progress
series and its SVG chart, the documented event format, and the team page's GPUs in both modes."""

from __future__ import annotations

import html
import json
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET

import pytest
from fastapi.testclient import TestClient
from kubernetes import client

from tests.conftest import PROJECT
from trainctl import local, progress, usage
from trainctl.kube import ClusterError, NotAllowed
from trainctl.portal import chart, live, local_service, service
from trainctl.portal.app import Settings, create_app
from trainctl.portal.identity import Caller
from trainctl.portal.local_service import LocalPortal
from trainctl.portal.local_service import caller as local_caller

SVG = "{http://www.w3.org/2000/svg}"


def _events(body: str) -> list[tuple[str, object]]:
    """(event, data) of each server-sent event of ``body``; comments as ("comment", text)."""
    out: list[tuple[str, object]] = []
    for block in body.split("\n\n"):
        if not block.strip():
            continue
        if block.startswith(":"):
            out.append(("comment", block[1:].strip()))
            continue
        kind = next((ln[len("event: "):] for ln in block.splitlines() if ln.startswith("event: ")), "message")
        data = "\n".join(ln[len("data: "):] for ln in block.splitlines() if ln.startswith("data: "))
        out.append((kind, json.loads(data) if data.startswith("{") else data))
    return out


# --- the progress series and its chart ------------------------------------------------------------


def test_the_series_is_every_step_event_merged_with_rank_0s_metric_lines():
    lines = [
        'TRAINING_EVENT {"event": "step", "step": 2, "total_steps": 6, "loss": 1.5, "samples_per_s": 100.0, "time": 1000.0}',
        "[attempt 0 node 0 rank 0] TRAINING_EVENT " + json.dumps({"event": "step", "step": 4, "loss": 1.0, "samples_per_s": 110.0, "time": 1004.0}),
        '{"training_metric": "step", "rank": 0, "step": 4, "step_time_s": 0.5}',  # the platform's metric line: step time
        '{"training_metric": "step", "rank": 1, "step": 4, "step_time_s": 9.0}',  # another rank's: not the job's chart
        'TRAINING_EVENT {"event": "checkpoint", "step": 4}',  # not progress
        'TRAINING_EVENT {"event": "step", "step": 5, "loss": "NaN", "samples_per_s": Infinity}',  # no finite numbers: the step only
        'TRAINING_EVENT {"event": "step", "step": true}',  # not a step number
        "TRAINING_EVENT {not json",
        'TRAINING_EVENT {"event": "step", "step": 6, "loss": 0.5, "time": 1008.0}',
        'TRAINING_EVENT {"event": "step", "step": 2, "total_steps": 6, "loss": 1.4, "time": 1010.0}',  # a restarted attempt's report of step 2 replaces it
    ]
    points = progress.series(lines)
    assert [p["step"] for p in points] == [2, 4, 5, 6]
    assert points[0] == {"step": 2, "loss": 1.4}
    assert points[1] == {"step": 4, "loss": 1.0, "samples_per_s": 110.0, "step_time_s": 0.5}
    assert points[2] == {"step": 5}
    assert points[3] == {"step": 6, "loss": 0.5}  # step 5 has no time: no step time derived across it
    derived = progress.series(['TRAINING_EVENT {"event": "step", "step": 10, "time": 100}', 'TRAINING_EVENT {"event": "step", "step": 20, "time": 105}'])
    assert derived[1]["step_time_s"] == 0.5 and "time" not in derived[1]


def test_the_documented_example_prints_events_the_series_reads_and_is_the_docs_and_the_help_pages():
    out = subprocess.run([sys.executable, "-c", progress.EXAMPLE], capture_output=True, text=True, check=True, timeout=30).stdout.splitlines()
    assert len(progress.EXAMPLE.splitlines()) == 3
    points = progress.series(out)
    assert len(points) == 100 and points[-1] == {"step": 100, "loss": 0.02, "samples_per_s": 512.0, "step_time_s": 0.25}
    assert progress.text(progress.of_lines(out)) == "100/100"
    doc = (PROJECT / "docs" / "progress-events.md").read_text()
    assert progress.EXAMPLE in doc
    for name, _ in progress.DOCUMENTED_FIELDS:
        assert f"| `{name}` |" in doc
    assert f"last {service.SERIES_LINES} lines" in doc and f"last {local_service.SERIES_BYTES // 2**20} MiB" in doc  # what the chart reads, as the code reads it
    assert "docs/progress-events.md" in (PROJECT / "README.md").read_text() and "progress-events.md" in (PROJECT / "docs" / "trainctl.md").read_text()
    app = create_app(None, Settings(mode="local", local_caller=local_caller(), allowed_hosts=()), backend=LocalPortal())
    page = TestClient(app).get("/help/progress-events")
    assert page.status_code == 200 and progress.EXAMPLE in html.unescape(page.text)


def _points(n: int) -> list[dict]:
    return [{"step": s, "loss": 4.0 / s, "tokens_per_s": 1000.0 + s, "samples_per_s": 5.0} for s in range(1, n + 1)]


def test_the_chart_draws_one_panel_per_metric_on_its_own_scale():
    root = ET.fromstring(chart.svg(_points(40)))
    panels = {g.get("data-metric"): g for g in root.iter(f"{SVG}g")}
    assert list(panels) == ["loss", "throughput", "step_time_s"]
    loss = panels["loss"].find(f"{SVG}polyline")
    assert loss is not None
    xy = [tuple(map(float, p.split(","))) for p in (loss.get("points") or "").split()]
    assert len(xy) == 40
    assert xy[0][0] < xy[-1][0] and xy[0][1] < xy[-1][1]  # steps left to right; the loss falls (SVG's y grows downwards)
    assert "tokens" in "".join(panels["throughput"].itertext())  # tokens/s where the events give it, before samples/s
    assert panels["step_time_s"].find(f"{SVG}polyline") is None and "no step time in the events" in "".join(panels["step_time_s"].itertext())
    assert "40 reported steps, 1 to 40" in (root.findtext(f"{SVG}title") or "")


def test_a_long_series_is_thinned_to_the_newest_step_and_no_events_draw_no_line():
    root = ET.fromstring(chart.svg(_points(5000)))
    line = next(p for p in root.iter(f"{SVG}polyline") if p.get("data-metric") == "loss")
    pts = (line.get("points") or "").split()
    assert len(pts) <= chart.MAX_DRAWN + 1 and pts[-1].startswith(f"{chart.WIDTH - chart.PAD_R:.1f},")
    empty = ET.fromstring(chart.svg([]))
    assert list(empty.iter(f"{SVG}polyline")) == [] and empty.findtext(f"{SVG}title") == "No progress events yet."


# --- the state stream, the cluster's portal ---------------------------------------------------------


def _status(state: str, restarts: int = 0, step: int | None = None) -> dict:
    return {"trainjob_name": "j", "namespace": "vision", "status": state, "message": f"<b>{state}</b>", "nodes": 2, "gpus": 2, "restarts": restarts,
            "progress": {"step": step} if step else None, "progress_text": f"{step}/9" if step else "-", "started_at": "t0", "completed_at": "t1" if state == "Complete" else None,
            "workers": [{"pod": "j-node-0-0-a", "worker": 0, "phase": "Running", "waiting": None, "node": "n", "restarts": restarts}]}


ME = Caller(name="alice", namespace="vision", headers={"Impersonate-User": ["alice"], "Impersonate-Group": ["portal:vision"]})


def _cluster_app(script: list, *, heartbeat_s: float = 15.0, poll_s: float = 0.05):
    """The cluster's app whose Portal.status answers ``script`` in turn (the last forever) and
    records the caller of each read."""
    cfg = client.Configuration()
    cfg.host = "https://127.0.0.1:9"
    app = create_app(cfg, Settings(mode="local", local_caller=ME, heartbeat_s=heartbeat_s, poll_s=poll_s))
    seen: list[tuple[Caller, str, str]] = []

    def status(caller, namespace, name, *, light=False):
        assert light  # a stream's reads are the light status (no namespace-wide event lists)
        seen.append((caller, namespace, name))
        found = script[min(len(seen) - 1, len(script) - 1)]
        if isinstance(found, Exception):
            raise found
        return found

    app.state.portal.status = status
    return app, seen


def test_the_state_stream_sends_each_change_and_ends_when_the_job_finishes_every_read_as_the_caller():
    script = [_status("Queued"), _status("Running"), _status("Running"), _status("Running", restarts=1, step=3), _status("Complete", restarts=1, step=9)]
    app, seen = _cluster_app(script)
    with TestClient(app) as c, c.stream("GET", "/api/trainjob/j/state/stream") as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        body = r.read().decode()
    events = _events(body)
    states = [d for k, d in events if k == "state"]
    assert [(s["status"], s["restarts"], s["progress_text"]) for s in states] == [("Queued", 0, "-"), ("Running", 0, "-"), ("Running", 1, "3/9"), ("Complete", 1, "9/9")]  # type: ignore[index]
    assert [s["actions"] for s in states] == [{"cancel": True}] * 3 + [{"cancel": False}]  # type: ignore[index]
    assert states[-1]["finished"] is True and states[-1]["message"] == "<b>Complete</b>"  # type: ignore[index]  (data, as data: the page sets it as text)
    assert events[-1] == ("end", {"reason": "finished", "message": "the job has finished (Complete)", "status": "Complete"})
    assert len(seen) == len(script) and all(s == (ME, "vision", "j") for s in seen)  # every read the caller's, none after the end


def test_the_state_stream_sends_heartbeats_and_ends_when_the_job_is_deleted():
    gone = ClusterError("trainjob j not found in namespace vision")
    app, _ = _cluster_app([_status("Running")] * 12 + [gone], heartbeat_s=0.05, poll_s=0.05)
    with TestClient(app) as c, c.stream("GET", "/api/trainjob/j/state/stream") as r:
        events = _events(r.read().decode())
    assert ("comment", "heartbeat") in events
    assert len([e for e in events if e[0] == "state"]) == 1  # nothing changed: one state
    assert events[-1] == ("end", {"reason": "gone", "message": "the job is gone (deleted)", "status": None})


def test_a_refused_or_missing_job_is_refused_before_any_stream_as_the_api_server_said():
    refused = NotAllowed("get", "trainjobs", "vision", user="alice")
    app, seen = _cluster_app([refused])
    with TestClient(app) as c:
        r = c.get("/api/trainjob/j/state/stream")
        assert r.status_code == 403 and r.json()["problems"][0]["refused_as"] == "alice"
        app.state.portal.status = lambda *a, **_: (_ for _ in ()).throw(ClusterError("trainjob j not found in namespace vision"))
        assert c.get("/api/trainjob/j/state/stream").status_code == 404
    assert seen == [(ME, "vision", "j")]


def test_a_client_that_leaves_stops_the_reads():
    app, seen = _cluster_app([_status("Running")], poll_s=0.05)
    with TestClient(app) as c:
        with c.stream("GET", "/api/trainjob/j/state/stream") as r:
            for line in r.iter_lines():
                if line.startswith("event: state"):
                    break
        time.sleep(0.5)
        after = len(seen)
        time.sleep(0.5)
        assert len(seen) == after  # the reader thread has stopped with the client
        assert not [t for t in threading.enumerate() if t.name == "state-j"]


def test_the_jobs_stream_follows_the_rows_and_goes_on_when_none_is_running_so_a_later_job_appears():
    cfg = client.Configuration()
    cfg.host = "https://127.0.0.1:9"
    app = create_app(cfg, Settings(mode="local", local_caller=ME, poll_s=0.05))
    rows = [[{"trainjob_name": "a", "status": "Queued", "queue": {"position": 0, "ahead": [], "estimated": False}, "progress": "-", "gpus": 2, "age_s": 1}],
            [{"trainjob_name": "a", "status": "Running", "progress": "1/9", "gpus": 2, "age_s": 2}],
            [{"trainjob_name": "a", "status": "Failed", "progress": "-", "gpus": 2, "age_s": 3}],
            [{"trainjob_name": "a", "status": "Failed", "progress": "-", "gpus": 2, "age_s": 3}],
            [{"trainjob_name": "b", "status": "Running", "progress": "-", "gpus": 1, "age_s": 0}, {"trainjob_name": "a", "status": "Failed", "progress": "-", "gpus": 2, "age_s": 4}]]
    calls: list[Caller] = []

    def listing(caller, namespace, *, with_progress=True):  # noqa: ARG001
        calls.append(caller)
        return rows[min(len(calls) - 1, len(rows) - 1)]

    app.state.portal.list = listing
    events: list[dict] = []
    with TestClient(app) as c, c.stream("GET", "/api/trainjobs/stream") as r:
        block: list[str] = []
        for line in r.iter_lines():
            block.append(line)
            if line.startswith("data: "):
                events.append({"kind": block[-2][len("event: "):], "data": json.loads(line[len("data: "):])})
                if len(events[-1]["data"].get("items", [])) == 2:
                    break
    jobs = [e["data"]["items"] for e in events]
    assert [e["kind"] for e in events] == ["jobs"] * 4  # no end once job a has failed: the list goes on following
    assert [(j[0]["status"], j[0]["queue"]) for j in jobs[:3]] == [("Queued", {"position": 1, "ahead": [], "estimated": False, "source": None}), ("Running", None), ("Failed", None)]
    assert [j["trainjob_name"] for j in jobs[-1]] == ["b", "a"] and all(c_ is ME for c_ in calls)


def test_the_snapshot_names_the_queue_position_from_one():
    snap = live.snapshot({**_status("Queued"), "queue": {"position": 2, "ahead": ["x", "y"], "estimated": True, "source": "Workloads"}})
    assert snap["queue"] == {"position": 3, "ahead": ["x", "y"], "estimated": True, "source": "Workloads"} and snap["actions"] == {"cancel": True}


# --- the team's GPUs ------------------------------------------------------------------------------


def _workload(name: str, gpus: int, flavor: str, *, finished: bool = False) -> dict:
    conds = [{"type": "Admitted", "status": "True", "lastTransitionTime": "2026-11-28T10:00:00Z"}]
    if finished:
        conds.append({"type": "Finished", "status": "True", "lastTransitionTime": "2026-11-28T11:00:00Z"})
    return {"metadata": {"name": name, "namespace": "vision"}, "status": {"conditions": conds, "admission": {"clusterQueue": "team-vision", "podSetAssignments": [
        {"name": "node", "count": 2, "flavors": {"nvidia.com/gpu": flavor, "cpu": flavor}, "resourceUsage": {"nvidia.com/gpu": str(gpus), "cpu": "8"}}]}}}


def test_borrowing_is_what_kueue_admitted_beyond_the_quota_flavor_by_flavor():
    wls = [_workload("a", 4, "g5"), _workload("b", 4, "g5"), _workload("c", 2, "g6"), _workload("d", 8, "g5", finished=True)]
    assert usage.borrowed(wls, 6) == 2  # g5: 8 held, 6 nominal; g6: 2 of 6
    assert usage.borrowed(wls, 8) == 0 and usage.borrowed(wls, 1) == 7 + 1


def _trainjob(name: str, nodes: int, gpus: int, running: bool) -> dict:
    return {"metadata": {"name": name, "creationTimestamp": "2026-11-28T10:00:00Z", "labels": {}},
            "spec": {"trainer": {"numNodes": nodes, "resourcesPerNode": {"limits": {"nvidia.com/gpu": gpus}}}},
            "status": {"jobsStatus": [{"active": nodes}] if running else []}}


def test_the_cluster_team_counts_the_running_jobs_requests_and_kueues_borrowing():
    class Kube:
        def all_workloads(self, *, all_namespaces):
            assert all_namespaces is False
            return [_workload("trainjob-a-1", 2, "g5"), _workload("trainjob-b-1", 4, "g5")]

        def list_trainjobs(self):
            return [_trainjob("a", 2, 1, True), _trainjob("b", 1, 4, True), _trainjob("c", 4, 1, False)]

        def platform_facts(self):
            return None

    cfg = client.Configuration()
    cfg.host = "https://127.0.0.1:9"
    app = create_app(cfg, Settings(mode="local", local_caller=ME))
    portal = app.state.portal
    used: list[Caller] = []
    portal.kube = lambda caller, ns: used.append(caller) or Kube()
    portal._pending = lambda kube: {"source": "Kueue", "estimated": False, "items": []}
    team = portal.team(Caller(name="alice", namespace="vision", team="vision", gpu_quota=4), "vision")
    assert team["gpus_used"] == 6 and [(r["job"], r["gpus"]) for r in team["running"]] == [("a", 2), ("b", 4)]
    assert team["gpu_quota"] == 4 and team["gpus_borrowed"] == 2 and team["local"] is False
    page = TestClient(app).get("/team")
    assert page.status_code == 200 and "6 (what the running jobs ask for)" in page.text and "no quota in local mode" not in page.text


# --- local mode, with a real short job -------------------------------------------------------------

PORT = 8767
REPORTS = ("import os, json, time\nrank = int(os.environ['RANK'])\ntime.sleep(1.5)\n"
           "for step in range(1, 7):\n"
           "    if rank == 0:\n"
           "        print('TRAINING_EVENT ' + json.dumps({'event': 'step', 'step': step, 'total_steps': 6, 'loss': 3.0 / step, 'samples_per_s': 100.0 + step, 'step_time_s': 0.4}), flush=True)\n"
           "    time.sleep(0.4)\n")


@pytest.fixture
def ui(tmp_path, monkeypatch):
    from trainctl.ui import build_local

    monkeypatch.setenv(local.HOME_ENV, str(tmp_path / "state"))
    app, _ = build_local(PORT)
    app.state.settings = Settings(mode="local", local_caller=local_caller(), allowed_hosts=app.state.settings.allowed_hosts, poll_s=0.2)
    with TestClient(app, base_url=f"http://127.0.0.1:{PORT}") as c:
        yield c
    for job in local.jobs():
        local.delete(job["name"])


@pytest.mark.slow
def test_a_local_job_is_followed_to_complete_its_events_charted_and_its_gpus_counted(ui):
    r = ui.post("/api/trainjob/create", json={"namespace": "local", "framework": "pytorch", "training_code": REPORTS, "name": "reports", "config": {"num_nodes": 2, "gpu_per_node": 1}})
    assert r.status_code == 200, r.text
    team = ui.get("/api/team").json()
    assert team["gpus_used"] == 2 and team["running"][0]["gpus"] == 2 and team["gpu_quota"] is None
    page = ui.get("/team").text
    assert "no quota in local mode" in page and "unknown" not in page
    with ui.stream("GET", "/api/trainjob/reports/state/stream") as s:
        events = _events(s.read().decode())
    states = [d for k, d in events if k == "state"]
    assert states[0]["status"] == "Running" and states[0]["actions"] == {"cancel": True}  # type: ignore[index]
    assert states[-1]["status"] == "Complete" and states[-1]["actions"] == {"cancel": False} and states[-1]["finished"]  # type: ignore[index]
    assert any(s["progress_text"] not in ("-", "6/6") for s in states[:-1]), states  # type: ignore[index]  (progress followed while it ran)
    assert events[-1] == ("end", {"reason": "finished", "message": "the job has finished (Complete)", "status": "Complete"})
    found = ui.get("/api/trainjob/reports/progress").json()
    assert [p["step"] for p in found["points"]] == [1, 2, 3, 4, 5, 6] and found["points"][-1] == {"step": 6, "loss": 0.5, "samples_per_s": 106.0, "step_time_s": 0.4}
    svg = ui.get("/api/trainjob/reports/chart.svg")
    assert svg.headers["content-type"].startswith("image/svg+xml")
    assert len([p for p in ET.fromstring(svg.text).iter(f"{SVG}polyline")]) == 3
    job = ui.get("/jobs/reports").text
    assert 'id="cancel"' not in job and 'id="chart-figure" hidden' not in job and "6 reported steps" in job
    assert ui.get("/api/team").json()["gpus_used"] == 0
    # a finished job's stream: its state once, and the end
    with ui.stream("GET", "/api/trainjob/reports/state/stream") as s:
        assert [k for k, _ in _events(s.read().decode()) if k != "comment"] == ["state", "end"]
    assert ui.get("/api/trainjob/nope/state/stream").status_code == 404


def test_a_local_job_page_without_events_links_to_the_format_and_labels_its_worker_select(ui, tmp_path):  # noqa: ARG001
    d = local.home() / "jobs" / "quiet"
    d.mkdir(parents=True)
    (d / "job.json").write_text(json.dumps({"name": "quiet", "nodes": 1, "submitted_at": time.time()}))
    (d / "result.json").write_text(json.dumps({"status": "Complete", "restarts": 0}))
    (d / "output.log").write_text("[attempt 0 node 0 rank 0] hello\n")
    page = ui.get("/jobs/quiet").text
    assert 'id="chart-figure" hidden' in page and 'href="/help/progress-events"' in page
    assert '<label for="worker">' in page and 'aria-live' not in page.split('<pre id="log"', 1)[1].split(">", 1)[0]
    assert 'role="status" aria-live="polite"' in page and 'id="cancel"' not in page
