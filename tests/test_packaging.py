"""trainctl installs alone: pyproject.toml's pins are requirements.txt's, the wheel holds one package
(``trainctl``: the platform's modules under ``trainctl._platform``, their imports rewritten by setup.py)
and only modules that load no Pulumi, and (slow) the wheel installed with its dependencies into a fresh
virtualenv, run from a directory outside the checkout that has a ``config.py`` of its own, prints its
help, dry-runs a submit, reaches an API server in cluster mode, refuses a torchrun job in one line while
the environment has no torch, and with torch runs a 2-node job locally and serves ``trainctl ui --local``."""

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
import time
import tomllib
import urllib.request
import zipfile

import pytest

from tests.browser import free_port
from tests.test_layout import DATA_ONLY, PULUMI

ROOT = pathlib.Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
PLATFORM = ("config", "k8s", "workloads", "tools", "versions")  # the repository's top-level names the wheel namespaces
NS = "trainctl._platform"
# a user's project beside which trainctl runs: its own config.py (and versions.py) must never be trainctl's
USER_CONFIG = "raise SystemExit('the project\'s own config.py was imported by trainctl')\n"


def rewritten(*sources: str) -> list[str]:
    """setup.py's ``rewrite_imports`` of each source, run in a fresh interpreter: setuptools' distutils
    shim refuses a process that has loaded the standard library's distutils already, as other tests
    in this one may have (its ``setup()`` call made a no-op)."""
    code = ("import json, runpy, sys\nfrom unittest import mock\nwith mock.patch('setuptools.setup'):\n    ns = runpy.run_path(sys.argv[1])\n"
            "print(json.dumps([ns['rewrite_imports'](s) for s in json.load(sys.stdin)]))")
    proc = subprocess.run([sys.executable, "-c", code, str(ROOT / "setup.py")], input=json.dumps(sources), capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_setup_rewrites_the_imports_of_our_packages_and_nothing_else():
    source = (
        "import os, versions\n"
        "import config.settings\n"
        "import k8s.builders.runtimes as rt\n"
        "from config import (\n    catalog,\n    costs,\n)\n"
        "from tools.emulator_objects import Job  # tools.emulate\n"
        "from configparser import ConfigParser\n"
        "from .sibling import x\n"
        "import toolsx\n"
        "def f():\n    from workloads.builders import trainjobs\n    return 'config.settings', trainjobs\n"
    )
    [out] = rewritten(source)
    assert out.splitlines() == [
        "import os; from trainctl._platform import versions",
        "import trainctl._platform.config.settings; from trainctl._platform import config",
        "import trainctl._platform.k8s.builders.runtimes as rt",
        "from trainctl._platform.config import (", "    catalog,", "    costs,", ")",
        "from trainctl._platform.tools.emulator_objects import Job  # tools.emulate",
        "from configparser import ConfigParser",
        "from .sibling import x",
        "import toolsx",
        "def f():", "    from trainctl._platform.workloads.builders import trainjobs", "    return 'config.settings', trainjobs",
    ]
    assert rewritten(out) == [out]  # idempotent: a rebuild over an earlier build's files changes nothing


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
        if (ROOT / rel).is_file() and rel.split("/")[0] in ("trainctl", "config", "k8s", "workloads", "tools") or rel in ("versions.py", "pyproject.toml", "setup.py", "Pulumi.dev.yaml"):
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(src)], check=True, cwd=out, capture_output=True)
    return next(out.glob("*.whl"))


