"""AWS facts: the Regions (pulumi_aws's maintained list), and from ``aws_facts.yaml`` what no
library carries: the partition rules, Availability Zones and GPU offerings per Region.

The table is checked in with its sources (see the file's header). Facts it lacks are not
guessed: :func:`zones` raises ``KeyError`` for a Region it has no zones for, :func:`offers`
answers ``None``; :func:`gaps` names what therefore goes unchecked.
"""

from __future__ import annotations

import functools
import pathlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import yaml

_DATA = pathlib.Path(__file__).with_name("aws_facts.yaml")
PARTITIONS = ("aws", "aws-us-gov", "aws-cn")


@dataclass(frozen=True)
class RegionFacts:
    name: str
    partition: str
    az_id_prefix: str
    zones: tuple[str, ...]
    zones_per_account: int
    zone_ids: tuple[str, ...]
    offered: frozenset[str] | None
    unknown: frozenset[str] = frozenset()  # types newer than the offered list's source: not judged


@dataclass(frozen=True)
class Partition:
    id: str
    region_regex: re.Pattern
    dns_suffix: str


@dataclass(frozen=True)
class _Table:
    source: str
    offered_families: frozenset[str]
    regions: dict[str, RegionFacts]
    partitions: tuple[Partition, ...]


def _region(name: str, raw: dict[str, Any]) -> RegionFacts:
    zones = tuple(sorted(raw["zones"]))
    per_account = int(raw.get("zonesPerAccount", len(zones)))
    prefix = str(raw["azIdPrefix"])
    ids = tuple(raw.get("zoneIds") or (f"{prefix}-az{i}" for i in range(1, per_account + 1)))
    if raw["partition"] not in PARTITIONS:
        raise ValueError(f"aws_facts.yaml: {name}: unknown partition {raw['partition']!r}")
    if not zones or any(not z.startswith(name) or len(z) != len(name) + 1 for z in zones):
        raise ValueError(f"aws_facts.yaml: {name}: zone names must be the Region code and one letter: {zones}")
    if not 0 < per_account <= len(zones) or len(ids) != per_account or any(not i.startswith(prefix + "-az") for i in ids):
        raise ValueError(f"aws_facts.yaml: {name}: {per_account} zones per account needs as many AZ IDs {prefix}-azN, got {ids}")
    offered = raw.get("offered")
    unknown = frozenset((offered or {}).get("unknown") or ())
    if offered and unknown & set(offered["types"]):
        raise ValueError(f"aws_facts.yaml: {name}: a type both offered and unknown: {sorted(unknown & set(offered['types']))}")
    return RegionFacts(
        name=name,
        partition=raw["partition"],
        az_id_prefix=prefix,
        zones=zones,
        zones_per_account=per_account,
        zone_ids=ids,
        offered=frozenset(offered["types"]) if offered else None,
        unknown=unknown,
    )


@functools.cache
def _table() -> _Table:
    raw = yaml.safe_load(_DATA.read_text())
    regions = {name: _region(name, spec) for name, spec in (raw.get("regions") or {}).items()}
    partitions = tuple(Partition(p["id"], re.compile(p["regionRegex"], re.ASCII), p["dnsSuffix"]) for p in raw["partitions"])
    return _Table(source=str(raw["source"]), offered_families=frozenset(raw.get("offeredFamilies") or ()), regions=regions, partitions=partitions)


SOURCE: str = _table().source


def facts(region: str) -> RegionFacts:
    """Everything the table holds on ``region``; ``KeyError`` for a Region it does not list."""
    try:
        return _table().regions[region]
    except KeyError:
        raise KeyError(f"region {region!r} is not in aws_facts.yaml (known: {', '.join(regions())})") from None


@functools.cache
def all_regions() -> tuple[str, ...]:
    """Every AWS Region, from pulumi_aws's maintained enum (``pulumi_aws.Region``; imported here
    only, so nothing else of Pulumi loads with this module)."""
    from pulumi_aws import Region

    return tuple(sorted(r.value for r in Region))


@functools.cache
def instance_types() -> tuple[str, ...]:
    """Every EC2 instance type, from pulumi_aws's maintained enum (``pulumi_aws.ec2.InstanceType``)."""
    from pulumi_aws.ec2 import InstanceType

    return tuple(sorted(t.value for t in InstanceType))


def is_instance_type(name: str) -> bool:
    return name in _instance_type_set()


@functools.cache
def _instance_type_set() -> frozenset[str]:
    return frozenset(instance_types())


def regions() -> list[str]:
    """The Regions the table has zone facts for."""
    return sorted(_table().regions)


def is_region(region: str) -> bool:
    """An AWS Region (any partition)."""
    return region in all_regions()


def is_known_region(region: str) -> bool:
    """A Region the table has zone facts for."""
    return region in _table().regions


def partition(region: str) -> str:
    """The Region's partition: the table's, else the first partition rule its name matches
    (botocore's partitions.json); ``KeyError`` for a name that is no AWS Region."""
    if region in _table().regions:
        return facts(region).partition
    if is_region(region):
        for p in _table().partitions:
            if p.region_regex.fullmatch(region):
                return p.id
    raise KeyError(f"{region!r} is not an AWS Region")


def dns_suffix(partition_name: str) -> str:
    """Service endpoints' domain in a partition (China, the EU sovereign cloud and the isolated
    partitions have their own)."""
    return next((p.dns_suffix for p in _table().partitions if p.id == partition_name), "amazonaws.com")


def gaps(region: str, instance_types: Iterable[str] = ()) -> list[str]:
    """What cannot be checked in ``region`` for want of a fact, one line each (empty when the
    table knows the Region's zones and on-demand GPU offers, and whether it sells each of
    ``instance_types``, the GPU types the config asks for)."""
    f = _table().regions.get(region)
    out = []
    if f is not None and f.offered is not None:
        for t in sorted(set(instance_types)):
            if offers(region, t) is None:
                out.append(f"config/aws_facts.yaml cannot say whether {region} sells {t} on demand (newer than its source, or a family it does not cover): not checked")
    if f is None:
        out.append(f"no Availability Zone facts for {region} in config/aws_facts.yaml: zone names (network.availabilityZones, efa.availabilityZone, trainjobs.<job>.availabilityZone) are not checked")
    if f is None or f.offered is None:
        out.append(f"no on-demand GPU offer list for {region} in config/aws_facts.yaml: whether the region sells the configured GPU types is not checked")
    return out


def zones(region: str) -> list[str]:
    """Every AZ name the Region can show, sorted (us-west-1: the three letters, of which an account sees two)."""
    return list(facts(region).zones)


def account_zones(region: str) -> list[str]:
    """The AZ names one (new) account is shown: :func:`zones`, or its first ``zonesPerAccount``."""
    f = facts(region)
    return list(f.zones[: f.zones_per_account])


def zone_ids(region: str) -> list[str]:
    """AZ IDs in AWS's style (``use1-az1``...), as many as :func:`account_zones`. The pairing with
    names is per account in the older Regions, so only the list (not the pairing) is a fact."""
    return list(facts(region).zone_ids)


def offers(region: str, instance_type: str) -> bool | None:
    """Whether ``region`` sells ``instance_type`` on demand; ``None`` when the table cannot say
    (unknown Region, no offered list for it, or a family the lists do not cover)."""
    table = _table()
    f = table.regions.get(region)
    if f is None or f.offered is None:
        return None
    if instance_type in f.unknown:
        return None
    if instance_type in f.offered:
        return True
    return False if instance_type.split(".")[0] in table.offered_families else None
