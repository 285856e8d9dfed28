"""The portal's "must show", in a real browser (Debian's chromium, driven by Playwright) over
``trainctl ui --local`` (tests/e2e/test_portal_live_browser.py's server): in ONE browser context a
user submits from the form, watches the job run and end, clones it with a changed argument and
cancels the clone, with no page load but the form's own (submit, Clone & edit) and no setting
lost; the job page and the list at 390 px (out/portal-screenshots/narrow-*.png); several
running-job pages open in one context, each live; a job submitted while the list is open (and
empty of running jobs) appears in it; and no page, script or style the portal serves names another
origin. Needs /usr/bin/chromium: without it these tests fail, saying so."""

from __future__ import annotations

import html
import re
import time

import httpx

from tests.e2e.test_portal_browser import SHOTS
from tests.e2e.test_portal_browser import browser as browser  # noqa: F401, PLC0414  (the chromium fixture, shared)
from tests.e2e.test_portal_live_browser import _submit, _until
from tests.e2e.test_portal_live_browser import served as served  # noqa: F401, PLC0414  (the local portal, shared)

ARGS = ("import sys, json, time\nsteps = int(sys.argv[sys.argv.index('--steps') + 1])\nprint('args', ' '.join(sys.argv[1:]), flush=True)\n"
        "for step in range(1, steps + 1):\n"
        "    print('TRAINING_EVENT ' + json.dumps({'event': 'step', 'step': step, 'total_steps': steps, 'loss': 1.0 / step}), flush=True)\n"
        "    time.sleep(0.5)\n"
        "print('done', flush=True)\n")


FIELDS = ("num_nodes", "gpu_per_node", "cpu_per_node", "memory_per_node", "instance_type", "image", "command", "env", "secret_env", "training_code", "requirements")


def _form(base: str, job: str) -> dict[str, str]:
    """The settings Clone & edit fills in for ``job`` (read without the browser)."""
    text = httpx.get(base + "/submit", params={"clone": job}, timeout=30).text
    out = {}
    for f in FIELDS:
        m = re.search(rf'<input[^>]*\bid="{f}"[^>]*\bvalue="([^"]*)"', text) or re.search(rf'<textarea[^>]*\bid="{f}"[^>]*>\n?(.*?)</textarea>', text, re.S)
        assert m, f
        out[f] = html.unescape(m.group(1)).strip()
    return out


def _watch(page):
    """(main-frame navigations, CSP complaints) of ``page``, as they come."""
    navs: list[str] = []
    csp: list[str] = []
    page.on("framenavigated", lambda f: navs.append(f.url) if f == page.main_frame else None)
    page.on("console", lambda m: csp.append(m.text) if "Content Security Policy" in m.text else None)
    return navs, csp


def test_submit_watch_clone_with_a_changed_argument_and_cancel_the_clone_without_a_reload(served, browser):  # noqa: F811
    base = served
    SHOTS.mkdir(parents=True, exist_ok=True)
    ctx = browser.new_context()
    page = ctx.new_page()
    navs, csp = _watch(page)
    page.goto(base + "/submit")
    page.fill("#name", "flow-job")
    page.fill("#command", "python train.py --steps 4")
    page.fill("#training_code", ARGS)
    page.fill("#env", "GREETING=hello")
    page.click("#submit")
    page.wait_for_url("**/jobs/flow-job?submitted=1")
    # it runs and ends, seen live
    _until("the job's argument in its log", lambda: "args --steps 4" in (page.text_content("#log") or ""))
    _until("Complete", lambda: page.text_content("#state") == "Complete", timeout=120)
    _until("the chart", lambda: "4 reported steps" in (page.get_attribute("#chart", "alt") or ""), timeout=30)
    assert page.locator("#cancel").count() == 0
    # clone it: every setting back in the form; one argument changed
    page.click("#clone")
    page.wait_for_url("**/submit?clone=flow-job")
    assert page.input_value("#command") == "python train.py --steps 4" and page.input_value("#training_code").strip() == ARGS.strip()
    assert page.input_value("#env").strip() == "GREETING=hello" and page.input_value("#num_nodes") == "1"
    original = _form(base, "flow-job")
    assert [page.input_value(f"#{f}").strip() for f in FIELDS] == [original[f] for f in FIELDS] and original["gpu_per_node"] == "1"
    page.fill("#name", "flow-clone")
    page.fill("#command", "python train.py --steps 400")
    page.click("#submit")
    page.wait_for_url("**/jobs/flow-clone?submitted=1")
    _until("the changed argument", lambda: "args --steps 400" in (page.text_content("#log") or ""))
    status = httpx.get(base + "/api/trainjob/flow-clone/status", timeout=30).json()
    assert status["nodes"] == 1 and status["gpus"] == 1 and status["status"] == "Running"
    assert _form(base, "flow-clone") == {**original, "command": "python train.py --steps 400"}  # every other setting as the original's
    # cancel the clone: a dismissed confirmation sends nothing; an accepted one deletes it, seen live
    page.once("dialog", lambda d: d.dismiss())
    page.click("#cancel")
    time.sleep(1)
    assert page.text_content("#state") == "Running" and httpx.get(base + "/api/trainjob/flow-clone/status", timeout=30).status_code == 200
    page.once("dialog", lambda d: d.accept())
    page.click("#cancel")
    try:
        _until("Deleted on the page", lambda: page.text_content("#state") == "Deleted", timeout=60)
    except AssertionError as err:
        raise AssertionError(f"{err}: {page.text_content('#state')!r}, {page.text_content('#message')!r}, {page.text_content('#live-status')!r}, {csp}") from None
    assert page.locator("#cancel").count() == 0 and "cancelled" in (page.text_content("#message") or "")
    assert httpx.get(base + "/api/trainjob/flow-clone/status", timeout=30).status_code == 404
    page.screenshot(path=str(SHOTS / "flow-cancelled.png"), full_page=True)
    # the only page loads: the form, its submit, Clone & edit, its submit
    assert navs == [base + "/submit", base + "/jobs/flow-job?submitted=1", base + "/submit?clone=flow-job", base + "/jobs/flow-clone?submitted=1"], navs
    assert csp == [], csp
    ctx.close()


