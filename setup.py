"""The wheel holds one package, ``trainctl``: the platform's modules it runs live under ``trainctl._platform``.

trainctl builds its objects with the platform's own builders and runs jobs locally with its emulator.
In the repository those are top-level packages of the Pulumi program (``config``, ``k8s``,
``workloads``, ``tools``, module ``versions``); installed at the top level of site-packages they would
shadow (and be shadowed by) a user's own ``config.py``. So a wheel build places them under
``trainctl/_platform/`` and rewrites their absolute imports of each other, and trainctl's of them, to
the namespaced names (:func:`rewrite_imports`: the import statements only, found with ``ast``). The
repository's layout and the Pulumi program's imports stay as they are; an editable install
(``make venv``) keeps mapping the checkout's packages as they are.

``k8s`` and ``workloads`` are packages of the Pulumi program as well: their own modules (the
Kubernetes components, the TrainJob stacks) stay in the repository; the wheel takes only their
``__init__`` and their pure subpackages (builders, pods, programs); of ``tools`` (the offline tooling)
only the local emulator (:data:`TOOLS`). The stack file local mode runs on (:data:`STACK_FILES`) is copied from the
repository's at build time. tests/test_packaging.py checks that no module of the wheel imports
Pulumi, and that none imports a top-level package of ours.
"""

from __future__ import annotations

import ast
import os
import re
import shutil

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py

NAMESPACE = "trainctl._platform"
PLATFORM = ("config", "k8s", "workloads", "tools", "versions")  # the repository's top-level packages and module trainctl uses
PROGRAM_PACKAGES = ("k8s", "workloads")
TOOLS = ("__init__", "emulate", "emulator_mounts", "emulator_objects", "emulator_output", "emulator_pods", "fixture_hub")  # the local emulator
STACK_FILES = ("Pulumi.dev.yaml",)  # the stack `trainctl submit --local` runs on (trainctl/local.py STACK)


def _ours(module: str) -> bool:
    return module.split(".")[0] in PLATFORM


def _import_text(alias: ast.alias) -> str:
    """``import`` of one alias, namespaced when it names one of our packages; binds the same name."""
    if not _ours(alias.name):
        return f"import {alias.name}" + (f" as {alias.asname}" if alias.asname else "")
    if alias.asname:
        return f"import {NAMESPACE}.{alias.name} as {alias.asname}"
    head = alias.name.split(".")[0]
    if "." not in alias.name:
        return f"from {NAMESPACE} import {head}"
    # ``import config.settings`` binds ``config`` with its submodule settings loaded
    return f"import {NAMESPACE}.{alias.name}; from {NAMESPACE} import {head}"


def rewrite_imports(source: str) -> str:
    """``source`` with every absolute import of one of our top-level packages (``import x``,
    ``import x.y as z``, ``from x.y import (a, b)``) naming it under :data:`NAMESPACE` instead;
    nothing else changes (relative imports, other packages, strings, comments, line numbers)."""
    data = source.encode()
    starts = [0]
    for line in data.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    edits: list[tuple[int, int, bytes]] = []
    for node in ast.walk(ast.parse(data)):
        if isinstance(node, ast.Import) and any(_ours(a.name) for a in node.names):
            begin = starts[node.lineno - 1] + node.col_offset
            end = starts[node.end_lineno - 1] + node.end_col_offset  # type: ignore[operator]
            edits.append((begin, end, "; ".join(_import_text(a) for a in node.names).encode()))
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module and _ours(node.module):
            begin = starts[node.lineno - 1] + node.col_offset
            m = re.match(rb"from(?:\s|\\\r?\n)+([A-Za-z_][\w.]*)", data[begin:])
            if m is None or m.group(1).decode() != node.module:
                raise ValueError(f"line {node.lineno}: an import of {node.module} not written as `from {node.module} import ...`")
            edits.append((begin + m.start(1), begin + m.end(1), f"{NAMESPACE}.{node.module}".encode()))
    for begin, end, text in sorted(edits, reverse=True):
        data = data[:begin] + text + data[end:]
    return data.decode()


class PlatformBuildPy(build_py):
    """build_py for the wheel: the platform's packages under :data:`NAMESPACE`, imports rewritten."""

    def find_package_modules(self, package, package_dir):
        found = super().find_package_modules(package, package_dir)
        if package in PROGRAM_PACKAGES:
            return [(pkg, module, path) for pkg, module, path in found if module == "__init__"]
        if package == "tools":
            return [(pkg, module, path) for pkg, module, path in found if module in TOOLS]
        return found

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):  # an editable install maps the checkout's packages as they are
            return
        base = os.path.join(self.build_lib, *NAMESPACE.split("."))
        shutil.rmtree(base, ignore_errors=True)
        os.makedirs(base)
        for name in PLATFORM:  # what setuptools built at the top level (pyproject.toml's packages) moves under the namespace
            for built in (os.path.join(self.build_lib, name), os.path.join(self.build_lib, name + ".py")):
                if os.path.exists(built):
                    shutil.move(built, os.path.join(base, os.path.basename(built)))
        for stack_file in STACK_FILES:
            shutil.copyfile(stack_file, os.path.join(base, stack_file))
        with open(os.path.join(base, "__init__.py"), "w") as fh:
            fh.write('"""The training platform\'s modules trainctl runs (the repository\'s config, k8s, workloads, tools and versions), placed here by setup.py."""\n')
        for root, _dirs, files in os.walk(os.path.join(self.build_lib, "trainctl")):
            for f in files:
                if f.endswith(".py"):
                    path = os.path.join(root, f)
                    with open(path, encoding="utf-8") as fh:
                        source = fh.read()
                    rewritten = rewrite_imports(source)
                    if rewritten != source:
                        with open(path, "w", encoding="utf-8") as fh:
                            fh.write(rewritten)


class PlatformBdistWheel(bdist_wheel):
    """The wheel's ``top_level.txt`` names what it installs at the top level: trainctl alone
    (egg_info lists pyproject.toml's packages, which the wheel holds under the namespace)."""

    def egg2dist(self, egginfo_path, distinfo_path):
        super().egg2dist(egginfo_path, distinfo_path)
        top_level = os.path.join(distinfo_path, "top_level.txt")
        if os.path.exists(top_level):
            with open(top_level, "w") as fh:
                fh.write(NAMESPACE.split(".")[0] + "\n")


setup(cmdclass={"build_py": PlatformBuildPy, "bdist_wheel": PlatformBdistWheel})
