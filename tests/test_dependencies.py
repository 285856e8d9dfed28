"""A code directory's requirements.txt installed by the launcher before the job's command, what
a failed install looks like in status and diagnose, the objects trainctl writes for it, and a
job's identity: its name from the code directory, its checkpoint directory, --resume-from, the
EFA image warning."""

from __future__ import annotations

import base64
import hashlib
import http.server
import importlib.util
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import zipfile

import launch  # pyright: ignore[reportMissingImports]  (the programs directory is on sys.path: tests/conftest.py)
import pytest
import yaml

from trainctl import cli, code, diagnose, jobstate, objects
from trainctl.kube import ClusterError
from workloads.builders import trainjobs as tj
from workloads.builders.trainjobs import PROGRAMS_DIR

LAUNCH = str(PROGRAMS_DIR / "launch.py")


def make_wheel(directory: pathlib.Path, name: str, version: str, code_text: str, requires: tuple[str, ...] = ()) -> pathlib.Path:
    """A pure-Python wheel (PEP 427: the package, METADATA, WHEEL and RECORD with sha256 digests)."""
    dist = f"{name}-{version}"
    files = {
        f"{name}/__init__.py": code_text,
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{dist}.dist-info/RECORD"] = "\n".join([*record, f"{dist}.dist-info/RECORD,,"]) + "\n"
    directory.mkdir(parents=True, exist_ok=True)
    wheel = directory / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
    return wheel


def code_dir(tmp_path: pathlib.Path, requirement: str, *, index: str = "--no-index\n--find-links wheels\n") -> pathlib.Path:
    """A code directory with the launcher beside it (as shipped), a local wheel and requirements.txt."""
    d = tmp_path / "code"
    make_wheel(d / "wheels", "tinydep", "0.1", "VALUE = 42\n")
    (d / "requirements.txt").write_text(index + requirement + "\n")
    (d / "launch.py").write_text(pathlib.Path(LAUNCH).read_text())
    return d


def run_launch(d: pathlib.Path, deps: pathlib.Path, child: str, **env: str) -> subprocess.CompletedProcess:
    environ = {"PATH": "/usr/bin:/bin", "TRAINING_DEPS_DIR": str(deps), **env}
    return subprocess.run([sys.executable, str(d / "launch.py"), sys.executable, "-c", child], env=environ, capture_output=True, text=True, timeout=120)


def test_requirements_are_installed_before_the_command_and_first_on_its_path(tmp_path):
    d, deps = code_dir(tmp_path, "tinydep==0.1"), tmp_path / "deps"
    p = run_launch(d, deps, "import os, tinydep; print(tinydep.VALUE, tinydep.__file__); print(os.environ['PYTHONPATH'])")
    assert p.returncode == 0, p.stderr
    value, where, path = p.stdout.split("\n")[0].split(" ")[0], p.stdout.split("\n")[0].split(" ")[1], p.stdout.split("\n")[1]
    assert value == "42" and where.startswith(str(deps / "venv-")) and path.split(":")[0] in where
    assert "installing requirements.txt (at most 600 s)" in p.stderr and "Successfully installed tinydep-0.1" in p.stderr
    assert sorted(x.name for x in deps.iterdir()) == ["pip-cache"]  # the install is removed with the command


def test_without_requirements_nothing_is_installed(tmp_path):
    d, deps = code_dir(tmp_path, "tinydep==0.1"), tmp_path / "deps"
    (d / "requirements.txt").unlink()
    p = run_launch(d, deps, "print('ran')")
    assert p.returncode == 0 and p.stdout == "ran\n" and "installing" not in p.stderr and not deps.exists()


def test_a_failed_install_is_one_marker_line_with_pips_last_error_and_exit_4(tmp_path):
    d = code_dir(tmp_path, "tinydep==0.2")
    p = run_launch(d, tmp_path / "deps", "print('ran')")
    assert p.returncode == launch.DEPS_FAILED == 4 and "ran" not in p.stdout
    marker = [line for line in p.stderr.splitlines() if line.startswith(launch.DEPS_MARKER)]
    assert marker == ["TRAINING_DEPS_FAILED dependencies failed to install: No matching distribution found for tinydep==0.2"]
    assert launch.DEPS_FAILED not in launch.NON_RETRYABLE  # retried: an index outage passes


def test_a_resolution_conflict_fails_at_once_with_exit_3(tmp_path):
    d = code_dir(tmp_path, "pkga==1.0\npkgb==1.0")
    make_wheel(d / "wheels", "pkga", "1.0", "V = 1\n")
    make_wheel(d / "wheels", "pkgb", "1.0", "", requires=("pkga==2.0",))
    p = run_launch(d, tmp_path / "deps", "print('ran')")
    assert p.returncode == launch.DEPS_CANNOT_INSTALL == 3 and launch.DEPS_CANNOT_INSTALL in launch.NON_RETRYABLE and "ran" not in p.stdout
    marker = [line for line in p.stderr.splitlines() if line.startswith(launch.DEPS_MARKER)]
    assert marker == ["TRAINING_DEPS_FAILED dependencies failed to install: Cannot install -r requirements.txt (line 4) and pkga==1.0 because these package versions have conflicting dependencies."]


def test_pips_errors_are_sorted_into_retryable_or_not():
    assert launch.error_line("Collecting x\nERROR: Could not install packages due to an OSError: [Errno 13] Permission denied: '/usr/lib/x'\nCheck the permissions.\n") == ("Could not install packages due to an OSError: [Errno 13] Permission denied: '/usr/lib/x'", True)
    assert launch.error_line("ERROR: Could not find a version that satisfies the requirement y (from versions: none)\nERROR: No matching distribution found for y\n") == ("No matching distribution found for y", False)
    assert launch.error_line("") == ("pip printed nothing", False)


@pytest.fixture
def shared_dir():
    """A directory another user may enter (pytest's tmp_path is root's alone), removed afterwards: in
    the first temporary directory whose every ancestor others may enter ($TMPDIR may be private)."""
    def enterable(path: str) -> bool:
        p = pathlib.Path(path).resolve()
        return p.is_dir() and all(a.stat().st_mode & 0o001 for a in (p, *p.parents))

    base = next((c for c in (tempfile.gettempdir(), "/tmp", "/var/tmp") if enterable(c)), None)
    if base is None:
        pytest.skip("no temporary directory another user may enter")
    d = pathlib.Path(tempfile.mkdtemp(dir=base))
    d.chmod(0o755)
    yield d
    subprocess.run(["chmod", "-R", "u+w", str(d)], check=True)
    shutil.rmtree(d)


def test_a_requirement_that_changes_an_image_package_installs_beside_the_read_only_image(shared_dir):
    """The image's pkgx 1.0 belongs to another user; requirements.txt asks for 2.0: the job's
    environment gets 2.0 and the image's copy stays (pip does not try to remove it)."""
    as_user: list[str] = []
    base = sys.executable
    if os.geteuid() == 0:  # root writes anywhere: run the launcher as nobody, like the pod's uid 1000
        as_user = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        runs = [p for p in (os.path.realpath(sys.executable), shutil.which("python3", path="/usr/local/bin:/usr/bin")) if p and shutil.which("setpriv")
                and subprocess.run([*as_user, p, "-c", "import venv, subprocess, sys; subprocess.run([sys.executable, '-c', ''], check=True)"], capture_output=True).returncode == 0]
        if not runs:
            pytest.skip("running as root with no Python another user may run (or no setpriv)")
        base = runs[0]
    image = shared_dir / "image"
    subprocess.run([base, "-m", "venv", "--without-pip", str(image)], check=True)
    python = str(image / "bin" / "python")
    image_site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], check=True, capture_output=True, text=True).stdout.strip()
    # the image's own pip, copied into it: the user the launcher runs as may not read this checkout or
    # its virtualenv (a clone in a private directory), so the image holds all it runs
    pip_dir = pathlib.Path(importlib.util.find_spec("pip").origin).parent  # pyright: ignore[reportOptionalMemberAccess]
    shutil.copytree(pip_dir, pathlib.Path(image_site, "pip"), copy_function=shutil.copyfile, ignore=shutil.ignore_patterns("__pycache__"))
    wheels = shared_dir / "wheels"
    make_wheel(wheels, "pkgx", "1.0", "VERSION = '1.0'\n")
    make_wheel(wheels, "pkgx", "2.0", "VERSION = '2.0'\n")
    subprocess.run([python, "-m", "pip", "install", "--isolated", "--no-index", "--find-links", str(wheels), "pkgx==1.0"], check=True, capture_output=True)
    subprocess.run(["chmod", "-R", "a+rX,a-w", str(image)], check=True)  # readable by the launcher's user whatever the umask
    code = shared_dir / "code"
    code.mkdir()
    (code / "requirements.txt").write_text(f"--no-index\n--find-links {wheels}\npkgx==2.0\n")
    (code / "launch.py").write_text(pathlib.Path(LAUNCH).read_text())
    deps = shared_dir / "deps"
    deps.mkdir()
    if as_user:
        os.chown(deps, 65534, 65534)
    subprocess.run(["chmod", "-R", "a+rX", str(wheels), str(code)], check=True)  # whatever the umask
    show = "import pkgx; print(pkgx.VERSION)"
    cmd = [*as_user, python, str(code / "launch.py"), "sh", "-c", f'python -c "{show}" && {python} -c "{show}"']  # the environment's python and the image's (torchrun's)
    p = subprocess.run(cmd, env={"PATH": "/usr/bin:/bin", "TRAINING_DEPS_DIR": str(deps)}, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["2.0", "2.0"] and "Successfully installed pkgx-2.0" in p.stderr and "Permission denied" not in p.stderr
    assert subprocess.run([python, "-c", show], capture_output=True, text=True).stdout.strip() == "1.0"  # the image's copy is untouched


class _Hang(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - the base class's name
        threading.Event().wait(30)

    def log_message(self, format, *args):  # noqa: A002
        pass


def test_an_install_past_its_time_limit_is_stopped_and_says_so(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hang)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        d = code_dir(tmp_path, "tinydep==0.1", index="")
        p = run_launch(d, tmp_path / "deps", "print('ran')", TRAINING_PIP_INDEX_URL=f"http://127.0.0.1:{server.server_address[1]}/simple", TRAINING_DEPS_TIMEOUT_S="3")
    finally:
        server.shutdown()
    assert p.returncode == 4
    assert "TRAINING_DEPS_FAILED dependencies failed to install: pip did not finish within 3 s" in p.stderr


def test_pip_gets_the_platforms_index_and_no_user_settings(tmp_path):
    cmd = launch.pip_command("/v/bin/python", "/c/requirements.txt", "/cache", {"TRAINING_PIP_INDEX_URL": "https://mirror.example/simple", "TRAINING_PIP_EXTRA_INDEX_URLS": "https://a.example/s https://b.example/s"})
    assert cmd[:4] == ["/v/bin/python", "-m", "pip", "install"] and "--isolated" in cmd and "--no-input" in cmd and "--disable-pip-version-check" in cmd
    assert cmd[cmd.index("--index-url") + 1] == "https://mirror.example/simple" and [cmd[i + 1] for i, a in enumerate(cmd) if a == "--extra-index-url"] == ["https://a.example/s", "https://b.example/s"]
    assert cmd[cmd.index("--cache-dir") + 1] == "/cache" and "--target" not in cmd and "--prefix" not in cmd  # the environment's own scheme
    assert launch.pip_command("p", "r", "c", {})[launch.pip_command("p", "r", "c", {}).index("--index-url") + 1] == launch.DEFAULT_INDEX_URL == tj.DEFAULT_PIP_INDEX_URL


def test_the_builders_names_are_the_launchers():
    env = {e["name"]: e["value"] for e in tj.Dependencies(extra_index_urls=("https://x.example/s",)).env()}
    assert set(env) == {launch.DEPS_DIR_ENV, launch.INDEX_URL_ENV, launch.EXTRA_INDEX_URLS_ENV, launch.DEPS_TIMEOUT_ENV}
    assert env[launch.DEPS_DIR_ENV] == tj.DEPS_MOUNT and int(env[launch.DEPS_TIMEOUT_ENV]) == launch.DEFAULT_DEPS_TIMEOUT_S == tj.DEFAULT_DEPS_TIMEOUT_S
    assert tj.RESUME_FROM_ENV == launch.RESUME_FROM_ENV and tj.REQUIREMENTS_FILE == launch.REQUIREMENTS
    assert diagnose.DEPS_FAILED_EXIT == launch.DEPS_FAILED and diagnose.DEPS_CAUSE == launch.DEPS_FAILED_TEXT and diagnose.DEPS_CANNOT_INSTALL_EXIT == launch.DEPS_CANNOT_INSTALL


def test_a_missing_resume_from_directory_fails_at_once(tmp_path):
    d = code_dir(tmp_path, "tinydep==0.1")
    p = run_launch(d, tmp_path / "deps", "print('ran')", TRAINING_RESUME_FROM=str(tmp_path / "nope"))
    assert p.returncode == 3 and "ran" not in p.stdout and "TRAINING_RESUME_FROM=" in p.stderr and "no such directory" in p.stderr


# --- the objects trainctl writes ----------------------------------------------------------------


def dry_run(capsys, proj: pathlib.Path, *flags: str) -> tuple[int, list[dict], str]:
    rc = cli.main(["submit", "--dry-run", "-n", "vision", "--nodes", "1", *flags, str(proj), "--", "python", "train.py"])
    out, err = capsys.readouterr()
    return rc, (list(yaml.safe_load_all(out)) if rc == 0 else []), err


def _pod(trainjob: dict) -> dict:
    from k8s.builders import trainer_api

    return trainer_api.read_pod_customization(trainjob["spec"])


@pytest.fixture
def proj(tmp_path) -> pathlib.Path:
    d = tmp_path / "my-model-v2"  # already a label: the job's name as it is (My_Model.v2 gets a hash: test_default_names_are_rfc1035_labels)
    d.mkdir()
    (d / "train.py").write_text("print('hi')\n")
    return d


def test_a_requirements_file_gets_the_cache_volume_and_the_settings(proj, capsys):
    rc, (_, job), _ = dry_run(capsys, proj)
    assert rc == 0 and not any(v["name"] == tj.DEPS_VOLUME for v in _pod(job)["volumes"])  # no requirements.txt: nothing
    assert not any(e["name"] == launch.DEPS_DIR_ENV for e in job["spec"]["trainer"]["env"])
    (proj / "requirements.txt").write_text("numpy\n")
    rc, (cm, job), err = dry_run(capsys, proj, "--deps-timeout", "900")
    assert rc == 0, err
    pod = _pod(job)
    assert {"name": tj.DEPS_VOLUME, "emptyDir": {"sizeLimit": tj.DEPS_SIZE_LIMIT}} in pod["volumes"]  # restricted Pod Security: emptyDir, never hostPath
    assert {"name": tj.DEPS_VOLUME, "mountPath": tj.DEPS_MOUNT} in pod["containers"][0]["volumeMounts"]
    env = {e["name"]: e["value"] for e in job["spec"]["trainer"]["env"]}
    assert env[launch.DEPS_TIMEOUT_ENV] == "900" and env[launch.INDEX_URL_ENV] == "https://pypi.org/simple" and "requirements.txt" in cm["data"]


def test_the_job_is_named_by_its_code_dir_not_its_code(proj, capsys):
    rc, (cm1, job1), _ = dry_run(capsys, proj)
    (proj / "train.py").write_text("print('fixed')\n")
    rc, (cm2, job2), _ = dry_run(capsys, proj)
    assert job1["metadata"]["name"] == job2["metadata"]["name"] == "my-model-v2"
    assert cm1["metadata"]["name"] != cm2["metadata"]["name"]  # the ConfigMap keeps its content hash
    env = {e["name"]: e["value"] for e in job2["spec"]["trainer"]["env"]}
    assert env[tj.CHECKPOINT_DIR_ENV] == "/mnt/checkpoints/my-model-v2" and tj.RESUME_FROM_ENV not in env


# a name that loses characters as a label: what is left (leading digits dropped) and a hash of the whole
HASHED = r"-[0-9a-f]{8}"


@pytest.mark.parametrize(
    ("dirname", "name"),
    [("2024_exp", "exp" + HASHED), ("---", "job" + HASHED), ("X" * 46 + "_y", "x" * 39 + HASHED), ("My_Model.v2", "my-model-v2" + HASHED), ("exp-2024", "exp-2024"), ("x" * 46 + "-y", "x" * 46 + "-y")],
)  # longer ones: tests/test_trainjob_names.py
def test_default_names_are_rfc1035_labels(tmp_path, dirname, name):
    d = tmp_path / dirname
    d.mkdir()
    (d / "t.py").write_text("")
    got = objects.default_name(code.collect(d))
    assert re.fullmatch(name, got) and objects.name_problem(got) is None


def test_resume_from_points_at_the_other_jobs_directory(proj, capsys):
    rc, (_, job), err = dry_run(capsys, proj, "--name", "run-b", "--resume-from", "run-a")
    assert rc == 0, err
    env = {e["name"]: e["value"] for e in job["spec"]["trainer"]["env"]}
    assert env[tj.RESUME_FROM_ENV] == "/mnt/checkpoints/run-a" and env[tj.CHECKPOINT_DIR_ENV] == "/mnt/checkpoints/run-b"


def test_bad_resume_from_and_deps_timeout_are_refused_one_line_each(proj, capsys):
    rc, _, err = dry_run(capsys, proj, "--name", "run-b", "--resume-from", "Run_A", "--deps-timeout", "5")
    assert rc == 2 and err.count("\n") == 2
    assert "--resume-from 'Run_A'" in err and "--deps-timeout 5: allowed: 10 to 7200 seconds" in err
    rc, _, err = dry_run(capsys, proj, "--resume-from", "my-model-v2")  # the default name: its own
    assert rc == 2 and "the job's own name" in err


def test_an_efa_job_on_its_own_image_is_warned_not_refused(proj, capsys):
    flags = ("--efa-zone", "us-east-1a", "--instance-type", "p5.48xlarge", "--gpus-per-node", "8")
    rc, _, err = dry_run(capsys, proj, *flags, "--image", "registry.example.com/team/img:1")
    assert rc == 0 and err.startswith("trainctl: warning: --image registry.example.com/team/img:1 with --efa-zone: not the platform's training image")
    rc, _, err = dry_run(capsys, proj, "--image", "registry.example.com/team/img:1")
    assert rc == 0 and "warning" not in err  # no EFA: any image
    rc, out, err = dry_run(capsys, proj, *flags)  # no --image: the printed job names none, so it would run on the stock image
    assert rc == 0 and err.count("\n") == 1 and err.startswith("trainctl: warning: --efa-zone: the job names no image (a dry run, or a cluster that publishes no platform facts)")
    assert "image" not in next(o for o in out if o["kind"] == "TrainJob")["spec"]["trainer"]
    req = objects.Request(namespace="v", nodes=1, command=["python", "t.py"], efa_zone="us-east-1a", image="acct.dkr.ecr.us-east-1.amazonaws.com/w@sha256:" + "0" * 64)
    assert objects.efa_image_warning(req, {"image": req.image}) is None  # the platform's own image
    assert "the platform's training image (x/y:1)" in (objects.efa_image_warning(req, {"image": "x/y:1"}) or "")


# --- status and diagnose ------------------------------------------------------------------------


def _failed_pod(message: str, code: int = 4) -> dict:
    term = {"exitCode": code, "reason": "Error", "message": message, "finishedAt": "2026-11-24T10:00:00Z"}
    return {"metadata": {"name": "p-node-0-0-abc"}, "status": {"phase": "Failed", "containerStatuses": [{"name": "node", "state": {"terminated": term}}]}}


def test_status_and_diagnose_report_a_failed_install():
    pod = _failed_pod("dependencies failed to install: No matching distribution found for tinydep==0.2")
    tjob = {"metadata": {"name": "p"}, "status": {}}
    assert jobstate.last_failure(tjob, [pod], []) == "pod p-node-0-0-abc: dependencies failed to install: No matching distribution found for tinydep==0.2"
    found = {f.cause: f for f in diagnose.diagnose(diagnose.Evidence(trainjob=tjob, pods=[pod]))}
    assert found["dependencies failed to install"].evidence == ["pod p-node-0-0-abc: dependencies failed to install: No matching distribution found for tinydep==0.2"]
    conflict = _failed_pod("dependencies failed to install: Cannot install -r requirements.txt (line 1) and a==1 because these package versions have conflicting dependencies.", code=3)
    found = {f.cause: f for f in diagnose.diagnose(diagnose.Evidence(trainjob=tjob, pods=[conflict]))}
    assert found["dependencies failed to install"].evidence == ["pod p-node-0-0-abc: dependencies failed to install: Cannot install -r requirements.txt (line 1) and a==1 because these package versions have conflicting dependencies."]
    logged = diagnose.diagnose(diagnose.Evidence(log_lines={"node 1": ["TRAINING_DEPS_FAILED dependencies failed to install: pip did not finish within 3 s"]}, exit_codes={"j-node-0-1": 4}))
    assert [(f.cause, f.evidence) for f in logged] == [("dependencies failed to install", ["j-node-0-1: exit code 4 (the launcher: requirements.txt did not install)", "node 1: dependencies failed to install: pip did not finish within 3 s"])]


# --- a resubmit on a cluster --------------------------------------------------------------------


class FakeCluster:
    """What jobstate.submit calls, with one existing TrainJob of a phase."""

    namespace = "vision"

    def __init__(self, existing: dict | None):
        self.existing, self.calls = existing, []

    def can(self, *_):
        return True, ""

    def served_trainer_version(self):
        return "v2.3.0"

    def current_runtime(self, _):
        return "torch-distributed-gpu-777f43c4"

    def platform_facts(self):
        return None

    def create_configmap(self, body):
        self.calls.append(("create cm", body["metadata"]["name"]))
        return True

    def delete_configmap(self, name):
        self.calls.append(("delete cm", name))
        return True

    def create_trainjob(self, body):
        if self.existing is not None:
            raise ClusterError(f'creating trainjob {body["metadata"]["name"]}: trainjobs.trainer.kubeflow.org "{body["metadata"]["name"]}" already exists')
        self.calls.append(("create tj", body["metadata"]["name"]))
        return body

    def get_trainjob(self, name):
        if self.existing is None:
            raise ClusterError(f"trainjob {name} not found in namespace {self.namespace}")
        return self.existing

    def delete_trainjob_foreground(self, name):
        self.calls.append(("delete tj foreground", name))
        self.existing = None

    def list_trainjobs(self):
        return [self.existing] if self.existing else []


def _existing(phase_condition: str | None) -> dict:
    conds = [{"type": phase_condition, "status": "True"}] if phase_condition else []
    pod = {"volumes": [{"name": tj.CODE_VOLUME, "configMap": {"name": "training-code-old"}}]}
    return {"metadata": {"name": "my-model-v2"}, "spec": {"runtimePatches": [{"trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {"template": {"spec": pod}}}}]}}}}]},
            "status": {"conditions": conds, "jobsStatus": [{"active": 1}] if not phase_condition else []}}


def _req() -> objects.Request:
    return objects.Request(namespace="vision", nodes=1, command=["python", "train.py"])


def test_a_finished_job_of_the_name_is_replaced_and_its_old_code_removed(proj):
    cluster = FakeCluster(_existing("Failed"))
    done = jobstate.submit(cluster, _req(), code.collect(proj), instance_type_given=False)  # type: ignore[arg-type]
    assert done["replaced"] == "Failed" and done["trainjob"] == "my-model-v2"
    assert [c[0] for c in cluster.calls] == ["create cm", "delete tj foreground", "delete cm", "create tj"]
    assert cluster.calls[2] == ("delete cm", "training-code-old")


def test_a_running_job_of_the_name_refuses_the_submit_and_leaves_nothing(proj):
    cluster = FakeCluster(_existing(None))
    with pytest.raises(objects.SubmitError, match=r"trainjob my-model-v2 exists and is Running: a job of that name is replaced only once it finished"):
        jobstate.submit(cluster, _req(), code.collect(proj), instance_type_given=False)  # type: ignore[arg-type]
    assert [c[0] for c in cluster.calls] == ["create cm", "delete cm"]
    assert json.dumps(cluster.existing)  # untouched


# --- on the emulator (trainctl's local mode): the objects the cluster path creates -------------

RESUMES = """import os, pathlib, time, tinydep
own, other = pathlib.Path(os.environ["TRAINING_CHECKPOINT_DIR"]), os.environ.get("TRAINING_RESUME_FROM")
steps = sorted(int(p.name[5:]) for d in (own, pathlib.Path(other) if other else None) if d and d.is_dir() for p in d.glob("step-*"))
start = steps[-1] if steps else 0
print(f"VERSION {VERSION} dep {tinydep.VALUE} resumed from step {start}", flush=True)
if os.environ["RANK"] == "0":
    own.mkdir(parents=True, exist_ok=True)
    for step in range(start + 1, start + 4):
        (own / f"step-{step}").write_text("saved")
"""


@pytest.fixture
def local_home(tmp_path, monkeypatch) -> pathlib.Path:
    from trainctl import local

    monkeypatch.setenv(local.HOME_ENV, str(tmp_path / "state"))
    return tmp_path / "state"


def _local_run(capsys, proj: pathlib.Path, *flags: str) -> tuple[dict, str, str]:
    import time

    from trainctl import local

    rc = cli.main(["submit", "--local", "--nodes", "2", *flags, str(proj), "--", "python", "train.py"])
    _, err = capsys.readouterr()
    assert rc == 0, err
    name = flags[flags.index("--name") + 1] if "--name" in flags else objects.default_name(code.collect(proj))
    deadline = time.monotonic() + 240
    while (r := local.report(name))["phase"] == "Running" and time.monotonic() < deadline:
        time.sleep(0.5)
    return r, "\n".join(local.logs(name, node=None, follow=False)), err


@pytest.mark.slow
def test_local_requirements_installed_then_a_fixed_resubmit_resumes_from_its_checkpoints(local_home, tmp_path, capsys):
    proj = code_dir(tmp_path, "tinydep==0.1")
    (proj / "launch.py").unlink()  # trainctl ships its own beside the code
    (proj / "train.py").write_text("VERSION = 1\n" + RESUMES)
    r, logs, _ = _local_run(capsys, proj)
    assert r["phase"] == "Complete", logs
    assert "Successfully installed tinydep-0.1" in logs and "VERSION 1 dep 42 resumed from step 0" in logs
    (proj / "train.py").write_text("VERSION = 2\n" + RESUMES)  # the fix: same directory, same name
    r, logs, err = _local_run(capsys, proj)
    assert r["phase"] == "Complete", logs
    assert "replaced the finished (Complete) local job code" in err
    assert "VERSION 2 dep 42 resumed from step 3" in logs  # the first run's last checkpoint
    r, logs, _ = _local_run(capsys, proj, "--name", "other", "--resume-from", "code")
    assert r["phase"] == "Complete" and "resumed from step 6" in logs


@pytest.mark.slow
def test_local_failed_install_is_reported_by_status_and_diagnose(local_home, tmp_path, capsys):
    proj = code_dir(tmp_path, "tinydep==0.2")
    (proj / "launch.py").unlink()
    (proj / "train.py").write_text("print('USER CODE RAN')\n")
    r, logs, _ = _local_run(capsys, proj, "--name", "nodeps")
    assert r["phase"] == "Failed" and "USER CODE RAN" not in logs
    assert r["cause"] == "dependencies failed to install: No matching distribution found for tinydep==0.2"
    assert cli.main(["diagnose", "--local", "nodeps"]) == 0
    out, _ = capsys.readouterr()
    assert out.startswith("dependencies failed to install:") and "No matching distribution found for tinydep==0.2" in out
