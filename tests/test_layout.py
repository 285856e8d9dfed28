"""The house by role: folders by what their modules are for, imports in one direction, no import
circles (function-level imports count too), the user's CLI loads no Pulumi, no module too long."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("config", "infra", "k8s", "workloads", "trainctl", "tools", "policy", "bench")
# Roles, most specific first (a module's role is the longest prefix of its name listed here), and
# whom each may import. The layers, bottom up: config (typed settings and facts); pure builders
# (Kubernetes objects as plain dicts, no Pulumi); the AWS side's components; the Kubernetes side's
# components (they register the builders' objects on the AWS side's cluster); the runs. Programs
# that run in pods or in the training image import only their own kind.
MAY_IMPORT = {
    "config": {"config", "versions"},
    "k8s.builders": {"config", "k8s.builders", "versions"},
    "workloads.builders": {"config", "k8s.builders", "workloads.builders", "versions"},
    "k8s.pods": {"k8s.pods"},
    "workloads.programs": {"workloads.programs"},
    "infra": {"config", "k8s.builders", "infra", "versions"},
    "k8s": {"config", "k8s.builders", "infra", "k8s", "versions"},
    "workloads": {"config", "k8s.builders", "workloads.builders", "infra", "k8s", "workloads", "versions"},
    # local mode runs the emulator (tools/emulate.py, which the wheel carries): trainctl reads where it is from its model
    "trainctl": {"config", "k8s.builders", "workloads.builders", "trainctl", "versions", "tools.emulator_objects"},
}
PURE = ("config", "k8s.builders", "workloads.builders", "k8s.pods", "workloads.programs", "trainctl")
"""Roles that never load Pulumi: what the CLI, the pods and the training image import."""

LONGEST = 500


def modules() -> dict[str, pathlib.Path]:
    found = {"versions": ROOT / "versions.py"}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            if "__pycache__" in path.parts:
                continue
            rel = path.relative_to(ROOT).with_suffix("")
            name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
            found[name] = path
    return found


def imports(path: pathlib.Path, name: str, known: set[str]) -> set[str]:
    """The project modules ``path`` imports anywhere in it (top level or inside functions)."""
    out: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(path, name, set(mods)) for name, path in mods.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    sys.setrecursionlimit(10_000)

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    assert cycles(graph()) == []


def test_the_circle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def role_of(name: str) -> str | None:
    """The longest prefix of a module's dotted name that MAY_IMPORT lists."""
    parts = name.split(".")
    return next((".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in MAY_IMPORT), None)


def test_imports_flow_one_way_by_role():
    wrong = []
    for name, deps in graph().items():
        role = role_of(name)
        if role is not None:
            wrong += [f"{name} imports {d}" for d in sorted(deps) if (role_of(d) or d) not in MAY_IMPORT[role]]
    assert wrong == []


def test_the_role_rule_notices_a_wrong_import():
    assert role_of("k8s.builders.tenants") == "k8s.builders" and role_of("k8s.tenants") == "k8s" and role_of("workloads.programs.launch") == "workloads.programs"
    assert "infra" not in MAY_IMPORT["k8s.builders"] and "k8s" not in MAY_IMPORT["infra"] and "workloads" not in MAY_IMPORT["k8s"]


PULUMI = ("pulumi", "pulumi_aws", "pulumi_eks", "pulumi_kubernetes", "pulumi_docker_build")
DATA_ONLY = {"pulumi_aws.Region", "pulumi_aws.ec2.InstanceType"}
"""Enums the settings read as maintained lists of AWS facts (config/aws_facts.py), inside the function
that needs them: no Pulumi runtime comes with them."""


def test_pure_roles_load_no_pulumi():
    """Builders, settings, pod programs and the CLI are plain Python: none imports Pulumi, anywhere in it."""
    wrong = []
    for name, path in modules().items():
        if role_of(name) in PURE:
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level:
                    names = [f"{node.module}.{a.name}" for a in node.names]
                else:
                    continue
                wrong += [f"{name} imports {n}" for n in names if n.split(".")[0] in PULUMI and n not in DATA_ONLY]
    assert wrong == []


def test_every_package_says_its_role_first():
    """Every package's ``__init__.py`` opens with what it holds and, where a rule applies, whom it may import."""
    packages = {name: path for name, path in modules().items() if path.name == "__init__.py"}
    silent = sorted(name for name, path in packages.items() if not ast.get_docstring(ast.parse(path.read_text())))
    rule_unsaid = sorted(name for name in packages if name in MAY_IMPORT and name not in ("config", "trainctl") and "May import" not in (ast.get_docstring(ast.parse(packages[name].read_text())) or ""))
    assert (silent, rule_unsaid) == ([], [])


def test_the_cli_loads_no_pulumi():
    code = "import sys, trainctl.cli; bad = sorted(m for m in sys.modules if m.split('.')[0] in ('pulumi', 'pulumi_aws', 'pulumi_eks', 'pulumi_kubernetes')); print(len(bad)); sys.exit(1 if bad else 0)"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_no_module_is_too_long():
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > LONGEST}
    assert long == {}
