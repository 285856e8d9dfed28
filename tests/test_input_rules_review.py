"""A review's defect classes in the input rules (config/secrets.py, config/job_env.py,
config/job_requirements.py, trainctl/code.py, trainctl/objects.py, trainctl/secrets.py): each class
refused (or allowed) by its one rule, through the entry points that echo values, never showing a
value; valid inputs of the same shapes pass."""

from __future__ import annotations

import codecs

import pytest

from config import job_env, job_requirements
from config.schema import ConfigErrors
from config.secrets import REDACTED, looks_secret, secret_shape, shown
from config.settings import load_settings
from tests.conftest import stack_file
from trainctl import cli, code, objects
from trainctl.secrets import command_problems

TOKEN = "ghp_" + "a1B2c3D4e5F6g7H8i9J0kLmNoPqR"  # a GitHub token's shape
HF = "hf_" + "aBcDeFgHiJkLmNoPqRsTuV"
HEX96 = "0123456789abcdef" * 6
HEX32 = "9f86d081884c7d659a2feaa0c55ad015"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.sig"
GLPAT = "glpat-" + "x1Y2" * 5
PYPI = "pypi-" + "AgEIcHlwaS5vcmc" * 2
B64 = "U6qlP98K1F-DIDU6kE40OMTTTjQI9STP"
DAPI = "dapi" + "0123456789abcdef" * 2
SLACK = "https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX"
SECRET = "Zx9-q7Lw-22Kp"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
SHA256 = "ab" * 32
SHAPED = (TOKEN, HF, HEX96, HEX32, JWT, GLPAT, PYPI, B64)


def _unshown(text: str, *values: str) -> None:
    assert "Traceback" not in text
    for value in values or (*SHAPED, SECRET, DAPI, SLACK):
        assert value not in text, value


def _req(text: str | bytes, **more: str | bytes) -> list[str]:
    files = {"requirements.txt": text, **more}
    return job_requirements.problems(files.get, set(files) | {"wheels/x-1-py3-none-any.whl"})




# --- 1: requirements.txt decoded as pip decodes it ---------------------------------------------------------

LEAKY = f"--extra-index-url https://user:{TOKEN}@pypi.example.com/simple\n"


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-8-sig"])
def test_a_requirements_file_with_a_byte_order_mark_is_judged(encoding, proj):
    data = LEAKY.encode(encoding) if encoding != "utf-16-le" else codecs.BOM_UTF16_LE + LEAKY.encode(encoding)
    if encoding == "utf-16-be":
        data = codecs.BOM_UTF16_BE + LEAKY.encode(encoding)
    (proj / "requirements.txt").write_bytes(data)
    with pytest.raises(code.CodeError) as err:
        code.collect(proj)
    assert "requirements.txt line 1: holds a credential" in str(err.value)
    _unshown(str(err.value))


def test_a_utf8_bom_before_an_index_option_is_seen(proj):
    (proj / "requirements.txt").write_text("\ufeff--index-url https://evil.example/simple\nnumpy\n", encoding="utf-8")
    with pytest.raises(code.CodeError) as err:
        code.collect(proj)
    assert str(err.value).startswith("requirements.txt line 1: --index-url: an index setting")


@pytest.mark.parametrize("data", ["numpy\n# caf\u00e9\n".encode("latin-1"), LEAKY.encode("utf-32"), b"# -*- coding: nosuch -*-\nnumpy\n", b"\xff\xfe-\x00-"])
def test_a_requirements_file_pip_cannot_decode_is_refused_in_one_line(proj, data):
    (proj / "requirements.txt").write_bytes(data)
    with pytest.raises(code.CodeError) as err:
        code.collect(proj)
    assert str(err.value) == f"requirements.txt: {job_requirements.UNDECODABLE}"


