"""trainctl installs alone: pyproject.toml's pins are requirements.txt's, the wheel holds only modules
that load no Pulumi, and (slow) the wheel installed with its dependencies into a fresh virtualenv, run
from a directory outside the checkout, prints its help, dry-runs a submit, reaches an API server in
cluster mode and refuses local mode in one line."""

from __future__ import annotations

import ast
import http.server
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import threading
import tomllib
import zipfile

import pytest

from tests.test_layout import DATA_ONLY, PULUMI

ROOT = pathlib.Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def pins(lines: list[str]) -> dict[str, str]:
    out = {}
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            out[re.sub(r"\[.*\]", "", name).strip().lower()] = version.strip()
    return out


def test_every_pin_of_the_package_is_the_one_of_requirements_txt():
    repo = pins((ROOT / "requirements.txt").read_text().splitlines())
    declared = [*PYPROJECT["dependencies"], *(d for extra in PYPROJECT["optional-dependencies"].values() for d in extra)]
    assert all("==" in d for d in declared), "every dependency pinned"
    mine = pins(declared)
    assert {n: v for n, v in mine.items() if repo.get(n) != v} == {}
    assert {"kubeflow", "kubernetes", "rich", "pyyaml", "pydantic"} <= set(pins(PYPROJECT["dependencies"]))
    assert {"fastapi", "uvicorn", "jinja2"} <= set(pins(PYPROJECT["optional-dependencies"]["ui"]))
    assert not {"pulumi", "torch"} & set(mine), "the CLI's package brings neither Pulumi nor torch"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> pathlib.Path:
    """The wheel, built from a copy of the tracked and unignored files (the checkout stays clean)."""
    src = tmp_path_factory.mktemp("src")
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split("\n")
    for rel in filter(None, files):
        if (ROOT / rel).is_file() and rel.split("/")[0] in ("trainctl", "config", "k8s", "workloads") or rel in ("versions.py", "pyproject.toml", "setup.py"):
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(src)], check=True, cwd=out, capture_output=True)
    return next(out.glob("*.whl"))


def test_the_wheel_holds_the_cli_its_builders_and_data_and_nothing_that_loads_pulumi(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    modules = [n for n in names if n.endswith(".py")]
    assert {"trainctl/cli.py", "trainctl/portal/app.py", "config/settings.py", "k8s/builders/trainer_api.py", "workloads/builders/trainjobs.py", "workloads/programs/launch.py", "versions.py"} <= set(modules)
    assert {"config/gpu_instances.yaml", "config/aws_facts.yaml", "trainctl/portal/templates/base.html"} <= set(names)
    # the Pulumi program's own modules of k8s/ and workloads/ stay in the repository (setup.py)
    assert [m for m in modules if re.fullmatch(r"(k8s|workloads)/[^/]+\.py", m) and not m.endswith("__init__.py")] == []
    wrong = []
    with zipfile.ZipFile(wheel) as z:
        for m in modules:
            for node in ast.walk(ast.parse(z.read(m))):
                found = [a.name for a in node.names] if isinstance(node, ast.Import) else [f"{node.module}.{a.name}" for a in node.names] if isinstance(node, ast.ImportFrom) and not node.level else []
                wrong += [f"{m}: {n}" for n in found if n.split(".")[0] in PULUMI and n not in DATA_ONLY]
    assert wrong == []
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert "Requires-Dist: kubernetes==35.0.0" in meta and "Provides-Extra: ui" in meta


class _Api(http.server.BaseHTTPRequestHandler):
    """An API server that answers every request 403 (a Status object) and records its path."""

    seen: list[str] = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.seen.append(self.path)
        body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403, "message": "forbidden: the test's API server"}).encode()
        self.send_response(403)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET

    def log_message(self, format, *args):  # noqa: A002 (http.server's signature)
        pass


@pytest.mark.slow
def test_the_wheel_installs_alone_and_trainctl_runs_outside_the_checkout(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    done = subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "-q", str(wheel)], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    trainctl = str(venv / "bin/trainctl")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KUBECONFIG", "VIRTUAL_ENV")}
    env["HOME"] = str(tmp_path)  # no kubeconfig, no local jobs of this machine's user
    run = tmp_path / "elsewhere"
    run.mkdir()

    def trainctl_run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([trainctl, *args], capture_output=True, text=True, cwd=run, env=env, timeout=120)

    probe = subprocess.run([str(venv / "bin/python"), "-c", "import trainctl, importlib.util as u; print(trainctl.__file__); print(u.find_spec('pulumi'), u.find_spec('torch'))"],
                           capture_output=True, text=True, cwd=run, env=env)
    assert str(venv) in probe.stdout and "None None" in probe.stdout, probe.stdout + probe.stderr  # the installed copy; no Pulumi, no torch

    assert trainctl_run("--help").returncode == 0
    code = tmp_path / "mnist"
    code.mkdir()
    (code / "train.py").write_text("print('step 1')\n")
    dry = trainctl_run("submit", "--dry-run", "-n", "vision", "--nodes", "2", str(code), "--", "python", "train.py")
    assert dry.returncode == 0, dry.stderr
    assert "kind: TrainJob" in dry.stdout and "kind: ConfigMap" in dry.stdout and "numNodes: 2" in dry.stdout

    # cluster mode: the kubeconfig's API server is asked
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": {"server": f"http://127.0.0.1:{server.server_address[1]}"}}],
            "users": [{"name": "test", "user": {"token": "t"}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test", "namespace": "vision"}}],
        }))
        listed = trainctl_run("list", "--kubeconfig", str(kubeconfig))
    finally:
        server.shutdown()
    assert listed.returncode != 0 and "Traceback" not in listed.stderr, listed.stderr
    assert any("trainjobs" in p for p in _Api.seen), _Api.seen
    assert "not allowed: list trainjobs in vision" in listed.stderr and len(listed.stderr.strip().splitlines()) == 1, listed.stderr  # the 403, said as trainctl says it

    # no server at all: one line saying so
    kubeconfig.write_text(kubeconfig.read_text().replace(f":{server.server_address[1]}", ":9"))
    gone = trainctl_run("list", "--kubeconfig", str(kubeconfig))
    assert gone.returncode != 0 and "Traceback" not in gone.stderr and len(gone.stderr.strip().splitlines()) == 1, gone.stderr

    # local mode needs the checkout and torch: one line saying what and how, nothing started
    local = trainctl_run("submit", "--local", "--nodes", "1", str(code), "--", "python", "train.py")
    assert local.returncode != 0 and "Traceback" not in local.stderr, local.stderr
    assert len(local.stderr.strip().splitlines()) == 1 and "make venv" in local.stderr, local.stderr
    assert not (tmp_path / ".local/state/trainctl/jobs").exists() or not any((tmp_path / ".local/state/trainctl/jobs").iterdir())
