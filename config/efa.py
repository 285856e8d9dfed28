"""EFA node layouts: which network interfaces an EFA type gets, how many EFA devices that gives a
node, and how the EFA types are grouped into pools (one per layout). Facts of the catalog and the
EFA settings, used by the config rules, the NodePool/EC2NodeClass builders and the TrainJobs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from config import catalog

EFA_POOL = "gpu-efa"


class EfaTypes(Protocol):
    """What the layouts read of the EFA settings (config.settings.EfaSettings)."""

    @property
    def instance_types(self) -> Sequence[str]: ...


def efa_layouts(efa: EfaTypes) -> dict[str, list[str]]:
    """EFA node classes: one per distinct network-interface layout among the EFA types.
    Name -> instance types. A single layout keeps the plain name ``gpu-efa``."""
    groups: dict[tuple, list[str]] = {}
    for t in efa.instance_types:
        key = tuple(tuple(sorted(nic.items())) for nic in efa_network_interfaces(t))
        groups.setdefault(key, []).append(t)
    if len(groups) == 1:
        return {EFA_POOL: next(iter(groups.values()))}
    named: dict[str, list[str]] = {}
    for types in groups.values():
        # named by network cards, as before; EFA devices are added only if two layouts share a card count
        name = f"{EFA_POOL}-{catalog.lookup(types[0]).network_cards}nc"
        if name in named:
            name = f"{name}-{efa_devices_per_node(types[0])}efa"
        named[name] = types
    return dict(sorted(named.items()))


def efa_pool_of(efa: EfaTypes, instance_type: str) -> str | None:
    """The one EFA pool (NodePool, and Kueue flavor) that launches ``instance_type``; None when no
    EFA pool does. A job names it: Kueue v0.19.2 matches a pod's selector only on the label keys of
    the flavor it tries (``pkg/scheduler/flavorassigner/flavorassigner.go``), so a job selecting just
    the EFA label would fit every EFA flavor, including pools whose types it cannot run."""
    return next((name for name, types in efa_layouts(efa).items() if instance_type in types), None)


def efa_network_interfaces(instance_type: str) -> list[dict]:
    """The EC2NodeClass ``networkInterfaces`` of an EFA node, in AWS's recommended layout
    (EC2 User Guide, "Maximize network bandwidth on Amazon EC2 instances with multiple network
    cards"): the primary ENA ``interface`` at card 0 device 0, an ``efa-only`` interface at card 0
    device 1, and an ``efa-only`` interface at device 0 of every further EFA-capable card.

    Karpenter (karpenter-provider-aws v1.14.1 ``pkg/providers/instancetype/types.go``, ``efas``)
    advertises ``vpc.amazonaws.com/efa`` as the number of ``efa-only`` entries when a node class
    lists interfaces, and refuses a type whose ``MaximumEfaInterfaces`` is smaller
    (``compatibility.go``). So this layout exposes exactly the type's EFA maximum: 32 on p5/p5e,
    16 on p5en, 4 on p4d, 1 on single-card g5/g6. The CRD's CEL rules allow one primary
    interface at card 0 device 0 and at most one EFA per card, which this layout keeps.
    """
    info = catalog.lookup(instance_type)
    if not info.efa:
        raise ValueError(f"{instance_type} does not support EFA")
    if info.efa_interfaces > info.network_cards:
        raise ValueError(f"{instance_type}: {info.efa_interfaces} EFA interfaces on {info.network_cards} cards (at most one per card)")
    nics = [
        {"networkCardIndex": 0, "deviceIndex": 0, "interfaceType": "interface"},
        {"networkCardIndex": 0, "deviceIndex": 1, "interfaceType": "efa-only"},
    ]
    nics += [{"networkCardIndex": card, "deviceIndex": 0, "interfaceType": "efa-only"} for card in range(1, info.efa_interfaces)]
    return nics


def efa_devices_per_node(instance_type: str) -> int:
    """``vpc.amazonaws.com/efa`` a node of this type exposes: the ``efa-only`` interfaces of its
    node class (self-managed Karpenter). Auto Mode's NodeClass lists no interfaces, where
    Karpenter attaches one EFA per card up to the type's maximum: the same number. Jobs derive
    their EFA request from this function, so the request can never exceed what nodes expose."""
    if not catalog.lookup(instance_type).efa:
        return 0
    return sum(1 for nic in efa_network_interfaces(instance_type) if nic["interfaceType"] == "efa-only")
