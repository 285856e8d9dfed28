"""The submit form in a real browser (Debian's chromium, driven by Playwright) against ``trainctl ui
--local`` (LocalPortal: the jobs run on this machine through the emulator, no Kubernetes): a job
with arguments, three uploaded files and variables is cloned and resubmitted unchanged and both
jobs' objects are the same; the form at a phone's width (390 px) keeps each radio button with its
label and does not scroll sideways; the header is one line at 1280 px; the form is submitted with
the keyboard alone; problems are tied to their fields and listed in a summary whose links focus
them; /api/docs renders from the portal's own files under its CSP, asking no other origin.
Screenshots go to out/portal-screenshots/. Needs /usr/bin/chromium (.ci/run installs it)."""

from __future__ import annotations

import time

import pytest
import yaml

from tests.browser import SHOTS, chromium, free_port, serving
from trainctl import local
from trainctl.ui import build_local

pytestmark = pytest.mark.slow  # runs training processes (the emulator) and a browser


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(local.HOME_ENV, str(tmp_path_factory.mktemp("trainctl-state")))
        port = free_port()
        app, _ = build_local(port)
        with serving(app, port) as url:
            yield url
        for job in local.jobs():  # nothing this module started keeps running
            local.delete(job["name"])


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


def _objects(name: str) -> tuple[dict, dict]:
    docs = list(yaml.safe_load_all((local.job_dir(name) / "objects.yaml").read_text()))
    return next(d for d in docs if d["kind"] == "ConfigMap"), next(d for d in docs if d["kind"] == "TrainJob")


def _unnamed(tj: dict, name: str) -> str:
    """The TrainJob as YAML with its own name (and the directories named after it) written NAME."""
    return yaml.safe_dump(tj, sort_keys=True).replace(name, "NAME")


def _wait_ended(page, base: str, name: str, timeout: float = 180) -> str:
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        state = page.request.get(f"{base}/api/trainjob/{name}/status").json()["status"]
        if state in ("Complete", "Failed"):
            return state
        time.sleep(1)
    return state


def test_a_clone_of_a_job_with_arguments_three_files_and_env_resubmitted_unchanged_is_the_same_job(served, browser, tmp_path):
    base = served
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("import os, sys\nprint('args', sys.argv[1:], os.environ['WANDB_PROJECT'], open(sys.argv[-1]).read().strip(), flush=True)\n")
    (code / "a.yaml").write_text("lr: 0.1\n")
    (code / "vocab.bin").write_bytes(bytes(range(256)))
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    page = ctx.new_page()
    page.goto(base + "/submit")
    page.check("#code_source-upload")
    page.set_input_files("#files", [str(code / "train.py"), str(code / "a.yaml"), str(code / "vocab.bin")])
    page.fill("#name", "orig")
    page.fill("#command", "python train.py --epochs 30 a.yaml")
    page.fill("#env", "WANDB_PROJECT=mnist\nNCCL_DEBUG=INFO")
    page.click("#submit")
    page.wait_for_url("**/jobs/orig**")
    assert _wait_ended(page, base, "orig") == "Complete"
    page.goto(base + "/submit?clone=orig")
    assert page.input_value("#command") == "python train.py --epochs 30 a.yaml"
    assert page.input_value("#env") == "NCCL_DEBUG=INFO\nWANDB_PROJECT=mnist"
    assert "import os, sys" in page.input_value("#training_code") and page.is_checked("#keep_carried")
    carried = page.text_content("#carried-list") or ""
    assert "a.yaml" in carried and "vocab.bin" in carried
    page.screenshot(path=str(SHOTS / "form-clone-1280.png"), full_page=True)
    page.fill("#name", "copy")
    page.click("#submit")
    page.wait_for_url("**/jobs/copy**")
    assert _wait_ended(page, base, "copy") == "Complete"
    (cm1, tj1), (cm2, tj2) = _objects("orig"), _objects("copy")
    assert cm1 == cm2  # the same files, byte for byte: the same content-hashed ConfigMap
    assert _unnamed(tj1, "orig") == _unnamed(tj2, "copy")  # the same command, env, resources, image, nodes
    log = page.request.get(f"{base}/api/trainjob/copy/logs").json()["logs"]
    assert "args ['--epochs', '30'" in log and "mnist" in log and "lr: 0.1" in log
    ctx.close()


def test_the_form_at_a_phones_width_keeps_radios_with_their_labels_and_the_header_is_one_line_at_1280(served, browser):
    base = served
    ctx = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True, has_touch=True)
    page = ctx.new_page()
    page.goto(base + "/submit")
    page.screenshot(path=str(SHOTS / "form-390.png"), full_page=True)
    assert page.evaluate("document.documentElement.scrollWidth") <= 390  # nothing wider than the phone
    choices = page.locator("#submit-form label.choice")
    assert choices.count() == 11  # 3 frameworks, 4 sizes, 2 images, 2 code sources
    for i in range(choices.count()):
        label = choices.nth(i)
        box, control = label.bounding_box(), label.locator("input").bounding_box()
        assert box and control, i
        middle = control["y"] + control["height"] / 2
        assert box["y"] <= middle <= box["y"] + box["height"] and box["height"] < 40, (label.text_content(), box, control)  # one line, the control in it
        assert box["x"] + box["width"] <= 390, label.text_content()
    for cid in ("num_nodes", "command", "training_code", "env", "secret_env"):
        b = page.locator(f"#{cid}").bounding_box()
        assert b and b["x"] >= 0 and b["x"] + b["width"] <= 390, cid
    ctx.close()
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    page = ctx.new_page()
    for path in ("/submit", "/", "/team"):
        page.goto(base + path)
        header = page.locator("header").bounding_box()
        tops = [page.locator("header > *").nth(i).bounding_box() for i in range(page.locator("header > *").count())]
        assert header and all(t and abs(t["y"] - tops[0]["y"]) < 8 and t["height"] < 30 for t in tops if t and tops[0]), (path, tops)
        assert header["height"] < 50, (path, header)
    page.goto(base + "/submit")
    page.screenshot(path=str(SHOTS / "form-1280.png"))
    ctx.close()


