"""Stack files that are not what they should be: one line naming file and line, exit 2, nothing rendered."""

from __future__ import annotations

import pytest

from config.stack_file import StackFileError, load_stack_file
from tests.conftest import PROJECT
from tools import render

GOOD = """\
# a small stack
config:
  aws:region: us-west-2
  aws:profile: training
  pulumi:tags:
    team: ml
  kubernetes:context: training-dev
  network:
    azCount: 2
  training-platform:trainer:
    version: v2.3.0
    maxRestarts: 3
"""

# name -> (bad file text, the exact message, a corrected file)
CASES = {
    "not-yaml": (
        GOOD.replace("    maxRestarts: 3\n", "    maxRestarts: [3\n  training-platform:x: 1\n"),
        "Pulumi.case.yaml:13: not valid YAML: expected ',' or ']', but got ':' (while parsing a flow sequence)",
        GOOD,
    ),
    "tab": (
        GOOD.replace("  aws:profile", "\taws:profile"),
        "Pulumi.case.yaml:4: not valid YAML: found character '\\t' that cannot start any token (while scanning for the next token)",
        GOOD,
    ),
    "top-not-mapping": (
        "- config\n- aws:region\n",
        "Pulumi.case.yaml:1: the top level must be a mapping (config:, ...), not a list",
        "config: {}\n",
    ),
    "config-not-mapping": (
        "# stack\n\nconfig:\n  - aws:region: us-west-2\n",
        "Pulumi.case.yaml:4: 'config' must be a mapping of keys to values, not a list",
        "# stack\n\nconfig:\n  aws:region: us-west-2\n",
    ),
    "duplicate-top": (
        GOOD + "  training-platform:trainer:\n    version: v2.1.0\n",
        "Pulumi.case.yaml:13: duplicate key 'training-platform:trainer'",
        GOOD,
    ),
    "duplicate-nested": (
        GOOD + "    version: v2.1.0\n",
        "Pulumi.case.yaml:13: duplicate key 'version'",
        GOOD,
    ),
    "duplicate-config": (
        GOOD + "config: {}\n",
        "Pulumi.case.yaml:13: duplicate key 'config'",
        GOOD,
    ),
    "namespace-typo": (
        GOOD.replace("  training-platform:trainer", "  training-platfrom:trainer"),
        "Pulumi.case.yaml:10: unknown config namespace 'training-platfrom' in 'training-platfrom:trainer'; did you mean 'training-platform'?",
        GOOD,
    ),
    "namespace-underscore": (
        GOOD.replace("  network:", "  training_platform:network:"),
        "Pulumi.case.yaml:8: unknown config namespace 'training_platform' in 'training_platform:network'; did you mean 'training-platform'?",
        GOOD,
    ),
}




@pytest.mark.parametrize("case", sorted(CASES))
def test_loader_names_file_and_line(tmp_path, case):
    bad, message, good = CASES[case]
    path = tmp_path / "Pulumi.case.yaml"
    path.write_text(bad)
    with pytest.raises(StackFileError) as err:
        load_stack_file(path)
    assert str(err.value) == message
    assert isinstance(err.value, ValueError) and "\n" not in str(err.value)
    path.write_text(good)
    assert isinstance(load_stack_file(path), dict)


def test_other_namespaces_and_bare_keys_pass(tmp_path):
    path = tmp_path / "Pulumi.good.yaml"
    path.write_text(GOOD)
    config = load_stack_file(path)["config"]
    assert config["aws:profile"] == "training" and config["pulumi:tags"] == {"team": "ml"}
    assert config["kubernetes:context"] == "training-dev" and config["network"] == {"azCount": 2}
    path.write_text("config:\n  awss:region: us-west-2\n  trainer:platform: x\n")  # not close to the project's name
    assert set(load_stack_file(path)["config"]) == {"awss:region", "trainer:platform"}


def test_empty_file_is_an_empty_stack(tmp_path):
    path = tmp_path / "Pulumi.empty.yaml"
    path.write_text("# nothing yet\n")
    assert load_stack_file(path) == {}