def _imports(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found += [f"{node.module}.{a.name}" for a in node.names]
    return found


def test_the_wheel_holds_one_package_with_the_cli_its_builders_emulator_and_data_and_nothing_that_loads_pulumi(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"trainctl", "training_platform-0.1.0.dist-info"}
    top_level = zipfile.ZipFile(wheel).read("training_platform-0.1.0.dist-info/top_level.txt").decode()
    assert top_level.split() == ["trainctl"]
    modules = [n for n in names if n.endswith(".py")]
    p = "trainctl/_platform/"
    assert {"trainctl/cli.py", "trainctl/portal/app.py", f"{p}config/settings.py", f"{p}k8s/builders/trainer_api.py", f"{p}workloads/builders/trainjobs.py",
            f"{p}workloads/programs/launch.py", f"{p}versions.py", f"{p}tools/emulate.py", f"{p}tools/emulator_pods.py", f"{p}tools/fixture_hub.py"} <= set(modules)
    assert {f"{p}config/gpu_instances.yaml", f"{p}config/aws_facts.yaml", "trainctl/portal/templates/base.html"} <= set(names)
    # the stack file local mode runs on: the repository's, copied at build time
    assert zipfile.ZipFile(wheel).read(f"{p}Pulumi.dev.yaml") == (ROOT / "Pulumi.dev.yaml").read_bytes()
    # what runs in pods (read into ConfigMaps and commands): byte for byte the repository's, whatever setup.py rewrites
    in_pods = [m for m in modules if m.startswith((f"{p}workloads/programs/", f"{p}k8s/pods/"))]
    assert in_pods and [m for m in in_pods if zipfile.ZipFile(wheel).read(m) != (ROOT / m[len(p):]).read_bytes()] == []
    # the Pulumi program's own modules of k8s/ and workloads/ stay in the repository, and of tools/ all but the emulator (setup.py)
    assert [m for m in modules if re.fullmatch(rf"{p}(k8s|workloads)/[^/]+\.py", m) and not m.endswith("__init__.py")] == []
    assert sorted(m[len(p) + 6:-3] for m in modules if m.startswith(f"{p}tools/")) == ["__init__", "emulate", "emulator_mounts", "emulator_objects", "emulator_output", "emulator_pods", "fixture_hub"]
    shipped = {m[len("trainctl/_platform/"):-3].replace("/", ".").removesuffix(".__init__") for m in modules if m.startswith(p)}
    wrong, top, named = [], [], []
    with zipfile.ZipFile(wheel) as z:
        for m in modules:
            tree = ast.parse(z.read(m))
            found = _imports(tree)
            wrong += [f"{m}: {n}" for n in found if n.split(".")[0] in PULUMI and n not in DATA_ONLY]
            top += [f"{m}: {n}" for n in found if n.split(".")[0] in PLATFORM]  # never the top-level packages of a checkout (or a user's config.py)
            # a module named in a string (python -m, import_module) is one setup.py does not rewrite
            named += [f"{m}: {c.value}" for c in ast.walk(tree) if isinstance(c, ast.Constant) and isinstance(c.value, str) and c.value in shipped and "." in c.value]
    assert wrong == [] and top == [] and named == []
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert "Requires-Dist: kubernetes==35.0.0" in meta and "Provides-Extra: ui" in meta
    requires = [line for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    assert requires and not [r for r in requires if re.search(r"torch|pulumi", r, re.I)]


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


class Installed:
    """The wheel (with its ``ui`` extra) installed into a fresh virtualenv, run from a project directory
    outside the checkout that has a ``config.py`` and a ``versions.py`` of its own."""

    def __init__(self, wheel: pathlib.Path, root: pathlib.Path):
        self.root, self.venv, self.run_dir = root, root / "venv", root / "project"
        subprocess.run([sys.executable, "-m", "venv", str(self.venv)], check=True)
        done = self.pip("install", "-q", f"{wheel}[ui]")
        assert done.returncode == 0, done.stderr[-2000:]
        self.env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KUBECONFIG", "VIRTUAL_ENV", "TRAINCTL_HOME", "XDG_STATE_HOME")}
        self.env["HOME"] = str(root)  # no kubeconfig, no local jobs of this machine's user
        self.run_dir.mkdir()
        (self.run_dir / "config.py").write_text(USER_CONFIG)
        (self.run_dir / "versions.py").write_text(USER_CONFIG)
        self.jobs = root / ".local/state/trainctl/jobs"

    def pip(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.venv / "bin/python"), "-m", "pip", *args], capture_output=True, text=True, cwd=self.root, timeout=timeout)

    def trainctl(self, *args: str, module: bool = False) -> subprocess.CompletedProcess:
        """``trainctl ARGS`` (``python -m trainctl.cli ARGS`` with ``module``: the project directory first on sys.path)."""
        cmd = [str(self.venv / "bin/python"), "-m", "trainctl.cli"] if module else [str(self.venv / "bin/trainctl")]
        return subprocess.run([*cmd, *args], capture_output=True, text=True, cwd=self.run_dir, env=self.env, timeout=120)


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Installed:
    return Installed(wheel, tmp_path_factory.mktemp("installed"))


def _site_packages(venv: pathlib.Path) -> pathlib.Path:
    return next((venv / "lib").glob("python3*/site-packages"))


