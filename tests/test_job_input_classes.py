"""Bad input, by class, through every entry point (issue 45, round 5): a job's env and Secret
references (config/job_env.py), requirements.txt (config/job_requirements.py), trainctl secret's
files, unreadable code, default job names of any script, S3 folders of any script. Each class: the
one module's rule, then the same answer through the stack's settings loader, the TrainJob stack
loader, trainctl's CLI (cluster dry run and --local) and the portal's API (both modes); no
traceback, no value echoed, valid inputs of the same shapes pass."""

from __future__ import annotations

import io
import json
import os
import pathlib
import re

import pytest
from fastapi.testclient import TestClient

from config import job_env, job_requirements, trainjob_names
from config.run_config import RUN_PROJECT, load_run
from config.schema import ConfigErrors
from config.secrets import named_secret_value, secret_shape
from config.settings import load_settings
from config.team_models import prefix_problem
from tests.conftest import stack_file
from tests.test_portal import alb_token, app_client  # noqa: F401  (app_client: the cluster portal's app, a fixture)
from trainctl import cli, code, local, objects, secret_cmd
from trainctl.portal import submission
from trainctl.ui import build_local
from workloads.builders import trainjobs as tj

TOKEN = "ghp_" + "a1B2c3D4e5F6g7H8i9J0kLmNoPqR"  # a GitHub token's shape
HEX96 = "0123456789abcdef" * 6
PASSWORD = "hunter2hunter2"
# a bad job env: a name the start depends on, a credential by name, one by shape, a Secret key '..'
BAD_ENV = {"PATH": "/nonexistent", "LD_PRELOAD": "/opt/evil/x.so", "PYTHONHOME": "/opt/nothing", "DB_PASS": PASSWORD, "SEED": HEX96}
BAD_SECRET_ENV = {"K": "wandb/.."}
EXPECTED = {("env", "PATH", "the job's start depends on it"), ("env", "LD_PRELOAD", "the job's start depends on it"), ("env", "PYTHONHOME", "the job's start depends on it"),
            ("env", "DB_PASS", "the value looks like a secret"), ("env", "SEED", "the value looks like a secret"), ("secretEnv", "K", "not a Secret reference")}
VALUES = (PASSWORD, HEX96, "/nonexistent", "/opt/evil/x.so", "/opt/nothing")


def _unshown(text: str) -> None:
    assert "Traceback" not in text
    for value in (*VALUES, TOKEN):
        assert value not in text, value


# --- the rules -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["PATH", "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "LD_BIND_NOW", "GLIBC_TUNABLES", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP",
                                  "PYTHON_GIL", "CUDA_VISIBLE_DEVICES", "TRAINCTL_LOCAL_JOB"])
def test_names_the_containers_start_depends_on_are_refused(name):
    assert "the job's start depends on it" in (job_env.name_problem(name) or "")


@pytest.mark.parametrize("name", ["NCCL_DEBUG", "PYTHONUNBUFFERED", "PYTHONHASHSEED", "PYTHONFAULTHANDLER", "PYTHONWARNINGS", "MY_PATH", "LDAP_HOST", "HOME", "OMP_NUM_THREADS", "path",
                                  "PYTHONOPTIMIZE", "PYTHONSAFEPATH", "PYTHONNOUSERSITE"])  # interpreter switches (item 6 of the review): a job's to set
def test_names_of_the_same_shape_a_job_may_set(name):
    assert job_env.name_problem(name) is None