def test_the_real_stack_files_load():
    for path in sorted(PROJECT.glob("Pulumi.*.yaml")):
        assert "config" in load_stack_file(path), path.name


@pytest.mark.parametrize("case", sorted(CASES))
def test_render_prints_one_line_and_leaves_nothing(project, tmp_path, capsys, case):
    bad, message, _ = CASES[case]
    (project / "Pulumi.case.yaml").write_text(bad)
    out = tmp_path / "out"
    stale = out / "case" / "manifests"
    stale.mkdir(parents=True)
    (out / "case" / "plan.json").write_text("{}")  # an earlier render's output must not survive
    rc = render.main(["--stack", "case", "--out", str(out), "--project-dir", str(project)])
    captured = capsys.readouterr()
    assert rc == 2
    assert captured.err == f"render: case: {message}\n"
    assert "Traceback" not in captured.out + captured.err
    assert not (out / "case").exists()


def test_render_missing_stack_file_is_one_line(project, tmp_path, capsys):
    out = tmp_path / "out"
    rc = render.main(["--stack", "nosuch", "--out", str(out), "--project-dir", str(project)])
    captured = capsys.readouterr()
    assert rc == 2
    assert captured.err == "render: nosuch: Pulumi.nosuch.yaml: no such stack file\n"
    assert not (out / "nosuch").exists()


def test_render_good_file_beside_the_bad_ones(project, tmp_path, capsys):
    good = GOOD + "  training-platform:network:\n    azCount: 2\n"
    good = good.replace("  network:\n    azCount: 2\n", "")
    (project / "Pulumi.good.yaml").write_text(good)
    (project / "Pulumi.bad.yaml").write_text(CASES["duplicate-top"][0])
    out = tmp_path / "out"
    assert render.main(["--stack", "good", "--out", str(out), "--project-dir", str(project)]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("render: stack=good ")
    assert (out / "good" / "plan.json").is_file()
    assert render.main(["--stack", "bad", "--out", str(out), "--project-dir", str(project)]) == 2
    assert (out / "good" / "plan.json").is_file() and not (out / "bad").exists()


def test_render_names_every_invalid_key_of_a_config_at_once(project, tmp_path, capsys):
    """Four independent mistakes: four lines, exit 2, no plan, no traceback."""
    (project / "Pulumi.four.yaml").write_text(
        "config:\n  aws:region: us-west-2\n"
        "  training-platform:nodeGroups:\n    arm: {instanceType: c6i.large}\n"
        "  training-platform:gpuPool:\n    capacityTypes: [spot, ondemand]\n"
        "  training-platform:trainer:\n    maxRestarts: -1\n"
        "  training-platform:trainjobs:\n    ddp: {numNode: 2}\n"
    )
    out = tmp_path / "out"
    assert render.main(["--stack", "four", "--out", str(out), "--project-dir", str(project)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    keys = ["nodeGroups.arm.instanceType", "gpuPool.capacityTypes[1]", "trainer.maxRestarts", "trainjobs.ddp.numNode"]
    assert len(lines) == 4 and all(f"training-platform:{k} = " in line for k, line in zip(keys, lines, strict=True))
    assert all(line.startswith("render: four: invalid config ") for line in lines)
    assert "Traceback" not in captured.out + captured.err and not (out / "four").exists()


def test_program_refuses_a_misspelt_namespace_from_any_config_source():
    """`pulumi up` parses the stack file itself: the program must still not ignore the key."""
    from tests.conftest import dev_config
    from tools.mock_runtime import ProgramError, run_program

    config = dev_config()
    config["training-platfrom:trainer"] = {"maxRestarts": 5}
    with pytest.raises(ProgramError) as err:
        run_program(str(PROJECT), "dev", stack_config={"config": config})
    assert str(err.value) == "invalid config training-platfrom:trainer = {'maxRestarts': 5}: unknown config namespace 'training-platfrom'; did you mean 'training-platform'?"
    assert not [r for r in err.value.registrations if r.custom]
