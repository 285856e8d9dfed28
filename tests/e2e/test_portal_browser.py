"""The portal's page in a real browser (Debian's chromium, driven by Playwright) against the teams
stack with portal.enabled on a local control plane: a vision user signs in (the ALB's header, as the
ALB sends it on every request), submits from the form, watches the job run and finish, reads a
worker's log stream, clones and edits it, cancels the clone; a form with three mistakes shows three
messages. Screenshots of each page go to out/portal-screenshots/. Needs /usr/bin/chromium
(.ci/run installs it): without it this test fails, saying so."""

from __future__ import annotations

import time

import pytest

from tests.browser import SHOTS, chromium, free_port, serving  # noqa: F401  (SHOTS, free_port: the other browser tests take them from here too)
from tests.e2e.portal_helpers import INSTANCE, STACK, alb_header, alb_keys, portal_configuration, portal_stack, rendered_settings
from trainctl.portal.app import create_app


@pytest.fixture(scope="module")
def served(clusters):
    up = clusters.get(STACK, instance=INSTANCE, stack_config=portal_stack())
    app = create_app(portal_configuration(up), rendered_settings(up), alb_keys=alb_keys)
    with serving(app) as url:
        yield up, url
    clusters.release(STACK, INSTANCE)


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


def _page(browser, up, team: str, user: str):
    ctx = browser.new_context(extra_http_headers=alb_header(up, user, team, exp_in=1800))
    return ctx, ctx.new_page()


def test_a_user_submits_watches_reads_logs_clones_and_cancels(served, browser):
    up, base = served
    SHOTS.mkdir(parents=True, exist_ok=True)
    ctx, page = _page(browser, up, "vision", "alice")
    page.goto(base + "/")
    assert "Jobs in vision" in page.text_content("h1")
    page.screenshot(path=str(SHOTS / "1-jobs.png"), full_page=True)
    page.goto(base + "/submit")
    page.check("input[name=framework][value=pytorch]")
    page.fill("#num_nodes", "2")
    page.check("input[name=preset][value=small]")
    page.fill("#name", "browser-job")
    page.fill("#training_code", "print('hello from the browser')\n")
    page.screenshot(path=str(SHOTS / "2-submit.png"), full_page=True)
    page.click("#submit")
    page.wait_for_url("**/jobs/browser-job**")
    assert "Job submitted." in page.content()
    # watch it run and finish without a reload (the state stream, read as alice through the
    # portal's impersonation), Cancel going with the end; worker 0's log followed from the start
    assert page.locator("#cancel").count() == 1
    loads: list[str] = []
    page.on("load", lambda p: loads.append(p.url))
    deadline = time.monotonic() + 120
    seen: set[str] = set()
    state = ""
    while time.monotonic() < deadline:
        state = page.text_content("#state").strip()
        seen.add(state)
        if state in ("Complete", "Failed"):
            break
        time.sleep(0.5)
    assert state == "Complete", seen
    assert loads == [], loads
    deadline = time.monotonic() + 10
    while page.locator("#cancel").count() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert page.locator("#cancel").count() == 0 and (page.text_content("#announce") or "").startswith("Job browser-job is now Complete")
    deadline = time.monotonic() + 30
    while "simulated (kwok) node" not in (page.text_content("#log") or "") and time.monotonic() < deadline:
        time.sleep(0.3)
    assert "simulated (kwok) node" in (page.text_content("#log") or "")  # worker 0's, with no click on Follow
    page.screenshot(path=str(SHOTS / "3-job-complete.png"), full_page=True)
    # a worker's log stream
    page.select_option("#worker", "1")
    page.click("#follow")
    deadline = time.monotonic() + 30  # (the page's CSP allows no evaluated script: poll from here)
    while "simulated (kwok) node" not in (page.text_content("#log") or "") and time.monotonic() < deadline:
        time.sleep(0.3)
    assert "simulated (kwok) node" in (page.text_content("#log") or "")
    page.screenshot(path=str(SHOTS / "4-log-stream.png"), full_page=True)
    # clone & edit: the form comes back filled in; change the nodes and the name, submit
    page.click("#clone")
    page.wait_for_url("**/submit?clone=browser-job")
    assert page.input_value("#num_nodes") == "2" and "hello from the browser" in page.input_value("#training_code")
    page.fill("#num_nodes", "1")
    page.fill("#name", "browser-job-clone")
    page.screenshot(path=str(SHOTS / "5-clone.png"), full_page=True)
    page.click("#submit")
    page.wait_for_url("**/jobs/browser-job-clone**")
    # cancel it: confirmed, sent as the API's DELETE, the job seen going on its page with no reload
    at = page.url
    page.once("dialog", lambda d: d.accept())
    page.click("#cancel")
    deadline = time.monotonic() + 60
    while page.text_content("#state") != "Deleted" and time.monotonic() < deadline:
        time.sleep(0.3)
    assert page.text_content("#state") == "Deleted"
    assert page.url == at
    page.goto(base + "/")
    assert "browser-job-clone" not in page.text_content("#jobs")
    page.goto(base + "/team")
    assert "no quota in local mode" not in (page.text_content("#quota") or "") and (page.text_content("#gpus-used") or "").startswith("0 ")
    page.screenshot(path=str(SHOTS / "6-team.png"), full_page=True)
    ctx.close()
    # another team's user sees none of it
    ctx, other = _page(browser, up, "nlp", "bob")
    other.goto(base + "/")
    assert "browser-job" not in other.text_content("#jobs")
    r = other.goto(base + "/jobs/browser-job")
    assert r is not None and r.status in (403, 404)
    ctx.close()


def test_a_form_with_three_mistakes_shows_three_messages(served, browser):
    up, base = served
    ctx, page = _page(browser, up, "vision", "alice")
    page.goto(base + "/submit")
    page.fill("#num_nodes", "0")
    page.check("input[name=preset][value=custom]")
    page.fill("#gpu_per_node", "lots")
    page.check("input[name=image_choice][value=custom]")
    page.fill("#image", "not an image")
    page.click("#submit")
    page.wait_for_selector(".field-error")
    errors = page.locator(".field-error")
    assert errors.count() == 3, [errors.nth(i).text_content() for i in range(errors.count())]
    assert {errors.nth(i).get_attribute("data-field") for i in range(3)} == {"config.num_nodes", "config.gpu_per_node", "image"}
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "7-three-mistakes.png"), full_page=True)
    ctx.close()