def test_valid_requirements_in_utf16_or_with_a_bom_pass(proj):
    for data in ("numpy==1.26.4\ntorch>=2.0\n".encode("utf-16"), "\ufeffnumpy==1.26.4\n".encode()):
        (proj / "requirements.txt").write_bytes(data)
        assert code.collect(proj).paths["requirements.txt"] == "requirements.txt"


# --- 2: one credential rule for echoed values and commands -----------------------------------------------


@pytest.mark.parametrize("value", SHAPED)
def test_looks_secret_knows_every_shape_secret_shape_knows(value):
    assert looks_secret("trainjobs.ddp.image", value) and looks_secret("cluster.adminPrincipalArns[0]", value)
    assert shown(value) == REDACTED and shown("g5.xlarge") == "'g5.xlarge'"


@pytest.mark.parametrize(("key", "value"), [("image", f"registry.example.com/{HEX32}:1"), ("image", f"registry.example.com/team/{GLPAT}:1")])
def test_the_settings_loader_never_prints_a_shaped_value(key, value):
    raw = stack_file("dev")["config"]
    sections = {k.split(":", 1)[1]: v for k, v in raw.items() if k.startswith("training-platform:")}
    sections["trainjobs"] = {**sections["trainjobs"], "ddp": {**sections["trainjobs"]["ddp"], key: value + " x"}}
    sections["cluster"] = {**sections["cluster"], "adminPrincipalArns": [JWT]}
    with pytest.raises(ConfigErrors) as err:
        load_settings(sections, stack="dev", region=raw["aws:region"])
    assert REDACTED in str(err.value)
    _unshown(str(err.value), value, JWT)


@pytest.mark.parametrize("flags", [["--image", f"{HF}:latest x"], ["--name", HF], ["--priority", HF], ["--instance-type", HF], ["--resume-from", HF]])
def test_trainctl_never_echoes_a_shaped_value(capsys, proj, flags):
    rc = cli.main(["submit", "--dry-run", "-n", "vision", "--nodes", "1", *flags, str(proj), "--", "python", "train.py"])
    err = capsys.readouterr().err
    assert rc == 2 and REDACTED in err, err
    _unshown(err, HF)


def test_trainctl_echoes_plain_bad_values():
    assert shown("urgent") == "'urgent'"
    lines = objects.problems(objects.Request(namespace="vision", nodes=1, command=["python", "train.py"], priority="urgent", instance_type="g9.huge"))
    assert any("--priority 'urgent'" in line for line in lines) and any("'g9.huge'" in line for line in lines), lines


@pytest.mark.parametrize("value", [HEX96, GLPAT, JWT, PYPI, B64, DAPI])
def test_a_command_is_judged_by_the_env_rule(value):
    (line,) = command_problems(["python", "train.py", "--x", value])
    assert line.startswith("argument 4 of the command (after --x) looks like a secret") and value not in line
    assert secret_shape(value) is not None


def test_commands_of_the_same_shapes_pass():
    assert command_problems(["python", "train.py", "--revision", COMMIT, "--model", "mistralai/Mixtral-8x7B-Instruct-v0.1", "--lr", "3e-4",
                             "--pad-token", "<pad>", "--out", "/mnt/checkpoints/run-2024", "--basic", "settings"]) == []


# --- 3: pip's option spellings ------------------------------------------------------------------------------


