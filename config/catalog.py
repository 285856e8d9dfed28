"""GPU instance catalog: typed lookup over ``gpu_instances.yaml``.

Every value derived from an instance type (GPUs per node, EFA interfaces per pod, the
instance family and category Karpenter selects on, the all-reduce check's default pass mark)
is computed here, once.
"""

from __future__ import annotations

import functools
import pathlib
import re
from dataclasses import dataclass

import yaml

_DATA = pathlib.Path(__file__).with_name("gpu_instances.yaml")
_FAMILY_RE = re.compile(r"^([a-z]+?)(\d+)")


@dataclass(frozen=True)
class GpuInstance:
    name: str
    family: str
    category: str
    gpus: int
    gpu_model: str
    gpu_memory_gib: int
    vcpu: int
    memory_gib: int
    efa: bool
    network_cards: int
    efa_interfaces_per_card: int
    min_allreduce_busbw_gbps: float | None = None  # the all-reduce check's default pass mark (GB/s), where published

    @property
    def efa_interfaces(self) -> int:
        """EFA devices a pod that owns the whole node can request."""
        return self.network_cards * self.efa_interfaces_per_card if self.efa else 0


def family_of(instance_type: str) -> str:
    return instance_type.split(".", 1)[0]


def category_of(instance_type: str) -> str:
    """Karpenter's instance-category: the letters before the generation digit."""
    m = _FAMILY_RE.match(family_of(instance_type))
    return m.group(1) if m else family_of(instance_type)


@functools.lru_cache(maxsize=1)
def catalog() -> dict[str, GpuInstance]:
    raw = yaml.safe_load(_DATA.read_text())
    families = raw["families"]
    out: dict[str, GpuInstance] = {}
    for name, spec in raw["types"].items():
        fam = families[family_of(name)]
        out[name] = GpuInstance(
            name=name,
            family=family_of(name),
            category=category_of(name),
            gpus=spec["gpus"],
            gpu_model=fam["gpuModel"],
            gpu_memory_gib=fam["gpuMemoryGiB"],
            vcpu=spec["vcpu"],
            memory_gib=spec["memoryGiB"],
            efa=spec["efa"],
            network_cards=spec["networkCards"],
            efa_interfaces_per_card=spec["efaInterfacesPerCard"],
            min_allreduce_busbw_gbps=spec.get("minAllReduceBusBwGBps"),
        )
    return out


def families() -> list[str]:
    return sorted({i.family for i in catalog().values()})


def categories() -> list[str]:
    return sorted({i.category for i in catalog().values()})


def lookup(instance_type: str) -> GpuInstance:
    return catalog()[instance_type]


def types_in_pool(categories_: list[str], families_: list[str], types: list[str]) -> list[GpuInstance]:
    """Catalog types a NodePool with these requirements may launch (empty list = no restriction)."""
    return [
        i
        for i in catalog().values()
        if (not categories_ or i.category in categories_)
        and (not families_ or i.family in families_)
        and (not types or i.name in types)
    ]


def node_pod_request(info: GpuInstance, gpus: int) -> tuple[int, int]:
    """(CPUs, memory GiB) a training pod of ``gpus`` GPUs requests on ``info``: its share of the
    node, leaving room for the kubelet, system reserve and daemonsets (device plugins, CNI)."""
    share = gpus / info.gpus
    return max(1, int((info.vcpu - 2) * share * 0.9)), max(2, int((info.memory_gib - 4) * share * 0.85))

