"""Apply a stack's objects the way Pulumi's Kubernetes provider does (server-side apply, one
dependency wave after another) and read each back. The apply asks for strict field validation, so a
field the served schema does not know (one the API server would prune) is refused with its path;
what is read back must hold every value we set (the server may add, and write quantities in its
canonical form, but not drop or change). Either is a defect in our object."""

from __future__ import annotations

import re
from dataclasses import dataclass

from tools.cluster.client import ApiError, Client

_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")
_FACTORS = {None: 1, "n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
            "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def _quantity(value) -> float | None:
    m = _QUANTITY.match(str(value))
    if not m:
        return None
    return float(m.group(1)) * _FACTORS[m.group(2)]


def _same(applied, live) -> bool:
    if applied == live:
        return True
    if isinstance(applied, bool) or isinstance(live, bool):
        return False
    if isinstance(applied, int | float | str) and isinstance(live, int | float | str):
        a, b = _quantity(applied), _quantity(live)  # the API server writes quantities canonically
        return a is not None and b is not None and abs(a - b) <= 1e-9 * max(1.0, abs(a))
    return False


def differences(applied, live, path: str = "") -> list[str]:
    """Where ``live`` lost or changed what ``applied`` set (fields the server added are fine)."""
    if isinstance(applied, dict):
        if not isinstance(live, dict):
            return [f"{path or '.'}: sent an object, read back {type(live).__name__}"]
        out = []
        for key, value in applied.items():
            sub = f"{path}.{key}" if path else key
            if key not in live:
                if value in ({}, [], None, "", False, 0):
                    continue  # zero values are left out when the object is written (omitempty)
                out.append(f"{sub}: dropped by the API server")
            else:
                out += differences(value, live[key], sub)
        return out
    if isinstance(applied, list):
        if not isinstance(live, list):
            return [f"{path}: sent a list, read back {type(live).__name__}"]
        if len(applied) == len(live):
            return [d for i, (a, b) in enumerate(zip(applied, live, strict=True)) for d in differences(a, b, f"{path}[{i}]")]
        # a list others add to (a webhook's entry): every item we sent must be there
        out = []
        for i, item in enumerate(applied):
            if not any(not differences(item, other) for other in live):
                out.append(f"{path}[{i}]: not found in what was read back")
        return out
    if not _same(applied, live):
        return [f"{path}: sent {applied!r}, read back {live!r}"]
    return []


@dataclass
class Outcome:
    applied: int
    problems: list[str]


def label(obj: dict) -> str:
    meta = obj["metadata"]
    return f"{obj['kind']} {meta.get('namespace') + '/' if meta.get('namespace') else ''}{meta['name']}"


def apply_waves(client: Client, waves: list[list[dict]], *, dry_run: bool = False) -> Outcome:
    applied, problems = 0, []
    for wave in waves:
        for obj in wave:
            try:
                live = client.apply(obj, dry_run=dry_run)
            except ApiError as err:
                problems.append(f"{label(obj)}: refused by the API server (HTTP {err.status}): {err}")
                continue
            applied += 1
            body = {k: v for k, v in obj.items() if k != "status"}
            for diff in differences(body, live):
                problems.append(f"{label(obj)}: {diff}")
    return Outcome(applied, problems)
