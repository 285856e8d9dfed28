"""Which stacks a stack's config references, among this repository's Pulumi projects.

A TrainJob stack (``workloads/``) names its platform stack as ``<organization>/<project>/<stack>``,
the name its ``pulumi.StackReference`` reads. Offline (tools/mock_runtime.py), that stack is
rendered first and the reference answers with its outputs as rendered.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

from config.schema import ConfigError
from config.stack_file import StackFileError, StackFileMissing

REPO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STACK_REF_RE = re.compile(r"^[A-Za-z0-9_.-]+/([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+)$", re.ASCII)


def projects() -> dict[str, str]:
    """Pulumi project name -> its directory, for the projects of this repository (the platform at
    the top, the TrainJob stacks in workloads/)."""
    import yaml

    found = {}
    for d in (REPO_DIR, os.path.join(REPO_DIR, "workloads")):
        path = os.path.join(d, "Pulumi.yaml")
        if os.path.exists(path):
            with open(path) as fh:
                found[yaml.safe_load(fh)["name"]] = d
    return found


def referenced_stacks(config: dict[str, str]) -> dict[str, tuple[str, str]]:
    """The stacks of this repository's projects that a stack's config names as
    ``<organization>/<project>/<stack>`` (a StackReference's name): name -> (project dir, stack)."""
    return {name: (d, stack) for name, (d, stack, _key) in references(config).items()}


def references(config: dict[str, str]) -> dict[str, tuple[str, str, str]]:
    """As :func:`referenced_stacks`, with the config key that names each: name -> (project dir,
    stack, key such as ``training-platform-workloads:platform``)."""
    known = projects()
    out = {}
    for key, value in config.items():
        m = STACK_REF_RE.fullmatch(value.strip()) if isinstance(value, str) else None
        if m and m.group(1) in known:
            out[value.strip()] = (known[m.group(1)], m.group(2), key)
    return out


def rendered_outputs(config: dict[str, str], render: Callable[[str, str], dict]) -> dict[str, dict]:
    """The outputs of every stack the config references, each rendered by ``render(project dir,
    stack)``; a stack without a stack file is refused in one line naming the config key the user
    wrote (the file as its detail) and the stacks the project has."""
    out = {}
    for name, (project_dir, stack, key) in references(config).items():
        try:
            out[name] = render(project_dir, stack)
        except StackFileMissing:
            project = next(p for p, d in projects().items() if d == project_dir)
            have = sorted(f[len("Pulumi."):-len(".yaml")] for f in os.listdir(project_dir) if f.startswith("Pulumi.") and f.endswith(".yaml") and f != "Pulumi.yaml")
            org = name.split("/", 1)[0]
            raise StackFileError(str(ConfigError(
                key, name, f"no stack {stack} of project {project} (no Pulumi.{stack}.yaml beside its Pulumi.yaml); allowed: one of its stacks, such as " + ", ".join(f"{org}/{project}/{h}" for h in have)
            ))) from None
    return out
