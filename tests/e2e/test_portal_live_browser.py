"""The portal's live pages in a real browser (Debian's chromium, driven by Playwright) over
``trainctl ui --local`` (LocalPortal: real local jobs, no control plane): a job page opened while the
job runs follows worker 0's log without a click, its progress and chart, and its end (Running ->
Complete, Running -> Failed) without a reload, Cancel going away; the jobs list follows its rows.
Screenshots go to out/portal-screenshots/live-*.png. Needs /usr/bin/chromium: without it this test
fails, saying so."""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET

import httpx
import pytest

from tests.browser import SHOTS, free_port, serving
from tests.e2e.test_portal_browser import browser as browser  # noqa: F401, PLC0414  (the module's chromium fixture, shared)
from trainctl import local
from trainctl.portal.app import Settings
from trainctl.portal.local_service import caller as local_caller

REPORTS = ("import os, json, time\nrank = int(os.environ['RANK'])\nprint('worker', rank, 'starts <b>bold</b>', flush=True)\ntime.sleep(3)\n"
           "for step in range(1, 9):\n"
           "    if rank == 0:\n"
           "        print('TRAINING_EVENT ' + json.dumps({'event': 'step', 'step': step, 'total_steps': 8, 'loss': 2.0 / step, 'samples_per_s': 50.0 + step, 'step_time_s': 0.5}), flush=True)\n"
           "    time.sleep(0.5)\n"
           "print('worker', rank, 'done', flush=True)\n")
FAILS = "import time, sys\nprint('about to fail', flush=True)\ntime.sleep(4)\nsys.exit(3)\n"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from trainctl.ui import build_local

    mp = pytest.MonkeyPatch()
    mp.setenv(local.HOME_ENV, str(tmp_path_factory.mktemp("live") / "state"))
    port = free_port()
    app, _ = build_local(port)
    app.state.settings = Settings(mode="local", local_caller=local_caller(), allowed_hosts=app.state.settings.allowed_hosts, poll_s=0.5)
    with serving(app, port) as url:
        yield url
    for job in local.jobs():
        local.delete(job["name"])
    mp.undo()


def _submit(base: str, name: str, code: str, nodes: int = 2) -> None:
    r = httpx.post(base + "/api/trainjob/create", json={"namespace": "local", "framework": "pytorch", "training_code": code, "name": name, "config": {"num_nodes": nodes, "gpu_per_node": 1}}, timeout=60)
    assert r.status_code == 200, r.text


def _until(what: str, check, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_job_page_follows_the_log_progress_chart_and_end_without_a_reload(served, browser):  # noqa: F811
    base = served
    SHOTS.mkdir(parents=True, exist_ok=True)
    _submit(base, "live-job", REPORTS)
    page = browser.new_page()
    loads: list[str] = []
    page.on("load", lambda p: loads.append(p.url))
    page.goto(base + "/jobs/live-job")
    assert page.text_content("#state") == "Running" and page.is_visible("#cancel")
    assert page.get_attribute("label[for=worker]", "for") == "worker" and page.get_attribute("#log", "aria-live") is None
    # worker 0's log, followed with no click on Follow
    _until("worker 0's first line", lambda: "worker 0 starts" in (page.text_content("#log") or ""))
    assert "worker 1" not in (page.text_content("#log") or "")
    assert "worker 0 starts <b>bold</b>" in (page.text_content("#log") or "") and page.locator("#log b").count() == 0  # the job's text, as text
    _until("progress on the page", lambda: "/8" in (page.text_content("#progress") or ""))
    page.screenshot(path=str(SHOTS / "live-1-running.png"), full_page=True)
    # the end, seen without a reload: the state, Cancel gone, the status region says it
    _until("Complete on the page", lambda: page.text_content("#state") == "Complete", timeout=180)
    _until("Cancel removed", lambda: page.locator("#cancel").count() == 0)
    assert loads == [base + "/jobs/live-job"], loads  # one load: no reload happened
    assert "Complete" in (page.text_content("#announce") or "")
    assert page.text_content("#finished") != "-" and "state-complete" in (page.get_attribute("#state", "class") or "")
    _until("worker 0's last line", lambda: "worker 0 done" in (page.text_content("#log") or ""))
    # the chart, drawn from the job's eight step events
    _until("the chart shown", lambda: page.is_visible("#chart") and "8 reported steps" in (page.get_attribute("#chart", "alt") or ""))
    assert page.is_hidden("#chart-none")
    svg = page.request.get(base + (page.get_attribute("#chart", "src") or ""))
    assert svg.ok and svg.headers["content-type"].startswith("image/svg+xml")
    lines = {p.get("data-metric"): (p.get("points") or "").split() for p in ET.fromstring(svg.text()).iter("{http://www.w3.org/2000/svg}polyline")}
    assert {k: len(v) for k, v in lines.items()} == {"loss": 8, "throughput": 8, "step_time_s": 8}
    _until("the image loaded", lambda: page.locator("#chart").evaluate("img => img.complete && img.naturalWidth > 0"), timeout=10)
    page.screenshot(path=str(SHOTS / "live-2-complete-chart.png"), full_page=True)
    # the Follow control still switches worker
    page.select_option("#worker", "1")
    page.click("#follow")
    _until("worker 1's log", lambda: "worker 1 done" in (page.text_content("#log") or ""))
    assert "worker 0" not in (page.text_content("#log") or "")
    page.close()


def test_a_failing_job_turns_failed_on_its_page_and_in_the_list_without_a_reload(served, browser):  # noqa: F811
    base = served
    _submit(base, "live-fails", FAILS, nodes=1)
    jobs = browser.new_page()
    jobs.goto(base + "/")
    row = jobs.locator("#jobs tr[data-job=live-fails] td.state")
    page = browser.new_page()
    page.goto(base + "/jobs/live-fails")
    assert page.text_content("#state") == "Running" and page.is_visible("#cancel")
    assert row.text_content() == "Running"
    assert "No progress events" in (page.text_content("#chart-none") or "") and page.get_attribute("#chart-none a", "href") == "/help/progress-events"
    _until("Failed on the page", lambda: page.text_content("#state") == "Failed", timeout=180)
    _until("Cancel removed", lambda: page.locator("#cancel").count() == 0)
    assert "NonRetryableExit" in (page.text_content("#message") or "")  # exit code 3: failed at once (the launcher's failure policy)
    assert (page.text_content("#announce") or "").startswith("Job live-fails is now Failed")
    page.screenshot(path=str(SHOTS / "live-3-failed.png"), full_page=True)
    _until("Failed in the list", lambda: row.text_content() == "Failed", timeout=30)
    assert "state-failed" in (row.get_attribute("class") or "")
    jobs.screenshot(path=str(SHOTS / "live-4-list.png"), full_page=True)
    page.goto(base + "/help/progress-events")
    assert "TRAINING_EVENT" in (page.text_content("#example") or "")
    jobs.close()
    page.close()