@pytest.mark.parametrize(("name", "value"), [
    ("DB_PASS", PASSWORD), ("DB_PWD", "x1y2z3"), ("API_KEY_2", "abc-def-ghi"), ("wandbApiKey", "my-wandb-value"), ("MY_SECRET", "s3cr3t"), ("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG"),
    ("SEED", HEX96), ("W", "0123456789abcdef0123456789abcdef"), ("X", "AKIA" + "ABCDEFGHIJKLMNOP"), ("X", TOKEN), ("X", "xoxb-1234567890-abcdef"),
    ("X", "sk-" + "A1b2" * 6), ("X", "glpat-" + "x1Y2" * 5), ("X", "pypi-" + "AgEIcHlwaS5vcmc" * 2), ("X", "U6qlP98K1F-DIDU6kE40OMTTTjQI9STP"),
    ("X", "https://user:pw@host.example/x"), ("X", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.sig"),
])
def test_credentials_by_name_or_shape_are_refused_unshown(name, value):
    (found,) = [p for p in job_env.problems({name: value}, {}) if "looks like a secret" in p[2]]
    assert value not in found[2] and "secretEnv" in found[2]


@pytest.mark.parametrize(("name", "value"), [
    ("MAX_TOKENS", "512"), ("TOKENIZERS_PARALLELISM", "false"), ("HF_TOKEN_FILE", "/var/run/secrets/hf/token"), ("SECRET_NAME", "wandb"), ("S3_KEY_PREFIX", "data/train/"),
    ("HF_HUB_DISABLE_IMPLICIT_TOKEN", "1"), ("HF_TOKEN", "$(OTHER_TOKEN)"), ("MODEL_SHA256", "ab" * 32), ("GIT_COMMIT", "0123456789abcdef" * 2 + "01234567"),
    ("IMAGE", "repo@sha256:" + "ab" * 32), ("MODEL", "mistralai/Mixtral-8x7B-Instruct-v0.1"), ("RUN", "ResNet50Baseline2024v3Final"), ("DIR", "/mnt/checkpoints/my-model-v2"),
    ("PWD", "/workspace"), ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),
])
def test_values_of_the_same_shapes_that_are_no_credentials_pass(name, value):
    assert job_env.problems({name: value}, {}) == []


def test_secret_keys_follow_secret_sets_rule_everywhere():
    for key in (".", ".."):
        assert job_env.secret_ref(f"wandb/{key}") is None and job_env.secret_key_problem(key) is not None
    assert job_env.secret_ref("wandb/.api-key") == ("wandb", ".api-key")


def test_a_name_shaped_like_a_secret_is_never_shown(capsys, proj):
    capsys.readouterr()
    rc = cli.main(["submit", "--dry-run", "-n", "vision", "--nodes", "1", "--env", f"{TOKEN}=1", "--env", f"{TOKEN}=2", str(proj), "--", "python", "train.py"])
    err = capsys.readouterr().err
    assert rc == 2 and "given twice" in err and "not shown" in err and TOKEN not in err


# --- the same answer through every entry point -----------------------------------------------------------


def _stack_sections() -> tuple[dict, str]:
    raw = stack_file("dev")["config"]
    return {k.split(":", 1)[1]: v for k, v in raw.items() if k.startswith("training-platform:")}, raw["aws:region"]


def test_the_stack_config_gives_the_same_answer():
    sections, region = _stack_sections()
    sections["trainjobs"] = {**sections["trainjobs"], "ddp": {**sections["trainjobs"]["ddp"], "env": BAD_ENV, "secretEnv": BAD_SECRET_ENV}}
    with pytest.raises(ConfigErrors) as err:
        load_settings(sections, stack="dev", region=region)
    keys = set(err.value.keys)
    assert {f"trainjobs.ddp.{which}.{name}" for which, name, _ in EXPECTED} <= keys
    _unshown(str(err.value))


def test_a_trainjob_stack_gives_the_same_answer():
    names = {k: w.name for k, w in tj.WORKLOADS.items()}
    with pytest.raises(ConfigErrors) as err:
        load_run({"platform": "organization/training-platform/dev", "ddp": {"env": BAD_ENV, "secretEnv": BAD_SECRET_ENV}}, stack="nightly", base_names=names)
    assert {f"{RUN_PROJECT}:ddp.{which}.{name}" for which, name, _ in EXPECTED} <= set(err.value.keys)
    _unshown(str(err.value))


def _flags() -> list[str]:
    return [*(a for n, v in BAD_ENV.items() for a in ("--env", f"{n}={v}")), *(a for n, v in BAD_SECRET_ENV.items() for a in ("--secret-env", f"{n}={v}"))]


def _expected_lines(flags: dict[str, str]) -> set[tuple[str, str]]:
    return {(f"{flags[which]} {name}", why) for which, name, why in EXPECTED}


def _assert_lines(err: str, expected: set[tuple[str, str]]) -> None:
    lines = [line.removeprefix("trainctl: error: ") for line in err.strip().splitlines()]
    for head, why in expected:
        assert sum(line.startswith(f"{head}: {why}") for line in lines) == 1, (head, lines)




def test_trainctl_submit_gives_the_same_answer(capsys, proj):
    capsys.readouterr()
    rc = cli.main(["submit", "--dry-run", "-n", "vision", "--nodes", "1", *_flags(), str(proj), "--", "python", "train.py"])
    out = capsys.readouterr()
    assert rc == 2 and out.out == ""
    _assert_lines(out.err, _expected_lines(objects.ENV_FLAGS))
    _unshown(out.err)


