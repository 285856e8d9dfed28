"""The live pages' cost and robustness: what a stream reads and how often (the light status, the
default polls, the list's slow polling, one log read per chart refresh), the pages' scripts kept
to files (the CSP refuses inline script and handlers) and the list's script always loaded, the
job page's script holding to its limits; negative losses charted."""

from __future__ import annotations

import re
import threading

from fastapi.testclient import TestClient
from kubernetes import client

from tests.conftest import PROJECT
from trainctl import progress
from trainctl.portal import live, logs
from trainctl.portal.app import Settings, create_app
from trainctl.portal.identity import Caller
from trainctl.portal.pages import HERE
from trainctl.portal.service import Portal

ME = Caller(name="alice", namespace="vision", headers={"Impersonate-User": ["alice"], "Impersonate-Group": ["portal:vision"]})
TEMPLATES = HERE / "templates"
LIVE_JS = (HERE / "static" / "live.js").read_text()


def _cluster_app() -> tuple:
    cfg = client.Configuration()
    cfg.host = "https://127.0.0.1:9"
    return create_app(cfg, Settings(mode="local", local_caller=ME)), cfg


def test_no_template_has_an_inline_handler_or_script_body():
    """The pages' CSP (default-src 'self') refuses inline script: a handler such as onsubmit would
    silently not run (the job page's Cancel went through unconfirmed)."""
    bad = []
    for t in sorted(TEMPLATES.glob("*.html")):
        text = t.read_text()
        bad += [f"{t.name}: {m.group(0)}" for m in re.finditer(r"<[a-zA-Z][^>]*\son[a-z]+\s*=", text)]
        bad += [f"{t.name}: inline script" for m in re.finditer(r"<script\b([^>]*)>(.*?)</script>", text, re.S) if "src=" not in m.group(1) or m.group(2).strip()]
        bad += [f"{t.name}: javascript: URL" for _ in re.finditer(r"javascript:", text, re.I)]
    assert bad == []


def test_the_job_page_confirms_and_cancels_by_the_apis_delete_in_its_script_keeping_the_form_for_no_script():
    job = (TEMPLATES / "job.html").read_text()
    assert 'method="post" action="/jobs/{{ job.trainjob_name | urlencode }}/cancel" id="cancel-form"' in job  # the fallback without script
    assert "window.confirm(" in LIVE_JS and 'method: "DELETE"' in LIVE_JS and '"x-csrf-token"' in LIVE_JS and 'credentials: "same-origin"' in LIVE_JS


def test_the_job_pages_script_closes_its_streams_caps_its_log_and_retries():
    assert LIVE_JS.count("new EventSource(") == 1  # one place opens streams: resilient(), with its retry
    assert 'addEventListener("pagehide"' in LIVE_JS and "LOG_KEEP = 5000" in LIVE_JS and "updates paused" in LIVE_JS
    assert "setInterval" not in LIVE_JS  # nothing on a timer (the chart is read when the progress changes)


def test_the_jobs_list_loads_its_script_when_it_is_empty():
    app, _ = _cluster_app()
    app.state.portal.list = lambda caller, namespace, **_: []
    with TestClient(app) as c:
        page = c.get("/").text
    assert '<script src="/static/live.js"></script>' in page and "No jobs yet" in page


def test_the_streams_poll_every_5_s_and_a_missing_pod_every_2_to_3_s():
    assert Settings(mode="local").poll_s == 5.0
    assert 2.0 <= logs.WAIT_POLL_S <= 3.0 and (logs.stream.__kwdefaults__ or {})["poll_s"] == logs.WAIT_POLL_S


class _Stop(threading.Event):
    """A stop whose waits are recorded (and do not wait); it stops after ``n`` of them."""

    def __init__(self, n: int):
        super().__init__()
        self.waits: list[float] = []
        self.n = n

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(float(timeout or 0))
        return len(self.waits) >= self.n


def test_the_list_reads_slower_while_nothing_runs_and_never_ends_for_it():
    reads = [[{"trainjob_name": "a", "status": "Running"}], [{"trainjob_name": "a", "status": "Complete"}], [], []]
    put: list[tuple[str, object]] = []
    reader = live._follow(lambda: reads.pop(0), reads.pop(0), lambda jobs: {"items": [live.row(j) for j in jobs]}, lambda _: None, kind="jobs", poll_s=5.0, gone=(),
                          slow=lambda rows: all(r["finished"] for r in rows["items"]))
    stop = _Stop(4)
    reader(lambda k, v: put.append((k, v)), stop)
    assert stop.waits == [5.0, 5.0 * live.SLOW, 5.0 * live.SLOW, 5.0 * live.SLOW]
    assert [k for k, _ in put] == ["jobs"] * 3  # Running, Complete, none: no end


class _Kube:
    """The reads a status makes, recorded."""

    def __init__(self):
        self.calls: list[tuple] = []

    def get_trainjob(self, name):
        self.calls.append(("get_trainjob", name))
        return {"metadata": {"name": name, "namespace": "vision", "creationTimestamp": "2026-01-01T00:00:00Z"}, "spec": {"trainer": {"numNodes": 1}, "runtimeRef": {"name": "torch-distributed"}}, "status": {}}

    def pods(self, name):
        self.calls.append(("pods", name))
        return []

    def events(self, kind, name=None):
        self.calls.append(("events", kind, name))
        return []

    def log_tail(self, pod, lines=40):
        self.calls.append(("log_tail", pod, lines))
        return ['TRAINING_EVENT {"event": "step", "step": 1, "loss": -0.5}']


def test_the_streams_status_reads_no_namespace_wide_event_list():
    _, cfg = _cluster_app()
    portal = Portal(cfg)
    kube = _Kube()
    portal.kube = lambda caller, namespace: kube  # type: ignore[method-assign]
    full = portal.status(ME, "vision", "j")
    assert ("events", "Pod", None) in kube.calls and ("events", "Workload", None) in kube.calls
    kube.calls.clear()
    light = portal.status(ME, "vision", "j", light=True)
    assert [c for c in kube.calls if c[0] == "events"] == [("events", "TrainJob", "j")]
    assert live.snapshot(light) == live.snapshot(full)


def test_a_chart_refresh_reads_the_log_once():
    """The page reads /progress (the alt text, the number of points), then the image: one log read."""
    app, _ = _cluster_app()
    kube = _Kube()
    pod = {"metadata": {"name": "j-node-0-0-a", "uid": "u1"}}
    app.state.portal.worker_pod = lambda caller, namespace, name, worker: (kube, {}, pod)
    with TestClient(app) as c:
        found = c.get("/api/trainjob/j/progress").json()
        assert c.get("/api/trainjob/j/chart.svg").status_code == 200
    assert found["points"] == [{"step": 1, "loss": -0.5}]
    assert [c_ for c_ in kube.calls if c_[0] == "log_tail"] == [("log_tail", "j-node-0-0-a", 20000)]


def test_a_negative_loss_is_charted_a_negative_rate_left_out():
    points = progress.series(['TRAINING_EVENT {"event": "step", "step": 3, "loss": -1.25, "samples_per_s": -4, "step_time_s": 0.5}'])
    assert points == [{"step": 3, "loss": -1.25, "step_time_s": 0.5}]
    assert "negative `loss` is charted" in (PROJECT / "docs" / "progress-events.md").read_text()