@pytest.mark.parametrize(("line", "why"), [
    ("--extra-index https://x.example/simple", "--extra-index-url: an index setting"),
    ("--index https://x.example/simple", "--index-url: an index setting"),
    ("--index=https://x.example/simple", "--index-url: an index setting"),
    ("--find-link https://x.example/whl", "--find-links with a URL: an index setting"),
    ("-fhttps://x.example/whl", "--find-links with a URL: an index setting"),
    ("-ihttps://x.example/simple", "--index-url: an index setting"),
    ("--trusted mirror.example", "--trusted-host: an index setting"),
    ("-e.", "an editable install"),
    ("--edit .", "an editable install"),
    ("-r https://x.example/more.txt", "--requirement names a URL"),
    ("-c https://x.example/c.txt", "--constraint names a URL"),
    ("--requirement=https://x.example/more.txt", "--requirement names a URL"),
    ("-rmissing.txt", "--requirement names a file the code dir does not ship"),
    ("mypkg @ ./libs/mypkg", "a local path or archive exists only on this machine"),
    ("mypkg[extra]@/home/me/mypkg", "a local path or archive exists only on this machine"),
    ("numpy --index-url https://x.example/simple", "--index-url: an index setting"),
    ("--no https://x.example", "an option pip does not read"),
    ("--unknown-option", "an option pip does not read"),
])
def test_pip_option_spellings_are_judged_as_pip_reads_them(line, why):
    (found,) = _req(line + "\n")
    assert found.startswith("requirements.txt line 1: ") and why in found, found


def test_a_glued_included_file_is_judged_too():
    (found,) = _req("-rmore.txt\n", **{"more.txt": "--extra-index https://x.example/simple\n"})
    assert found.startswith("more.txt line 1: --extra-index-url: an index setting")
    (found,) = _req("-cmore.txt\n", **{"more.txt": LEAKY.encode("utf-16")})
    assert found.startswith("more.txt line 1: holds a credential")


def test_valid_option_spellings_pass():
    text = ("--no-index\n-fwheels\n--find-links=wheels\n--pre\n--prefer-binary\n--only-binary=:all:\n-rmore.txt\n-c more.txt\nnumpy --hash=sha256:" + SHA256 + "\n"
            "--require-hashes\n--use-feature=truststore\npkg -C key=value --config-settings=k=v\n--ext https://x.example/simple-is-refused-below\n")
    (found,) = _req(text, **{"more.txt": "tinydep==0.1\n"})
    assert found.startswith("requirements.txt line 13: --extra-index-url: an index setting"), found


# --- 4: hashes and commits are no credentials; SSH URLs need a key ----------------------------------------------


@pytest.mark.parametrize("line", [
    f"git+https://github.com/o/r.git@{COMMIT}#egg=r",
    f"r @ git+https://github.com/o/r.git@{COMMIT}",
    f"pkg @ https://files.example/pkg-1.0-py3-none-any.whl#sha256={SHA256}",
    f"pkg @ https://files.example/pkg.tar.gz#sha512={'cd' * 64}",
    f"pkg @ https://files.example/pkg.tar.gz#md5={HEX32}",
])
def test_hashes_and_vcs_commits_pass(line):
    assert _req(line + "\n") == []


@pytest.mark.parametrize("line", [
    f"git+https://github.com/o/r.git@{COMMIT}#egg=r&token={TOKEN}",
    f"pkg @ https://user:{SECRET}@files.example/pkg.whl#sha256={SHA256}",
    f"git+https://{TOKEN}@github.com/o/r.git@{COMMIT}",
    f"pkg @ https://files.example/{HEX96}/pkg.whl",
])
def test_credentials_beside_hashes_and_commits_are_still_refused(line):
    (found,) = _req(line + "\n")
    assert "holds a credential" in found
    _unshown(found)


@pytest.mark.parametrize("line", ["git+ssh://git@github.com/o/r.git#egg=r", "r @ git+ssh://git@github.com/o/r.git@v1"])
def test_an_ssh_url_is_refused_for_want_of_a_key(line):
    (found,) = _req(line + "\n")
    assert found == f"requirements.txt line 1: {job_requirements.SSH}"


# --- 5: the index message -------------------------------------------------------------------------------------------


def test_the_index_message_points_at_an_image():
    (found,) = _req("--index-url https://download.pytorch.org/whl/cu121\n")
    assert "dependencies settings" not in found and "brings an image with its packages (--image)" in found