def test_trainctl_submit_local_gives_the_same_answer_and_refuses_secret_env(capsys, proj, tmp_path, monkeypatch):
    monkeypatch.setenv(local.HOME_ENV, str(tmp_path / "state"))
    capsys.readouterr()
    rc = cli.main(["submit", "--local", "--nodes", "1", *_flags(), str(proj), "--", "python", "train.py"])
    out = capsys.readouterr()
    assert rc == 2 and out.out == "" and not (tmp_path / "state" / "jobs").exists()  # nothing started: PATH=/nonexistent never reaches the emulator
    _assert_lines(out.err, _expected_lines(objects.ENV_FLAGS) | {("--secret-env", "a run on this machine reads no cluster Secrets")})
    _unshown(out.err)


def _api_body(namespace: str) -> dict:
    return {"namespace": namespace, "framework": "pytorch", "training_code": "print(1)", "config": {"num_nodes": 1, "gpu_per_node": 1}, "env": BAD_ENV, "secret_env": BAD_SECRET_ENV}


def _assert_problems(r, expected: set[tuple[str, str]]) -> None:
    assert r.status_code == 422, r.text
    problems = r.json()["problems"]
    for field, head, why in expected:
        assert sum(p["field"] == field and p["problem"].startswith(f"{head}: {why}" if why else head) for p in problems) == 1, (field, head, problems)
    _unshown(r.text)


PORTAL_FIELDS = {"env": "env", "secretEnv": "secret_env"}


def test_the_portals_api_gives_the_same_answer(app_client):  # noqa: F811
    r = app_client.post("/api/trainjob/create", headers={"x-amzn-oidc-data": alb_token()}, json=_api_body("vision"))
    _assert_problems(r, {(PORTAL_FIELDS[which], name, why) for which, name, why in EXPECTED})


@pytest.fixture
def local_ui(tmp_path, monkeypatch):
    monkeypatch.setenv(local.HOME_ENV, str(tmp_path / "state"))
    app, _ = build_local(8767)
    with TestClient(app, base_url="http://127.0.0.1:8767") as c:
        yield c


def test_the_local_portals_api_gives_the_same_answer_as_submit_local(local_ui, tmp_path):
    r = local_ui.post("/api/trainjob/create", json=_api_body("local"))
    _assert_problems(r, {(PORTAL_FIELDS[which], name, why) for which, name, why in EXPECTED} | {("secret_env", "a run on this machine reads no cluster Secrets", "")})
    assert not (tmp_path / "state" / "jobs").exists()


# --- trainctl secret ---------------------------------------------------------------------------------------


def test_secret_set_with_its_arguments_swapped_never_prints_the_value(capsys):
    capsys.readouterr()
    rc = cli.main(["secret", "set", "-n", "vision", f"api-key={TOKEN}", "wandb"])
    out = capsys.readouterr()
    assert rc == 2 and out.out == "" and TOKEN not in out.err and "the name first" in out.err and "argument 1: allowed: KEY=VALUE" in out.err


def test_a_secret_file_is_judged_by_its_size_before_it_is_read(tmp_path, monkeypatch):
    big = tmp_path / "big"
    with open(big, "wb") as fh:
        fh.truncate(3 * 1024**3)  # sparse: 3 GB by stat, nothing on disk
    reads: list[int] = []

    class Counted(io.FileIO):
        def read(self, n: int = -1) -> bytes:
            reads.append(n)
            return super().read(n)

    monkeypatch.setattr(secret_cmd, "open", lambda path, mode: Counted(path, "r"), raising=False)
    with pytest.raises(secret_cmd.SecretInputError, match=r"key k: .* holds 3221225472 bytes, more than the 1048576 bytes left"):
        secret_cmd.data_of([f"k=@{big}"])
    assert reads == []


class _Stream(io.BytesIO):
    def __init__(self, data: bytes):
        super().__init__(data)
        self.asked: list[int] = []

    def read(self, n: int | None = -1) -> bytes:
        self.asked.append(-1 if n is None else n)
        return super().read(n)


