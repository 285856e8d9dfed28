"""Stack files read as Pulumi's CLI reads them (gopkg.in/yaml.v3, config keys namespaced by the CLI),
and the portal values that open or break it: the render, the settings loader and the editors' schema
agree, one line per problem, nothing written, no secret printed."""

from __future__ import annotations

import copy
import json
import math

import jsonschema
import pytest
import yaml

from config import go_yaml
from config.settings import load_settings
from config.stack_file import StackFileError, config_key, load_stack_file, namespaced_config
from tests.conftest import PROJECT, stack_file
from tests.e2e.portal_helpers import PORTAL
from tools import config_json_schema, render
from tools.mock_config import config_map
from tools.mock_runtime import SECRET_MASK, run_program

CIPHERTEXT = "v1:dGVzdC1jaXBoZXJ0ZXh0LW5vdC1hLXNlY3JldA=="
PLAIN_SECRET = "hunter2-plain-client-secret"


# --- the reader: YAML 1.2's core schema as yaml.v3 resolves it ----------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        # YAML 1.2.2, 10.3.2 "Tag Resolution" (core schema): null, bool, int, float
        ("null", None), ("Null", None), ("NULL", None), ("~", None), ("", None),
        ("true", True), ("True", True), ("TRUE", True), ("false", False), ("False", False), ("FALSE", False),
        ("0", 0), ("-19", -19), ("+12", 12), ("0o14", 12), ("0x3A", 58), ("0xC", 12),
        ("1.", 1.0), ("-1.5", -1.5), ("2.3e4", 23000.0), ("1e3", 1000.0), (".5", 0.5), ("+.5", 0.5),
        # YAML 1.1 booleans and sexagesimals are strings in 1.2 (and in yaml.v3)
        ("yes", "yes"), ("no", "no"), ("on", "on"), ("off", "off"), ("y", "y"), ("n", "n"), ("Yes", "Yes"), ("1:30", "1:30"),
        # yaml.v3's own: underscores dropped, 0b, and YAML 1.1's leading-zero octal kept
        ("1_000", 1000), ("0b101", 5), ("-0b101", -5), ("0777", 511), ("08", 8.0),
        ("1.30", 1.3), ("v1.30", "v1.30"), ("1.2.3", "1.2.3"), ("-x", "-x"), ("1e400", "1e400"),
        ("9223372036854775808", 2**63),  # above int64: a uint64
    ],
)
def test_plain_scalars_resolve_as_yaml_v3_does(text, value):
    loaded = go_yaml.load(f"k: {text}\n")["k"]
    assert loaded == value and type(loaded) is type(value), (text, loaded)


def test_quoted_and_tagged_scalars():
    doc = go_yaml.load('a: "yes"\nb: \'1.30\'\nc: !!float 1\nd: !!str 1.30\ne: !!binary aGk=\nf: !custom 5\ng: |\n  true\n')
    assert doc == {"a": "yes", "b": "1.30", "c": 1.0, "d": "1.30", "e": "hi", "f": "5", "g": "true\n"}
    with pytest.raises(go_yaml.GoYamlRefused, match=r"cannot decode !!str `yes` as a !!bool"):
        go_yaml.load("a: !!bool yes\n")


def test_special_floats_and_timestamps_are_refused():
    assert math.isnan(go_yaml.resolve(".nan")[1]) and go_yaml.resolve("-.inf") == ("float", -math.inf)
    for text in (".inf", ".NaN", "2024-01-02", "2024-01-02T10:00:00Z", "2024-02-29", "2024-01-02 23:59:59"):
        with pytest.raises(go_yaml.GoYamlRefused):
            go_yaml.load(f"k: {text}\n")


@pytest.mark.parametrize("text", ["2024-13-45", "2024-02-30", "2023-02-29", "2024-00-10", "2024-01-02T24:00:00Z", "2024-01-02 10:61:00"])
def test_a_date_out_of_range_is_text_as_in_yaml_v3(text):
    # yaml.v3's parseTimestamp uses Go's time.Parse, which refuses values out of range: not a timestamp
    assert go_yaml.load(f"k: {text}\n") == {"k": text}