def test_the_job_page_and_list_at_390px_and_a_later_job_appearing_in_the_list(served, browser):  # noqa: F811
    base = served
    SHOTS.mkdir(parents=True, exist_ok=True)
    ctx = browser.new_context(viewport={"width": 390, "height": 844})
    jobs = ctx.new_page()
    jobs.goto(base + "/")  # every job so far has ended (or there is none): the list follows all the same
    _submit(base, "narrow-job", ARGS.replace("steps = int(sys.argv[sys.argv.index('--steps') + 1])", "steps = 6"), nodes=2)
    row = jobs.locator("#jobs tr[data-job=narrow-job] td.state")
    _until("the new job in the open list", lambda: row.count() == 1 and row.text_content() == "Running", timeout=30)
    assert jobs.locator("#jobs tr[data-job=narrow-job] a").get_attribute("href") == "/jobs/narrow-job"
    page = ctx.new_page()
    page.goto(base + "/jobs/narrow-job")
    _until("progress", lambda: "/6" in (page.text_content("#progress") or ""))
    _until("the chart drawn", lambda: page.locator("#chart").evaluate("img => img.complete && img.naturalWidth > 0 && !img.closest('[hidden]')"), timeout=30)
    for p, name in ((page, "narrow-job.png"), (jobs, "narrow-list.png")):
        wide = p.evaluate("document.documentElement.scrollWidth")
        assert wide <= 390 + 1, (name, wide)  # nothing wider than the screen: no sideways scrolling of the page
        p.screenshot(path=str(SHOTS / name), full_page=True)
    _until("Complete", lambda: page.text_content("#state") == "Complete", timeout=120)
    _until("Complete in the list", lambda: row.text_content() == "Complete", timeout=30)
    ctx.close()


def test_several_running_job_pages_in_one_context_stay_live(served, browser):  # noqa: F811
    base = served
    names = [f"many-{i}" for i in range(3)]
    for name in names:
        _submit(base, name, ARGS.replace("steps = int(sys.argv[sys.argv.index('--steps') + 1])", "steps = 16"), nodes=1)
    ctx = browser.new_context()
    pages = []
    for name in names:
        p = ctx.new_page()
        p.goto(base + f"/jobs/{name}")
        pages.append(p)
    for name, p in zip(names, pages, strict=True):
        first = p.text_content("#progress")
        _until(f"{name}'s progress moving", lambda p=p, first=first: p.text_content("#progress") not in (first, "-"), timeout=60)
        _until(f"{name}'s log", lambda p=p: "TRAINING_EVENT" in (p.text_content("#log") or ""), timeout=30)
    for name, p in zip(names, pages, strict=True):
        _until(f"{name} Complete", lambda p=p: p.text_content("#state") == "Complete", timeout=120)
        _until(f"{name}'s chart", lambda p=p: "16 reported steps" in (p.get_attribute("#chart", "alt") or ""), timeout=60)
    ctx.close()


def _links(text: str) -> list[str]:
    return [a or b for a, b in re.findall(r"""(?:src|href|action)\s*=\s*["']([^"']+)["']|url\(\s*["']?([^"')]+)""", text)]