def test_standard_input_is_read_to_the_limit_only():
    stream = _Stream(b"x" * (secret_cmd.MAX_SECRET_BYTES * 3))
    with pytest.raises(secret_cmd.SecretInputError, match="more than 1048576 bytes"):
        secret_cmd.data_of(["a=12345", "k=@-"], stdin=stream)
    assert stream.asked == [secret_cmd.MAX_SECRET_BYTES - 5 + 1]
    assert secret_cmd.data_of(["k=@-"], stdin=io.BytesIO(b"x" * secret_cmd.MAX_SECRET_BYTES))["k"] == b"x" * secret_cmd.MAX_SECRET_BYTES


def test_secret_set_reads_a_file_under_the_limit(tmp_path):
    (tmp_path / "k").write_bytes(b"v" * 100)
    assert secret_cmd.data_of([f"k=@{tmp_path / 'k'}", "j=1"]) == {"k": b"v" * 100, "j": b"1"}


# --- requirements.txt ---------------------------------------------------------------------------------------

REQUIREMENTS = {
    f"--extra-index-url https://user:{TOKEN}@pypi.example.com/simple": "holds a credential",
    f"private-pkg @ https://host.example/p.whl?token={TOKEN}": "holds a credential",
    "--index-url https://mirror.example/simple": "--index-url: an index setting",
    "-i https://mirror.example/simple": "--index-url: an index setting",
    "--trusted-host mirror.example": "--trusted-host: an index setting",
    "--find-links https://download.example/whl": "--find-links with a URL: an index setting",
    "-e .": "an editable install",
    "./libs/mypkg": "a local path or archive exists only on this machine",
    "mypkg-1.0-py3-none-any.whl": "a local path or archive exists only on this machine",
    "mypkg @ file:///home/me/mypkg": "a file: URL exists only on this machine",
    "--find-links /home/me/wheels": "--find-links names a directory the code dir does not ship",
    "-r other.txt": "--requirement names a file the code dir does not ship",
}


def _requirements_proj(proj: pathlib.Path) -> list[tuple[str, str]]:
    lines = ["numpy==1.26.4", *REQUIREMENTS]
    (proj / "requirements.txt").write_text("\n".join(lines) + "\n")
    return [(f"requirements.txt line {i + 2}", why) for i, why in enumerate(REQUIREMENTS.values())]


def test_requirements_rules():
    files = {"requirements.txt": "\n".join(["numpy", *REQUIREMENTS]) + "\n"}
    found = job_requirements.problems(files.get, set(files))
    assert len(found) == len(REQUIREMENTS) and all(why in line for line, why in zip(found, REQUIREMENTS.values(), strict=True))
    assert TOKEN not in "\n".join(found)


def test_portable_requirements_pass():
    files = {
        "requirements.txt": "# pinned\nnumpy==1.26.4 ; python_version >= '3.10'  # a comment\ntorch>=2.0 \\\n  --hash=sha256:" + "ab" * 32
        + "\n--no-index\n--find-links wheels\n-r extra/more.txt\npkg @ https://github.com/o/r/archive/v1.zip\ngit+https://github.com/o/r@v1#egg=r\n--prefer-binary\n",
        "extra/more.txt": "tinydep==0.1\n", "wheels/tinydep-0.1-py3-none-any.whl": "",
    }
    assert job_requirements.problems(files.get, set(files)) == []


def test_a_shipped_included_file_is_judged_too():
    files = {"requirements.txt": "-r more.txt\n", "more.txt": "--index-url https://x.example/simple\n"}
    (line,) = job_requirements.problems(files.get, set(files))
    assert line.startswith("more.txt line 1: --index-url")


def test_trainctl_refuses_bad_requirements_at_submit(capsys, proj, tmp_path, monkeypatch):
    expected = _requirements_proj(proj)
    for extra in ([], ["--local"]):
        monkeypatch.setenv(local.HOME_ENV, str(tmp_path / "state"))
        capsys.readouterr()
        rc = cli.main(["submit", "--dry-run", "-n", "vision" if not extra else "local", "--nodes", "1", *extra, str(proj), "--", "python", "train.py"])
        out = capsys.readouterr()
        assert rc == 2 and out.out == "", out.err
        lines = [line.removeprefix("trainctl: error: ") for line in out.err.strip().splitlines()]
        assert len(lines) == len(expected) and all(line.startswith(f"{where}: ") and why in line for line, (where, why) in zip(lines, expected, strict=True)), lines
        _unshown(out.err)


