"""The team-facing commands of docs/debugging.md and docs/runbook.md are ones the team Role
(k8s/builders/tenants.py TEAM_RULES) allows: each kubectl command mapped to the API requests it
makes (kubectl get/describe: get and list; logs: pods get/list and pods/log get; exec: pods get and
pods/exec create and get; get --raw: a GET of that path) and judged by RBAC's rule matching."""

from __future__ import annotations

import pathlib
import re
import shlex

import pytest

from k8s.builders.tenants import TEAM_RULES

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"
# kubectl's resource names -> (API group, resource)
RESOURCES = {"pods": ("", "pods"), "events": ("", "events"), "jobs": ("batch", "jobs"), "resourcequotas": ("", "resourcequotas"), "trainjobs": ("trainer.kubeflow.org", "trainjobs"),
             "jobsets": ("jobset.x-k8s.io", "jobsets"), "workloads": ("kueue.x-k8s.io", "workloads"), "localqueues": ("kueue.x-k8s.io", "localqueues")}


def allowed(group: str, resource: str, verb: str) -> bool:
    return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in TEAM_RULES)


def requests(args: list[str]) -> list[tuple[str, str, str]]:
    """(group, resource, verb) of each API request a kubectl command makes."""
    verb = args[1]
    if verb == "logs":
        return [("", "pods", "list"), ("", "pods", "get"), ("", "pods/log", "get")]
    if verb == "exec":
        return [("", "pods", "get"), ("", "pods/exec", "create"), ("", "pods/exec", "get")]
    if verb == "get" and args[2] == "--raw":
        m = re.fullmatch(r"/apis/([^/]+)/[^/]+/namespaces/[^/]+/([^/]+)/[^/]+/([^/]+)", args[3])
        assert m, args[3]
        return [(m.group(1), f"{m.group(2)}/{m.group(3)}", "get")]
    kinds = args[2].split("/")[0].split(",")
    verbs = {"get": ["get", "list"], "describe": ["get", "list"], "delete": ["delete"], "patch": ["patch"]}[verb]
    return [(*RESOURCES[k], v) for k in kinds for v in verbs]


def commands(text: str) -> list[list[str]]:
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.splitlines():
            line = line.split(" | ")[0].split(";")[0].strip()
            line = re.sub(r"\$\(.*?\)", "X", line)  # a command substitution is its own command (checked where it stands alone)
            if line.startswith("kubectl "):
                out.append(shlex.split(line))
    return out


def test_every_kubectl_command_of_the_team_guide_is_allowed_by_the_team_role():
    found = commands((DOCS / "debugging.md").read_text())
    assert len(found) >= 10 and {a[1] for a in found} >= {"get", "describe", "logs", "exec"}
    for args in found:
        for group, resource, verb in requests(args):
            assert allowed(group, resource, verb), (" ".join(args), group, resource, verb)


def test_the_runbooks_namespace_reads_are_allowed_to_a_team_and_its_patches_are_not():
    text = (DOCS / "runbook.md").read_text()
    runaway = text.split("## Runaway jobs", 1)[1].split("\n## ", 1)[0]
    team = [a for a in commands(text) if "<ns>" in a]
    assert len(team) >= 8
    for args in team:
        patching = args[1] == "patch"
        for group, resource, verb in requests(args):
            if patching:  # the platform team's: the runbook says so
                assert not allowed(group, resource, verb) and "platform team" in runaway
            else:
                assert allowed(group, resource, verb), (" ".join(args), group, resource, verb)


@pytest.mark.parametrize("verb", ["create", "update", "patch", "delete"])
def test_the_debugging_reads_are_read_only(verb):
    for group, resource in (("jobset.x-k8s.io", "jobsets"), ("batch", "jobs"), ("kueue.x-k8s.io", "workloads"), ("", "resourcequotas"), ("", "pods")):
        assert not allowed(group, resource, verb), (resource, verb)
