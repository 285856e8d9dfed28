"""The node agents table (``node_agents.yaml``): every DaemonSet-based add-on and chart the platform
installs or relies on, with the scheduling facts of each at the version we deploy and where each
fact was read.

The table is checked in with its sources. Loading it validates its shape (unknown keys are
errors, every agent and every architecture or gap fact names its source, every ``version.pin``
names a constant of ``versions.py`` whose version is the one the read tag ships). What the facts
mean for a stack is ``k8s/builders/node_agents.py``'s business.
"""

from __future__ import annotations

import functools
import pathlib
import re
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from pydantic.alias_generators import to_camel

import versions

_DATA = pathlib.Path(__file__).with_name("node_agents.yaml")

# Node kind tags (the table's header says what each means)
BASE_TAGS = ("system", "gpu", "efa-gpu", "auto-gpu")
FENCED = "fenced-"
Tag = Literal["system", "gpu", "efa-gpu", "auto-gpu", "fenced-system", "fenced-gpu", "fenced-efa-gpu", "fenced-auto-gpu"]
Arch = Literal["amd64", "arm64"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True)


class InstalledAs(_Strict):
    """How a plan installs the agent (exactly one)."""

    addon: str | None = None
    chart: str | None = None
    cluster_component: Literal["vpc-cni", "kube-proxy"] | None = None

    @model_validator(mode="after")
    def _one(self) -> InstalledAs:
        if sum(v is not None for v in (self.addon, self.chart, self.cluster_component)) != 1:
            raise ValueError("exactly one of addon, chart, clusterComponent")
        return self


class Version(_Strict):
    pin: str | None
    upstream: str
    ships: str | None


class TolerationRule(_Strict):
    """The pod's tolerations: ``[{operator: Exists}]`` when the value at ``all_when`` is true; else
    the first of ``values`` that is set, then what the template adds itself."""

    values: tuple[str, ...] = ()
    template: tuple[dict[str, Any], ...] = ()
    all_when: str | None = None


class SelectorRule(_Strict):
    """The pod's nodeSelector: the template's entries, then the values' at ``values``."""

    values: str | None = None
    template: dict[str, str] = {}


class AffinityRule(_Strict):
    """The pod's affinity: the values' at ``values`` (``when_no_node_affinity`` if it has no
    nodeAffinity); or (``instance_labels``) one term per key of that values entry, ``In`` its
    values, each with the template's expressions added."""

    values: str | None = None
    when_no_node_affinity: dict[str, Any] | None = None
    instance_labels: str | None = None
    template: tuple[dict[str, Any], ...] = ()

    @model_validator(mode="after")
    def _one(self) -> AffinityRule:
        if (self.values is None) == (self.instance_labels is None):
            raise ValueError("exactly one of values, instanceLabels")
        return self


class Architectures(_Strict):
    values: tuple[Arch, ...]
    source: str


class Gap(_Strict):
    """A known miss the platform cannot configure away: findings of this cause are reported, not failed."""

    cause: Literal["instance-type"]
    why: str
    source: str


class DaemonSet(_Strict):
    must_run_on: tuple[Tag, ...]
    must_not_run_on: tuple[Tag, ...] = ()
    why: str
    enabled_by: tuple[str, ...] = ()
    tolerations: TolerationRule | None = None
    node_selector: SelectorRule | None = None
    affinity: AffinityRule | None = None
    architectures: Architectures | None = None
    gap: Gap | None = None
    unverified: str | None = None

    @model_validator(mode="after")
    def _facts(self) -> DaemonSet:
        rules = (self.tolerations, self.node_selector, self.affinity)
        if self.unverified is None and any(r is None for r in rules):
            raise ValueError("tolerations, nodeSelector and affinity are required unless the facts are unverified (with the reason)")
        if self.unverified is not None and any(r is not None for r in rules):
            raise ValueError("an unverified DaemonSet states no scheduling facts")
        return self


class Agent(_Strict):
    installed_as: InstalledAs
    version: Version
    source: str
    configurable: str
    required: str | None = None
    defaults: dict[str, Any]
    daemon_sets: dict[str, DaemonSet]


class _Table(_Strict):
    version: Literal[1]
    agents: dict[str, Agent]


def _release(version: str) -> str:
    """``v1.7.0-eksbuild.1`` -> ``1.7.0``: the upstream release an EKS add-on build or a chart pin names."""
    return re.sub(r"-eksbuild\.\d+$", "", version).removeprefix("v")


def _problems(table: _Table) -> list[str]:
    out = []
    for name, agent in table.agents.items():
        pin = agent.version.pin
        if pin is not None:
            value = getattr(versions, pin, None)
            if not isinstance(value, str):
                out.append(f"agents.{name}.version.pin: {pin!r} is not a version constant of versions.py")
            elif agent.version.ships is not None and _release(value) != agent.version.ships:
                out.append(f"agents.{name}.version: versions.{pin} is {value}, the facts were read at {agent.version.upstream} ({agent.version.ships}): read them again")
        for ds_name, ds in agent.daemon_sets.items():
            if ds.gap and not names_a_source(ds.gap.source):
                out.append(f"agents.{name}.daemonSets.{ds_name}.gap.source: names no repository, tag or guide")
            if ds.architectures and not names_a_source(ds.architectures.source):
                out.append(f"agents.{name}.daemonSets.{ds_name}.architectures.source: names no repository, tag or guide")
        if not names_a_source(agent.source):
            out.append(f"agents.{name}.source: names no repository, tag or guide")
    return out


_REPO = re.compile(r"\b[\w.-]+/[\w.-]+\b")  # owner/name
_AT = re.compile(r"\bv?\d+\.\d+(\.\d+)?\b|\b[0-9a-f]{7,40}\b|-\d+\.\d+\.\d+\b")  # a tag, a version or a commit
_GUIDE = re.compile(r"\b(User Guide|Developer Guide|API Reference)\b")


def names_a_source(text: str) -> bool:
    """Whether a source names where to read the fact again: a repository with a tag, version or
    commit, or an AWS guide."""
    return bool(_REPO.search(text) and _AT.search(text)) or bool(_GUIDE.search(text))


def parse(raw: Any) -> dict[str, Agent]:
    """The agents of a raw table; ``ValueError`` with one line per problem."""
    try:
        table = _Table.model_validate(raw)
    except ValidationError as err:
        lines = [f"node_agents.yaml: {'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors()]
        raise ValueError("\n".join(lines)) from None
    problems = _problems(table)
    if problems:
        raise ValueError("\n".join(f"node_agents.yaml: {p}" for p in problems))
    return dict(table.agents)


@functools.cache
def agents() -> dict[str, Agent]:
    return parse(yaml.safe_load(_DATA.read_text()))


def raw() -> dict[str, Any]:
    """The table as the file has it (for tests that break it on purpose)."""
    return yaml.safe_load(_DATA.read_text())
