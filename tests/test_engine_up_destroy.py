"""The real Pulumi engine (make engine-build) with our language host: stack init, up, a no-change preview,
a missing config key, destroy, on a small Python project with a local file backend.

Skipped when the engine is not built, unless TRAINING_PLATFORM_ENGINE_EXPECTED is set (CI): then that
is a failure saying to run make engine-build.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tools.engine import build as engine

pytestmark = pytest.mark.slow

PROGRAM = """
import pulumi


class Box(pulumi.ComponentResource):
    def __init__(self, name, size, opts=None):
        super().__init__("tiny:index:Box", name, None, opts)
        self.size = pulumi.Output.from_input(size)
        self.register_outputs({"size": self.size})


config = pulumi.Config()
box = Box("box", config.require_int("size"))
pulumi.export("doubled", box.size.apply(lambda s: s * 2))
"""


@pytest.fixture(scope="module")
def pulumi_cli():
    missing = engine.missing()
    if missing:
        reason = f"the Pulumi engine is not built ({', '.join(missing)}): run make engine-build"
        if os.environ.get("TRAINING_PLATFORM_ENGINE_EXPECTED"):
            pytest.fail(reason)
        pytest.skip(reason)
    return str(engine.pulumi())


@pytest.fixture
def project(tmp_path, pulumi_cli):
    """A project in tmp_path, its state in a file backend there, the engine's home there too."""
    program = tmp_path / "tiny"
    program.mkdir()
    (program / "Pulumi.yaml").write_text(f"name: tiny\nruntime:\n  name: python\n  options:\n    toolchain: pip\n    virtualenv: {sys.prefix}\n")
    (program / "__main__.py").write_text(PROGRAM)
    (tmp_path / "state").mkdir()
    env = engine.env(home=tmp_path / "pulumi-home")
    env.update({"PULUMI_BACKEND_URL": f"file://{tmp_path / 'state'}", "PULUMI_CONFIG_PASSPHRASE": "engine-test", "NO_COLOR": "1"})

    def run(*args: str, ok: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run([pulumi_cli, *args, "--non-interactive"], cwd=program, env=env, capture_output=True, text=True, timeout=600, check=False)
        if ok:
            assert proc.returncode == 0, f"pulumi {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
        return proc

    return run


def test_up_preview_destroy_of_a_component_with_config(project):
    project("stack", "init", "dev")
    project("config", "set", "size", "3")
    up = project("up", "--yes", "--skip-preview")
    assert "2 created" in up.stdout, up.stdout
    assert project("stack", "output", "doubled").stdout.strip() == "6"
    project("preview", "--expect-no-changes")
    project("config", "set", "size", "4")
    changed = project("preview")  # a component's outputs are no resource change: only the stack output moves
    assert "doubled: 6 => 8" in changed.stdout, changed.stdout
    project("config", "set", "size", "3")
    destroy = project("destroy", "--yes", "--skip-preview")
    assert "2 deleted" in destroy.stdout, destroy.stdout
    assert project("stack", "--show-urns").returncode == 0


def test_a_missing_config_key_is_one_error_line_without_traceback(project):
    """As with Pulumi's own host (the same exec script, the same exit code 1 for a RunError): the key's
    error once in the diagnostics, then the engine's line for the program's exit, no traceback."""
    project("stack", "init", "dev")
    preview = project("preview", ok=False)
    assert preview.returncode != 0
    diagnostics = preview.stdout.split("Diagnostics:", 1)[1].split("Resources:", 1)[0]
    errors = [line.strip() for line in diagnostics.splitlines() if line.strip().startswith("error:")]
    assert errors == ["error: Missing required configuration variable 'tiny:size'", "error: an unhandled error occurred: program exited with non-zero exit code: 1"], preview.stdout
    assert "Traceback" not in preview.stdout + preview.stderr