def test_the_form_is_submitted_with_the_keyboard_alone(served, browser):
    base = served
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    page = ctx.new_page()
    page.goto(base + "/submit")
    seen = []
    for _ in range(80):
        page.keyboard.press("Tab")
        focused = page.locator(":focus")
        fid = focused.get_attribute("id") if focused.count() else None
        seen.append(fid)
        if fid == "name":
            page.keyboard.type("keyboard-job")
        if fid == "submit":
            break
    assert seen[-1] == "submit", seen
    assert {"framework-pytorch", "num_nodes", "preset-small", "command", "code_source-paste", "training_code", "requirements", "env", "secret_env"} <= set(seen), seen
    page.keyboard.press("Enter")
    page.wait_for_url("**/jobs/keyboard-job**")
    assert _wait_ended(page, base, "keyboard-job") == "Complete"
    ctx.close()


def test_problems_are_tied_to_their_fields_and_the_summary_links_focus_them(served, browser):
    base = served
    ctx = browser.new_context(viewport={"width": 390, "height": 844})
    page = ctx.new_page()
    page.goto(base + "/submit")
    page.fill("#num_nodes", "0")
    page.fill("#training_code", "")
    page.fill("#env", "PATH=/nonexistent")
    page.click("#submit")
    page.wait_for_selector("#problems-summary")
    assert page.locator(":focus").get_attribute("id") == "problems-summary"  # the summary is read first
    page.screenshot(path=str(SHOTS / "form-problems-390.png"), full_page=True)
    links = page.locator("#problems-summary a")
    assert links.count() == 3
    targets = []
    for i in range(links.count()):
        target = (links.nth(i).get_attribute("href") or "")[1:]
        targets.append(target)
        field = page.locator(f"#{target}")
        described = (field.get_attribute("aria-describedby") or "").split()
        errors = [e for e in described if e.startswith("error-")]
        assert errors and field.get_attribute("aria-invalid") == "true", target
        assert all((page.text_content(f"#{e}") or "").strip() for e in errors)
        links.nth(i).click()
        assert page.locator(":focus").get_attribute("id") == target
    assert sorted(targets) == ["env", "num_nodes", "training_code"]
    ctx.close()


def test_a_refused_post_keeps_every_value_the_user_typed_in_fields_a_choice_left_unused(served, browser):
    base = served
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    page = ctx.new_page()
    page.goto(base + "/submit")
    typed = {"#training_code": "print('mine')", "#requirements": "numpy==2.3.4", "#gpu_per_node": "3", "#cpu_per_node": "7", "#memory_per_node": "40", "#instance_type": "g5.12xlarge",
             "#image": "registry.example/me:1", "#grace_seconds": "300", "#deps_timeout": "900"}
    page.check("#preset-custom")
    page.check("#image_choice-custom")
    page.click("#advanced summary")
    for sel, value in typed.items():
        page.fill(sel, value)
    page.check("#preset-large")  # the custom fields, the image and the pasted code go unused, unsent by the server's choice, not lost
    page.check("#image_choice-builtin")
    page.check("#code_source-upload")
    page.click("#submit")  # refused: "Upload" with no files
    page.wait_for_selector("#problems-summary")
    assert page.is_checked("#code_source-upload") and page.is_checked("#preset-large") and page.is_checked("#image_choice-builtin")
    for sel, value in typed.items():
        assert page.input_value(sel) == value, sel
    assert page.locator("#custom-resources").is_hidden() and page.locator("#paste-section").is_hidden()  # unused fields hidden, not disabled
    page.check("#code_source-paste")
    page.check("#preset-custom")
    assert page.locator("#training_code").is_visible() and page.locator("#gpu_per_node").is_visible()
    ctx.close()


def test_the_api_docs_render_from_the_portals_own_files_under_its_csp(served, browser):
    base = served
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    page = ctx.new_page()
    asked, console = [], []
    page.on("request", lambda r: asked.append(r.url))
    page.on("console", lambda m: console.append(m.text))
    page.goto(base + "/api/docs")
    page.wait_for_selector(".opblock", timeout=20000)
    assert page.locator(".opblock").count() >= 8
    page.screenshot(path=str(SHOTS / "api-docs.png"))
    assert asked and all(u.startswith(base + "/") or u.startswith("data:") for u in asked), asked
    assert not [m for m in console if "Content Security Policy" in m], console
    ctx.close()