# --- 6, 7, 8: env values and names ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "value"), [
    ("WANDB_RUN_ID", HEX32), ("RUN_ID", HEX32), ("TRACE_ID", HEX32), ("REQUEST_UUID", "9f86d081-884c-7d65-9a2f-eaa0c55ad015"), ("WANDB_RUN", HEX32),
    ("PAD_TOKEN", "<pad>"), ("EOS_TOKEN", "</s>"), ("BOS_TOKEN", "<s>"), ("SPECIAL_TOKEN", "[MASK]"), ("EOT_TOKEN", "<|endoftext|>"),
    ("SORT_KEY", "timestamp"), ("PRIMARY_KEY", "id"), ("TOKEN_LIMIT", "2048"), ("EVAL_PASS", "final"), ("SECRET_MOUNT", "/var/run/secrets/x"),
    ("PYTHONOPTIMIZE", "1"), ("PYTHONSAFEPATH", "1"), ("PYTHONNOUSERSITE", "1"), ("AUTH_MODE", "oidc"), ("OAUTH_CLIENT_ID", "my-client"),
])
def test_env_values_of_the_same_shapes_that_are_no_credentials_pass(name, value):
    assert job_env.problems({name: value}, {}) == []


@pytest.mark.parametrize(("name", "value"), [
    ("RUN_ID", HEX96), ("RUN_ID", TOKEN), ("TRACE_ID", COMMIT), ("PAD_TOKEN", "<" + SECRET + "-long-inside>"), ("SORT_KEY", SECRET), ("EVAL_PASS", "hunter2hunter2"),
    ("HF_TOKEN", "x" * 12), ("PGPASSWORD", SECRET), ("MYSQLPASSWORD", SECRET), ("AUTHORIZATION", "Bearer " + SECRET), ("REDIS_AUTH", SECRET), ("HFTOKEN", SECRET),
    ("BEARER", SECRET), ("X", SLACK), ("X", DAPI), ("X", "Bearer " + SECRET),
])
def test_missed_credentials_are_refused_unshown(name, value):
    (found,) = [p for p in job_env.problems({name: value}, {}) if "looks like a secret" in p[2]]
    assert value not in found[2] and "secretEnv" in found[2]


@pytest.mark.parametrize("name", ["MONKEY", "BYPASS", "COMPASS", "MAX_TOKENS", "TOKENIZERS_PARALLELISM", "AUTH_URL"])
def test_names_that_only_contain_a_secret_word_are_no_credentials(name):
    assert job_env.problems({name: "Zx9-q7Lw"}, {}) == []


def test_a_credential_shaped_name_is_refused_without_echo(capsys, proj):
    ((which, name, why),) = job_env.problems({TOKEN: "1"}, {})
    assert which == "env" and name == job_env.shown_name(TOKEN) and "the name has the shape of a credential" in why
    capsys.readouterr()
    rc = cli.main(["submit", "--dry-run", "-n", "vision", "--nodes", "1", "--env", f"{TOKEN}=1", "--secret-env", f"{GLPAT}=wandb/key", str(proj), "--", "python", "train.py"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("the name has the shape of a credential") == 2, err
    _unshown(err)


def test_the_local_portal_never_echoes_a_shaped_value(tmp_path, monkeypatch):
    from fastapi.testclient import TestClient

    from trainctl import local
    from trainctl.ui import build_local

    monkeypatch.setenv(local.HOME_ENV, str(tmp_path / "state"))
    app, _ = build_local(8768)
    body = {"namespace": HF, "framework": HF, "training_code": "print(1)", "config": {"num_nodes": 1, "gpu_per_node": 1}, "name": HF, "image": f"{HF}:1 x",
            "command": f"python train.py --x {GLPAT}", "env": {TOKEN: "1"}}
    with TestClient(app, base_url="http://127.0.0.1:8768") as c:
        r = c.post("/api/trainjob/create", json=body)
    assert r.status_code == 422 and REDACTED in r.text, r.text
    _unshown(r.text)