def test_a_key_that_is_not_a_string_says_what_pulumi_would_make_of_it(tmp_path):
    with pytest.raises(StackFileError, match='the key 1 is read as a number, which Pulumi would turn into the key "1"; quote it to keep it as written: "1"'):
        load_stack_file(_write(tmp_path, HEAD + "  training-platform:tenants:\n    1:\n      gpuQuota: 1\n"))
    with pytest.raises(StackFileError, match='the key true is read as a boolean, which Pulumi would turn into the key "true"'):
        load_stack_file(_write(tmp_path, HEAD + "  training-platform:tenants:\n    true:\n      gpuQuota: 1\n"))


# --- config keys as the CLI names them ----------------------------------------------------------


def test_config_keys_are_named_as_the_cli_names_them():
    assert config_key("portal") == "training-platform:portal"
    assert config_key("training-platform:portal") == "training-platform:portal"
    assert config_key("training-platform:config:portal") == "training-platform:portal"
    assert config_key("aws:region") == "aws:region" and config_key("a:b:c") is None
    with pytest.raises(StackFileError, match="'portal' and 'training-platform:portal' are the same config key"):
        namespaced_config({"portal": {}, "training-platform:portal": {}})


# --- stack files: one line, file and line, exit 2, nothing written --------------------------------

HEAD = "config:\n  aws:region: us-west-2\n"
# name -> (stack file text after HEAD, the line the loader and the render print)
BAD_FILES = {
    "both-forms": (
        "  portal:\n    enabled: false\n  training-platform:portal:\n    enabled: false\n",
        "Pulumi.case.yaml:5: 'portal' and 'training-platform:portal' are the same config key 'training-platform:portal'; Pulumi would keep either one (Go's random map order): keep one of them",
    ),
    "old-form-too": (
        "  trainer:\n    maxRestarts: 3\n  training-platform:config:trainer:\n    maxRestarts: 2\n",
        "Pulumi.case.yaml:5: 'trainer' and 'training-platform:config:trainer' are the same config key 'training-platform:trainer'; Pulumi would keep either one (Go's random map order): keep one of them",
    ),
    "not-a-key": ("  training-platform:a:b: 1\n", "Pulumi.case.yaml:3: 'training-platform:a:b' is not a config key; Pulumi takes <namespace>:<name> (or a name alone, in the project's namespace)"),
    "number-key": (
        "  training-platform:tenants:\n    1.30:\n      gpuQuota: 1\n",
        'Pulumi.case.yaml:4: the key 1.30 is read as a number, which Pulumi would turn into the key "1.3"; quote it to keep it as written: "1.30"',
    ),
    "recursive-alias": (
        "  training-platform:trainjobs: {ddp: &x {extraArgs: [*x]}}\n",
        "Pulumi.case.yaml:3: anchor 'x' value contains itself",
    ),
    "inf": ("  training-platform:gpuPool:\n    gpuLimit: .inf\n", "Pulumi.case.yaml:4: .inf is not a finite number, which Pulumi cannot hold in config (JSON); quote it for a string"),
}




def _render(project, tmp_path, capsys, text: str) -> tuple[int, str]:
    (project / "Pulumi.case.yaml").write_text(text)
    out = tmp_path / "out"
    rc = render.main(["--stack", "case", "--out", str(out), "--project-dir", str(project)])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    if rc:
        assert not (out / "case").exists()
    return rc, captured.err + captured.out


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_the_loader_and_the_render_print_one_line(project, tmp_path, capsys, case):
    text, message = BAD_FILES[case]
    with pytest.raises(StackFileError) as err:
        load_stack_file(_write(tmp_path, HEAD + text))
    assert str(err.value) == message
    rc, printed = _render(project, tmp_path, capsys, HEAD + text)
    assert (rc, printed) == (2, f"render: case: {message}\n")


def _write(tmp_path, text):
    path = tmp_path / "Pulumi.case.yaml"
    path.write_text(text)
    return path


def _stack(**sections) -> dict:
    """The teams stack (it has tenants, which the portal needs) with sections replaced, as a YAML text's data."""
    stack = copy.deepcopy(stack_file("teams"))
    stack["config"].update({f"training-platform:{k}": v for k, v in sections.items()})
    return stack


def _portal(**changes) -> dict:
    return {**copy.deepcopy(PORTAL), **changes}