FOREIGN = re.compile(r"(?:https?:)?//[a-zA-Z0-9.-]+\.[a-zA-Z]{2,}[^\s\"'<>)]*")
PAGES = ["/", "/jobs/crawl-job", "/submit", "/submit?clone=crawl-job", "/team", "/help/progress-events", "/api/docs"]


def test_nothing_the_portal_serves_names_or_loads_another_origin(served, browser):  # noqa: F811
    """Every page (jobs, a job, submit, team, help, the API docs) and each script and style they
    load: no URL of another origin in the portal's own (absolute http(s) or protocol-relative;
    the vendored swagger-ui bundle's text is judged by what the browser loads); and in the browser
    every request those pages make goes to the portal itself."""
    base = served
    _submit(base, "crawl-job", "print('hi')\n", nodes=1)
    todo, seen, foreign = list(PAGES), set(), []
    with httpx.Client(base_url=base, timeout=30) as c:
        while todo:
            path = todo.pop()
            if path in seen:
                continue
            seen.add(path)
            r = c.get(path)
            assert r.status_code == 200, (path, r.status_code)
            if not any(k in r.headers.get("content-type", "") for k in ("html", "javascript", "css")):
                continue
            if not path.startswith("/static/swagger-ui/"):
                foreign += [f"{path}: {m.group(0)}" for m in FOREIGN.finditer(r.text) if not m.group(0).startswith("http://www.w3.org/")]
            for url in _links(r.text):
                url = url.replace("&amp;", "&")
                if url.startswith("/static/") or url in PAGES:
                    todo.append(url)
    assert {"/static/live.js", "/static/portal.css", "/static/form.js", "/static/swagger-init.js", "/static/swagger-ui/swagger-ui-bundle.js"} <= seen, seen
    assert foreign == [], foreign
    ctx = browser.new_context()
    page = ctx.new_page()
    requests: list[str] = []
    page.on("request", lambda req: requests.append(req.url))
    for path in PAGES:
        page.goto(base + path)
        time.sleep(1.5)  # what the page's scripts load (a live page's streams never idle: no "networkidle")
    ctx.close()
    assert [u for u in requests if not u.startswith(base + "/") and not u.startswith("data:")] == []
    assert any(u.startswith(base + "/api/openapi") or u.endswith("openapi.json") for u in requests), requests


def test_a_broken_stream_says_so_and_recovers_the_log_once_capped_and_the_focus_kept(served, browser):  # noqa: F811
    base = served
    _submit(base, "retry-job", ARGS.replace("steps = int(sys.argv[sys.argv.index('--steps') + 1])", "steps = 16"), nodes=1)
    _submit(base, "cap-job", "for i in range(6000):\n    print('line', i, flush=True)\nimport time\ntime.sleep(30)\n", nodes=1)
    ctx = browser.new_context()
    page = ctx.new_page()
    calls = {"state": 0, "log": 0}

    def state(route):  # the first state stream refused (an expired session, a restarting portal), the next ones served
        calls["state"] += 1
        route.fulfill(status=502, body="") if calls["state"] == 1 else route.continue_()

    def log(route):  # the first log stream sends a line and drops: the page reads the log again, once
        calls["log"] += 1
        route.fulfill(status=200, headers={"Content-Type": "text/event-stream"}, body="event: line\ndata: a line from the dropped stream\n\n") if calls["log"] == 1 else route.continue_()

    page.route("**/state/stream*", state)
    page.route("**/logs/stream*", log)
    page.goto(base + "/jobs/retry-job")
    _until("updates paused", lambda: "updates paused" in (page.text_content("#live-status") or ""), timeout=10)
    first = page.text_content("#progress")
    _until("live again", lambda: page.text_content("#progress") not in (first, "-") and not page.text_content("#live-status"), timeout=30)
    _until("the log read again", lambda: "args" in (page.text_content("#log") or ""), timeout=30)
    text = page.text_content("#log") or ""
    assert "dropped stream" not in text and text.count("] args") == 1, text
    # a state update leaves the keyboard focus where it was (the workers' cells are updated in place)
    page.focus("#workers .log-button")
    now = page.text_content("#progress")
    _until("another update", lambda: page.text_content("#progress") != now, timeout=30)
    assert page.evaluate("document.activeElement.className") == "log-button"
    # a long log keeps its newest 5000 lines, and says so
    page.goto(base + "/jobs/cap-job")
    _until("the last line", lambda: "line 5999" in (page.text_content("#log") or ""), timeout=60)
    lines = (page.text_content("#log") or "").splitlines()
    assert len(lines) == 5000 and lines[0].endswith("line 1000") and page.is_visible("#log-note")
    ctx.close()
