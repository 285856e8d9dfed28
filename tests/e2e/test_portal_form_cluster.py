"""Clone & edit across a real TrainJob (the teams stack with portal.enabled on a local control plane,
in Debian's chromium): alice submits from the form a job with arguments, three uploaded files,
variables and a Secret reference; its clone comes back with all of it (the Secret reference as a
reference, the form saying its value is not carried) and, resubmitted unchanged under another name,
is a TrainJob whose clone form is the same field for field (command, files, env, Secret
references, resources, instance type, image, nodes). tests/test_portal_form.py shows the same
form builds the same objects; screenshots go to out/portal-screenshots/."""

from __future__ import annotations

import time

from tests.e2e.test_portal_browser import SHOTS, _page, browser, served  # noqa: F401  (the module's fixtures: one portal, one browser)

FIELDS = ("framework-pytorch", "num_nodes", "gpu_per_node", "cpu_per_node", "memory_per_node", "instance_type", "image", "command", "training_code", "requirements", "env", "secret_env")


def _form(page) -> dict[str, str]:
    values = {f: page.input_value(f"#{f}") for f in FIELDS}
    values["carried"] = page.locator("input[name=carried]").get_attribute("value") or ""
    return values


def test_a_clone_with_a_secret_reference_resubmitted_unchanged_is_the_same_trainjob(served, browser, tmp_path):  # noqa: F811
    up, base = served
    SHOTS.mkdir(parents=True, exist_ok=True)
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("import sys\nprint('args', sys.argv[1:], flush=True)\n")
    (code / "a.yaml").write_text("lr: 0.1\n")
    (code / "vocab.bin").write_bytes(bytes(range(256)))
    ctx, page = _page(browser, up, "vision", "alice")
    page.goto(base + "/submit")
    page.check("#code_source-upload")
    page.set_input_files("#files", [str(code / "train.py"), str(code / "a.yaml"), str(code / "vocab.bin")])
    page.fill("#name", "form-orig")
    page.fill("#command", "python train.py --epochs 30 a.yaml")
    page.fill("#env", "WANDB_PROJECT=mnist\nNCCL_DEBUG=INFO")
    page.fill("#secret_env", "WANDB_API_KEY=wandb/api-key")
    page.click("#submit")
    page.wait_for_url("**/jobs/form-orig**")
    page.goto(base + "/submit?clone=form-orig")
    first = _form(page)
    assert first["command"] == "python train.py --epochs 30 a.yaml" and first["secret_env"] == "WANDB_API_KEY=wandb/api-key"
    assert first["env"] == "NCCL_DEBUG=INFO\nWANDB_PROJECT=mnist" and "import sys" in first["training_code"]
    assert "a.yaml" in first["carried"] and "vocab.bin" in first["carried"]
    assert "the Secrets' values are not" in (page.text_content("#clone-notes") or "")
    page.screenshot(path=str(SHOTS / "form-clone-secret.png"), full_page=True)
    page.fill("#name", "form-copy")
    page.click("#submit")
    page.wait_for_url("**/jobs/form-copy**")
    time.sleep(1)
    page.goto(base + "/submit?clone=form-copy")
    assert _form(page) == first
    for name in ("form-orig", "form-copy"):
        page.request.delete(f"{base}/api/trainjob/{name}?namespace=vision", headers={"content-type": "application/json"})
    ctx.close()