# value -> (sections of the teams stack, the key of the one problem, words of its line)
BAD_VALUES = {
    "enabled-yes": ({"portal": _portal(enabled="yes")}, "portal.enabled", "'yes': expected a boolean (true/false)"),
    "cross-account-yes": (
        {"tenants": {"vision": {"gpuQuota": 2, "s3": [{"bucket": "vision-data-example", "access": "read", "crossAccount": "yes"}]}}},
        "tenants.vision.s3[0].crossAccount", "'yes': expected a boolean (true/false)",
    ),
    "version-1.30": ({"cluster": {**stack_file("teams")["config"]["training-platform:cluster"], "version": 1.3}}, "cluster.version", 'write it quoted, one of: "1.32"'),
    "inbound-empty": ({"portal": _portal(inboundCidrs=[])}, "portal.inboundCidrs", "required: at least one CIDR block"),
    "plain-client-secret": ({"portal": _portal(clientSecret=PLAIN_SECRET)}, "portal.clientSecret", "pulumi config set --secret --path 'training-platform:portal.clientSecret'"),
}


def _program_config(stack: dict) -> tuple[dict, set[str]]:
    """The project's config as the program gets it from the CLI (text, JSON decoded), and its secret keys."""
    texts, secret = config_map("training-platform", {}, stack)
    raw = {k.split(":", 1)[1]: json.loads(v) if v[:1] in "{[" else v for k, v in texts.items() if k.startswith("training-platform:")}
    return raw, {k.split(":", 1)[1] for k in secret}


def _yaml_text(stack: dict) -> str:
    return yaml.safe_dump(stack, sort_keys=False)


@pytest.mark.parametrize("case", sorted(BAD_VALUES))
def test_bad_values_are_one_line_in_the_render_and_the_loader(project, tmp_path, capsys, case):
    sections, key, words = BAD_VALUES[case]
    text = _yaml_text(_stack(**sections)).replace("version: 1.3\n", "version: 1.30\n").replace("crossAccount: 'yes'", "crossAccount: yes").replace("enabled: 'yes'", "enabled: yes")
    assert "yes'" not in text
    rc, printed = _render(project, tmp_path, capsys, text)
    lines = [line for line in printed.splitlines() if line.startswith("render: case:")]
    assert rc == 2 and len(lines) == 1 and f"training-platform:{key} = " in lines[0] and words in lines[0], printed
    assert PLAIN_SECRET not in printed
    raw, secret_keys = _program_config(load_stack_file(tmp_path / "project" / "Pulumi.case.yaml"))
    with pytest.raises(ValueError) as err:
        load_settings(raw, stack="case", region="us-west-2", secret_keys=secret_keys)
    assert [e.key for e in err.value.errors] == [key] and words in str(err.value) and PLAIN_SECRET not in str(err.value)


def test_a_team_named_no_is_the_namespace_no():
    text = _yaml_text(_stack()).replace("    vision:\n", "    no:\n", 1)
    stack = go_yaml.load(text)
    assert "no" in stack["config"]["training-platform:tenants"]
    raw, secret_keys = _program_config(stack)
    assert load_settings(raw, stack="teams", region="us-west-2", secret_keys=secret_keys).tenants.namespace_of("no") == "no"


def test_valid_values_of_the_same_shapes_pass():
    sections = {"portal": _portal(enabled=True, inboundCidrs=["203.0.113.0/24"]), "cluster": {**stack_file("teams")["config"]["training-platform:cluster"], "version": "1.34"}}
    run = run_program(str(PROJECT), "teams", stack_config=_stack(**sections))
    ingress = next(r for r in run.registrations if r.type.endswith("Ingress") and "inbound-cidrs" in json.dumps(r.inputs))
    assert ingress.inputs["metadata"]["annotations"]["alb.ingress.kubernetes.io/inbound-cidrs"] == "203.0.113.0/24"


def test_a_secure_client_secret_renders_unknown_and_masked(project, tmp_path, capsys):
    rc, printed = _render(project, tmp_path, capsys, _yaml_text(_stack(portal=_portal(clientSecret={"secure": CIPHERTEXT}))))
    assert rc == 0, printed
    plan = (tmp_path / "out" / "case" / "plan.json").read_text()
    secret = next(r for r in json.loads(plan)["resources"] if r["type"] == "kubernetes:core/v1:Secret" and r["inputs"]["metadata"]["name"] == "portal-oidc")
    assert secret["inputs"]["stringData"] == SECRET_MASK  # a secret inside makes the whole property one
    assert CIPHERTEXT not in plan and CIPHERTEXT not in printed and "[secret]" not in printed
    # the default inboundCidrs (every address) is kept and said
    assert "warning: portal.inboundCidrs is unset" in printed


