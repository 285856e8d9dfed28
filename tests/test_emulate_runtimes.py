"""The runtimes a TrainJob file runs on in the emulator (``trainctl submit --local``) are built from the
stack file with the platform's builders, without Pulumi (the installed trainctl has none): they are the
runtimes the Pulumi program declares for the stack, object for object but for the registry of their images."""

from __future__ import annotations

from typing import Any

import pytest

from k8s.builders.runtimes import GRACE_LABEL, RUNTIME_LABEL
from tests.conftest import objects, run_stack
from tools import emulator_objects
from tools.emulator_objects import EmulationError, stack_runtimes


def imageless(obj: Any) -> Any:
    """The object without its containers' images (the program names the stack's registry copies of
    them, infra/registry.py; the emulator runs none)."""
    if isinstance(obj, dict):
        return {k: imageless(v) for k, v in obj.items() if k != "image"}
    if isinstance(obj, list):
        return [imageless(v) for v in obj]
    return obj


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_the_emulators_runtimes_are_the_ones_the_program_declares(stack):
    rendered = {o["metadata"]["name"]: imageless(o) for o in objects(run_stack(stack)).values() if o["kind"] == "ClusterTrainingRuntime"}
    built = {o["metadata"]["name"]: imageless(o) for o in stack_runtimes(stack)}
    assert built and {n: built[n] == rendered.get(n) for n in built} == dict.fromkeys(built, True)
    # a grace variant the program adds for a job of the stack is built when a TrainJob names it
    for name in set(rendered) - set(built):
        labels = rendered[name]["metadata"]["labels"]
        variants = {o["metadata"]["name"]: imageless(o) for o in emulator_objects._with_grace_class(stack, None, int(labels[GRACE_LABEL])) if o["metadata"]["labels"][RUNTIME_LABEL] == labels[RUNTIME_LABEL]}
        assert variants.get(name) == rendered[name]


def test_a_stack_the_emulator_cannot_read_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(emulator_objects, "PROJECT_DIR", str(tmp_path))
    with pytest.raises(EmulationError, match="Pulumi.nope.yaml"):
        stack_runtimes("nope")
    (tmp_path / "Pulumi.bad.yaml").write_text("config:\n  training-platform:trainer:\n    maxRestarts: many\n")
    with pytest.raises(EmulationError, match=r"^stack bad: .*trainer\.maxRestarts = 'many'") as err:
        stack_runtimes("bad")
    assert "\n" not in str(err.value)
