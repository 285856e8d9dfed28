"""Shared test harness: the same mock runtime ``make render`` uses."""

from __future__ import annotations

import copy
import json
import os
import pathlib
import shutil
import sys

import pytest

from config import go_yaml
from tools import validate as schema_validation
from tools.mock_runtime import ProgramRun, run_program
from tools.render import manifests

# the training programs import each other by name (trainlib, t5_layers), as they do in the image
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "workloads" / "programs"))

PROJECT = pathlib.Path(__file__).resolve().parent.parent
_CACHE: dict[str, ProgramRun] = {}


def _pin_build_caches() -> None:
    """The built components and Go's caches where they are now, whatever HOME a test sets later
    (a test that points HOME elsewhere must not make the API server judge build from scratch)."""
    import shutil
    import subprocess

    from tools.cluster import build

    os.environ.setdefault("TRAINING_PLATFORM_CACHE", str(build.cache_dir()))
    if shutil.which("go"):
        found = subprocess.run(["go", "env", "GOPATH", "GOMODCACHE", "GOCACHE"], capture_output=True, text=True, check=False).stdout.split()
        for name, value in zip(("GOPATH", "GOMODCACHE", "GOCACHE"), found, strict=False):
            os.environ.setdefault(name, value)


_pin_build_caches()


@pytest.fixture(scope="session", autouse=True)
def _inductor_cache_of_this_run(tmp_path_factory: pytest.TempPathFactory):
    """torch.compile's on-disk cache (inductor's) is this run's own, for this process and the
    training programs the tests start (they inherit the variable): a compile test judges this
    checkout's code, not what a machine kept from another run."""
    mp = pytest.MonkeyPatch()
    mp.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.mktemp("inductor")))
    yield
    mp.undo()


def stack_file(stack: str) -> dict:
    return go_yaml.load((PROJECT / f"Pulumi.{stack}.yaml").read_text())  # as Pulumi's CLI reads it


def merge(base: dict, overrides: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in overrides.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def dev_config(**sections) -> dict:
    """Pulumi.dev.yaml's config with sections deep-merged (keys without the project prefix)."""
    cfg = stack_file("dev")["config"]
    over = {f"training-platform:{k}" if ":" not in k else k: v for k, v in sections.items()}
    return merge(cfg, over)


def run_config(config: dict, stack: str = "dev") -> ProgramRun:
    key = stack + json.dumps(config, sort_keys=True)
    if key not in _CACHE:
        _CACHE[key] = run_program(str(PROJECT), stack, stack_config={"config": config})
    return _CACHE[key]


def run_stack(stack: str) -> ProgramRun:
    return run_config(stack_file(stack)["config"], stack)


def objects(run: ProgramRun) -> dict[str, dict]:
    return manifests(run)


def find(run: ProgramRun, kind: str, name: str | None = None) -> dict:
    found = [o for o in manifests(run).values() if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


@pytest.fixture
def need_schemas():
    if not schema_validation.schemas_dir().is_dir():
        if os.environ.get("CI"):  # in CI the schema and CEL checks must run, not skip
            pytest.fail(f"CRD schemas not found at {schema_validation.schemas_dir()}: run `python -m tools.fetch_crds DIR` and set CRD_SCHEMAS_DIR")
        pytest.skip(f"CRD schemas not found at {schema_validation.schemas_dir()}: schema validation skipped")


@pytest.fixture
def proj(tmp_path) -> pathlib.Path:
    """A code directory of one training script (test modules with other code define their own)."""
    d = tmp_path / "proj"
    d.mkdir()
    (d / "train.py").write_text("print(1)\n")
    return d


@pytest.fixture
def project(tmp_path) -> pathlib.Path:
    """A copy of the project's entry files; its stack files are the test's."""
    proj = tmp_path / "project"
    proj.mkdir()
    for name in ("Pulumi.yaml", "__main__.py"):
        shutil.copy(PROJECT / name, proj / name)
    return proj