# --- the editors' schema agrees ------------------------------------------------------------------


def _schema_errors(text: str) -> list[str]:
    schema = json.loads((PROJECT / config_json_schema.DEFAULT_PATH).read_text())
    return sorted({"/".join(map(str, e.absolute_path)) for e in jsonschema.Draft202012Validator(schema).iter_errors(go_yaml.load(text))})


def test_the_schema_agrees():
    assert _schema_errors(HEAD + "  training-platform:portal:\n    enabled: yes\n") == ["config/training-platform:portal/enabled"]
    assert _schema_errors(HEAD + "  training-platform:portal:\n    enabled: true\n") == []
    assert _schema_errors(HEAD + "  training-platform:cluster:\n    version: 1.30\n") == ["config/training-platform:cluster/version"]
    assert _schema_errors(HEAD + '  training-platform:cluster:\n    version: "1.34"\n') == []
    assert _schema_errors(HEAD + "  training-platform:portal:\n    inboundCidrs: []\n") == ["config/training-platform:portal/inboundCidrs"]
    assert _schema_errors(HEAD + "  portal:\n    enabled: true\n") == []
    assert _schema_errors(HEAD + "  portal: {}\n  training-platform:portal: {}\n") == ["config"]
    assert _schema_errors(HEAD + "  training-platform:tenants:\n    no:\n      gpuQuota: 1\n") == []


# --- a section without a value: what Pulumi passes, and what the program makes of it ---------------


@pytest.mark.parametrize("empty", ["", " ~", " null"])
def test_a_section_without_a_value_is_the_empty_section_offline_as_in_pulumi(project, tmp_path, capsys, empty):
    text = HEAD + f"  training-platform:portal:{empty}\n"
    # Pulumi hands a key without a value to the program as the empty text (not "null")
    texts, _ = config_map("training-platform", {"config": {"portal": {"default": {}}}}, load_stack_file(_write(tmp_path, text)))
    assert texts["training-platform:portal"] == ""
    rc, printed = _render(project, tmp_path, capsys, text)
    assert rc == 0, printed


def test_an_empty_text_section_is_the_unset_section():
    assert load_settings({"portal": ""}, stack="dev", region="us-west-2").portal == load_settings({}, stack="dev", region="us-west-2").portal
    assert load_settings({"portal": None, "trainer": ""}, stack="dev", region="us-west-2").trainer == load_settings({}, stack="dev", region="us-west-2").trainer


def test_the_schema_takes_secure_values_and_the_old_key_form_as_pulumi_does():
    secure = f"  training-platform:portal:\n    clientSecret:\n      secure: {CIPHERTEXT}\n"
    assert _schema_errors(HEAD + secure) == []  # the form the plain-secret refusal tells users to create
    assert _schema_errors(HEAD + "  training-platform:cluster:\n    name:\n      secure: AAAB\n") == []  # any string Pulumi may hold encrypted
    assert _schema_errors(HEAD + "  training-platform:portal:\n    clientSecret:\n      secure: 5\n") == ["config/training-platform:portal/clientSecret"]
    assert _schema_errors(HEAD + "  training-platform:portal:\n    enabled:\n      secure: AAAB\n") == ["config/training-platform:portal/enabled"]  # a boolean stays one
    assert config_key("training-platform:config:portal") == "training-platform:portal"
    assert _schema_errors(HEAD + "  training-platform:config:portal:\n    enabled: true\n") == []
    assert _schema_errors(HEAD + "  training-platform:config:portal:\n    enabled: yes\n") == ["config/training-platform:config:portal/enabled"]
    assert _schema_errors(HEAD + "  training-platform:config:portal: {}\n  portal: {}\n") == ["config"]
    assert _schema_errors(HEAD + "  training-platform:config:portal: {}\n  training-platform:portal: {}\n") == ["config"]


def test_a_trainjob_stacks_run_without_a_value_is_its_empty_section():
    from config.run_config import load_run
    from workloads.builders.trainjobs import WORKLOADS

    names = {k: w.name for k, w in WORKLOADS.items()}
    unset = load_run({"platform": "organization/training-platform/dev", "ddp": {}}, stack="nightly", base_names=names)
    for empty in ("", None):
        assert load_run({"platform": "organization/training-platform/dev", "ddp": empty}, stack="nightly", base_names=names) == unset