@pytest.mark.slow
def test_the_wheel_installs_one_package_and_trainctl_runs_outside_the_checkout(installed, tmp_path):
    site = _site_packages(installed.venv)
    probe = subprocess.run([str(installed.venv / "bin/python"), "-c", "import trainctl, importlib.util as u; print(trainctl.__file__); print(u.find_spec('pulumi'), u.find_spec('torch'))"],
                           capture_output=True, text=True, cwd=installed.root, env=installed.env)
    assert str(installed.venv) in probe.stdout and "None None" in probe.stdout, probe.stdout + probe.stderr  # the installed copy; no Pulumi, no torch
    # what our distribution put at the top of site-packages: trainctl and its metadata, nothing else
    ours = subprocess.run([str(installed.venv / "bin/python"), "-c", "import importlib.metadata as m; print('\\n'.join(str(f) for f in m.files('training-platform')))"],
                          capture_output=True, text=True, cwd=installed.root, env=installed.env, check=True).stdout.split()
    assert {f.split("/")[0] for f in ours if not f.startswith("../")} == {"trainctl", "training_platform-0.1.0.dist-info"}
    # and every other top-level entry is another distribution's (the same listing as without our wheel)
    others = subprocess.run([str(installed.venv / "bin/python"), "-c", (
        "import importlib.metadata as m\n"
        "for d in m.distributions():\n"
        "    if d.metadata['Name'] != 'training-platform': print('\\n'.join(str(f).split('/')[0] for f in d.files or []))")],
        capture_output=True, text=True, cwd=installed.root, env=installed.env, check=True).stdout.split()
    assert sorted({p.name for p in site.iterdir()} - set(others) - {"__pycache__"}) == ["trainctl", "training_platform-0.1.0.dist-info"]

    assert installed.trainctl("--help").returncode == 0
    helped = installed.trainctl("--help", module=True)  # python -m from a project with its own config.py
    assert helped.returncode == 0 and "project's own" not in helped.stderr, helped.stderr
    code = tmp_path / "mnist"
    code.mkdir()
    (code / "train.py").write_text("print('step 1')\n")
    dry = installed.trainctl("submit", "--dry-run", "-n", "vision", "--nodes", "2", str(code), "--", "python", "train.py")
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
        listed = installed.trainctl("list", "--kubeconfig", str(kubeconfig))
    finally:
        server.shutdown()
    assert listed.returncode != 0 and "Traceback" not in listed.stderr, listed.stderr
    assert any("trainjobs" in p for p in _Api.seen), _Api.seen
    assert "not allowed: list trainjobs in vision" in listed.stderr and len(listed.stderr.strip().splitlines()) == 1, listed.stderr  # the 403, said as trainctl says it

    # no server at all: one line saying so
    kubeconfig.write_text(kubeconfig.read_text().replace(f":{server.server_address[1]}", ":9"))
    gone = installed.trainctl("list", "--kubeconfig", str(kubeconfig))
    assert gone.returncode != 0 and "Traceback" not in gone.stderr and len(gone.stderr.strip().splitlines()) == 1, gone.stderr

    # a torchrun job while this environment has no torch: one line saying how to get it, nothing started
    local = installed.trainctl("submit", "--local", "--nodes", "1", str(code), "--", "python", "train.py")
    assert local.returncode != 0 and "Traceback" not in local.stderr, local.stderr
    assert len(local.stderr.strip().splitlines()) == 1 and f"{installed.venv / 'bin/python'} -m pip install torch" in local.stderr, local.stderr
    assert not installed.jobs.exists() or not any(installed.jobs.iterdir())


ALL_REDUCE = """\
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
print(f"rank {dist.get_rank()} of {dist.get_world_size()}: sum {total.item():g}", flush=True)
dist.barrier()
dist.destroy_process_group()
"""


def _get(url: str) -> tuple[int, dict]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, json.loads(r.read())


@pytest.mark.slow
def test_the_installed_trainctl_runs_a_local_job_with_the_environments_torch_and_serves_the_local_ui(installed):
    torch_pin = pins((ROOT / "requirements.txt").read_text().splitlines())["torch"]
    done = installed.pip("install", "-q", f"torch=={torch_pin}", timeout=1200)  # the user's own environment gets torch, as the one-line hint says
    assert done.returncode == 0, done.stderr[-2000:]
    (installed.run_dir / "allreduce.py").write_text(ALL_REDUCE)
    # python -m from the project: its config.py is first on sys.path, and trainctl never imports it
    started = installed.trainctl("submit", "--local", "--nodes", "2", "--name", "allreduce", ".", "--", "python", "allreduce.py", module=True)
    assert started.returncode == 0 and "project's own" not in started.stderr, started.stderr
    deadline = time.monotonic() + 300
    while True:
        status = installed.trainctl("status", "--local", "allreduce", "-o", "json")
        assert status.returncode == 0, status.stderr
        report = json.loads(status.stdout)
        if report["phase"] != "Running" or time.monotonic() > deadline:
            break
        time.sleep(1)
    logs = installed.trainctl("logs", "--local", "allreduce").stdout
    # gloo on 2 shared cores may drop a peer at teardown: the runtime's failure policy restarts the job, as on a cluster
    assert report["phase"] == "Complete" and report.get("restarts", 0) <= 1, (report, logs[-3000:])
    assert "rank 0 of 2: sum 3" in logs and "rank 1 of 2: sum 3" in logs, logs[-3000:]

    port = free_port()
    ui = subprocess.Popen([str(installed.venv / "bin/trainctl"), "ui", "--local", "--port", str(port)], cwd=installed.run_dir, env=installed.env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                status_code, health = _get(f"http://127.0.0.1:{port}/healthz")
                break
            except OSError:
                assert ui.poll() is None and time.monotonic() < deadline, ui.stdout.read() if ui.poll() is not None and ui.stdout else "ui did not answer"
                time.sleep(0.5)
        assert status_code == 200 and health == {"status": "ok"}
        status_code, listed = _get(f"http://127.0.0.1:{port}/api/trainjobs")
        assert status_code == 200 and [(j["trainjob_name"], j["status"]) for j in listed["items"]] == [("allreduce", "Complete")], listed
    finally:
        os.kill(ui.pid, 15)
        ui.wait(timeout=30)
