"""The house by role: folders by what their modules are for, imports in one direction, no import
circles (function-level imports count too), the user's CLI loads no Pulumi, no module too long."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("config", "manifests", "components", "incluster", "trainctl", "tools", "policy", "bench", "workloads")
# which role may import which: config is the base; builders make plain objects; components are Pulumi
MAY_IMPORT = {
    "config": {"config", "versions"},
    "manifests": {"config", "manifests", "versions"},
    "incluster": {"incluster"},
    "trainctl": {"config", "manifests", "trainctl", "versions"},
    "components": {"config", "manifests", "components", "versions"},
}
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


def test_imports_flow_one_way_by_role():
    wrong = []
    for name, deps in graph().items():
        role = name.split(".")[0]
        if role in MAY_IMPORT:
            wrong += [f"{name} imports {d}" for d in sorted(deps) if d.split(".")[0] not in MAY_IMPORT[role]]
    assert wrong == []


def test_the_cli_loads_no_pulumi():
    code = "import sys, trainctl.cli; bad = sorted(m for m in sys.modules if m.split('.')[0] in ('pulumi', 'pulumi_aws', 'pulumi_eks', 'pulumi_kubernetes')); print(len(bad)); sys.exit(1 if bad else 0)"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_no_module_is_too_long():
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > LONGEST}
    assert long == {}