def test_the_portals_uploads_refuse_bad_requirements(proj, local_ui):
    expected = _requirements_proj(proj)
    files = [("files", ("train.py", b"print(1)\n")), ("files", ("requirements.txt", (proj / "requirements.txt").read_bytes()))]
    with pytest.raises(submission.Problems) as err:  # the cluster portal's upload: the same collect, before anything is sent
        submission.code_bundle([submission.Part(name, data) for _, (name, data) in files], "proj")
    assert [p["problem"].split(":", 1)[0] for p in err.value.problems] == [where for where, _ in expected]
    csrf = local_ui.get("/submit").text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
    r = local_ui.post("/api/trainjob/upload", files=files, data={"namespace": "local", "framework": "pytorch", "num_nodes": "1", "gpu_per_node": "1"}, headers={"x-csrf-token": csrf})
    assert r.status_code == 422 and [p["field"] for p in r.json()["problems"]] == ["training_code"] * len(expected)
    _unshown(r.text)


# --- code dirs: unreadable files, names of any script ---------------------------------------------------------


def test_an_unreadable_file_is_named_as_a_file_error(capsys, proj, monkeypatch):
    (proj / "data.bin").write_bytes(b"x")
    real = pathlib.Path.read_bytes

    def denied(self):
        if self.name == "data.bin":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(pathlib.Path, "read_bytes", denied)
    capsys.readouterr()
    rc = cli.main(["submit", "--dry-run", "-n", "vision", "--nodes", "1", str(proj), "--", "python", "train.py"])
    err = capsys.readouterr().err
    assert rc == 2 and err == "trainctl: error: file 'data.bin' of the code dir cannot be read (Permission denied); make it readable or move it out of the code dir\n"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any directory")
def test_an_unreadable_directory_is_named(proj):
    sub = proj / "private"
    sub.mkdir()
    sub.chmod(0)
    try:
        with pytest.raises(code.CodeError, match="directory 'private' of the code dir cannot be read"):
            code.collect(proj)
    finally:
        sub.chmod(0o755)


@pytest.mark.parametrize(("a", "b"), [("模型", "实验"), ("проект", "задача"), ("données", "donnees-v1")])
def test_code_dirs_of_any_script_get_distinct_stable_names(tmp_path, capsys, a, b):
    names = []
    for dirname in (a, b):
        d = tmp_path / dirname
        d.mkdir()
        (d / "train.py").write_text("print(1)\n")
        capsys.readouterr()
        assert cli.main(["submit", "--dry-run", "-n", "vision", "--nodes", "1", "-o", "json", str(d), "--", "python", "train.py"]) == 0
        name = json.loads(capsys.readouterr().out)["items"][1]["metadata"]["name"]
        assert objects.name_problem(name) is None and name == objects.default_name(code.collect(d))
        names.append(name)
    assert names[0] != names[1] and "job" not in names[1:]


def test_a_decomposed_name_is_the_same_job_as_its_composed_form():
    assert trainjob_names.label_from("donne\u0301es", 40) == trainjob_names.label_from("donn\u00e9es", 40)
    # a name that loses characters as a label gets a hash of the whole (config/trainjob_names.py)
    assert re.fullmatch(r"my-model-v2-[0-9a-f]{8}", trainjob_names.label_from("My_Model.v2", 40)) and re.fullmatch(r"job-[0-9a-f]{8}", trainjob_names.label_from("---", 40))
    assert trainjob_names.label_from("my-model-v2", 40) == "my-model-v2"
    assert len(trainjob_names.label_from("模" * 80, 20)) <= 20


# --- S3 folders ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", ["données/", "数据/训练/", "donne\u0301es/", "datasets/imagenet/"])
def test_s3_folders_of_any_script_are_granted(prefix):
    assert prefix_problem(prefix) is None


@pytest.mark.parametrize("prefix", ["dat a/", "data/\u200b/", "a?/", "é" * 22 + "/"])
def test_s3_folders_with_spaces_invisible_characters_wildcards_or_too_long_are_refused(prefix):
    assert "ending with '/'" in (prefix_problem(prefix) or "")


# --- the helpers agree -------------------------------------------------------------------------------------------


def test_the_name_rule_and_the_shape_rule_never_return_the_value():
    assert named_secret_value("DB_PASS", PASSWORD) and secret_shape(PASSWORD) is None
    assert PASSWORD not in (job_env.value_problem("DB_PASS", PASSWORD) or "")
    assert HEX96 not in (secret_shape(HEX96) or "")
