"""Apply a stack's objects the way Pulumi's Kubernetes provider does (server-side apply, one
dependency wave after another) and read each back. The apply asks for strict field validation, so a
field the served schema does not know (one the API server would prune) is refused with its path;
what is read back must hold every value we set (the server may add, and write quantities in its
canonical form, but not drop or change). Either is a defect in our object."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from fractions import Fraction

from tools.cluster.client import ApiError, Client

# Kubernetes quantities (k8s.io/apimachinery resource.Quantity): a signed decimal with a binary,
# decimal SI or exponent suffix
_QUANTITY_RE = re.compile(r"([+-]?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?")
_SUFFIX = {"": Fraction(1), "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), **{s: Fraction(10 ** (3 * (i + 1))) for i, s in enumerate("kMGTPE")},
           **{s + "i": Fraction(2 ** (10 * (i + 1))) for i, s in enumerate("KMGTPE")}}  # fmt: skip


def _quantity(value) -> Fraction | None:
    """A Kubernetes quantity's exact value, else None."""
    m = _QUANTITY_RE.fullmatch(str(value))
    if not m:
        return None
    suffix = m.group(3) or ""
    scale = Fraction(10) ** int(suffix[1:]) if suffix[:1] in ("e", "E") else _SUFFIX[suffix]
    number = Fraction(m.group(2)) * scale
    return -number if m.group(1) == "-" else number


def _same(applied, live) -> bool:
    if applied == live:
        return True
    if isinstance(applied, bool) or isinstance(live, bool):
        return False
    if isinstance(applied, int | float | str) and isinstance(live, int | float | str):
        a, b = _quantity(applied), _quantity(live)  # the API server writes quantities canonically
        return a is not None and a == b
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


# The Trainer's TrainJob webhook looks the runtime up in its informer cache, which lags the API
# server by a moment: a TrainJob applied right after its runtime can be refused with this message
# although the runtime exists. Pulumi would fail the deploy there, and a second `pulumi up` (the
# runtime now cached) succeeds; the harness retries for a few seconds instead (a doubt in the
# README: a real deploy can meet the same race).
_CACHE_LAG = "must be created before the TrainJob is created"


def _apply_once_cached(client: Client, obj: dict, *, dry_run: bool, tries: int = 10):
    for _ in range(tries - 1):
        try:
            return client.apply(obj, dry_run=dry_run)
        except ApiError as err:
            if _CACHE_LAG not in str(err):
                raise
            time.sleep(1)
    return client.apply(obj, dry_run=dry_run)  # the last try: its refusal is the answer


def apply_waves(client: Client, waves: list[list[dict]], *, dry_run: bool = False) -> Outcome:
    applied, problems = 0, []
    for wave in waves:
        for obj in wave:
            try:
                live = _apply_once_cached(client, obj, dry_run=dry_run)
            except ApiError as err:
                problems.append(f"{label(obj)}: refused by the API server (HTTP {err.status}): {err}")
                continue
            applied += 1
            body = {k: v for k, v in obj.items() if k != "status"}
            for diff in differences(body, live):
                problems.append(f"{label(obj)}: {diff}")
    return Outcome(applied, problems)


def _at(obj: dict, path: str):
    node = obj
    for part in path.split("."):
        if part == "*" or not isinstance(node, dict):
            return node
        node = node.get(part)
    return node


def redeploy(client: Client, old, new) -> Outcome:
    """Apply the render ``new`` over a cluster holding ``old`` the way ``pulumi up`` would: objects
    only in ``new`` are created and those only in ``old`` deleted; a changed object is replaced where
    its resource says so (``replaceOnChanges`` on a changed path; deleted first with
    ``deleteBeforeReplace``) and updated in place (server-side apply) otherwise, where the API
    server's validation (immutable fields: CEL ``self == oldSelf``) is the judge."""
    from k8s.resources import resource_name

    before = {resource_name(o): o for o in old.objects}
    problems: list[str] = []
    applied = 0
    for wave in new.waves:
        for obj in wave:
            name = resource_name(obj)
            prior = before.get(name)
            paths, delete_first = new.replace.get(name, ((), False))
            replace = prior is not None and prior != obj and any(_at(prior, p) != _at(obj, p) for p in paths)
            meta = obj["metadata"]
            try:
                if replace:
                    if not delete_first:
                        problems.append(f"{label(obj)}: replaced without deleteBeforeReplace, so Pulumi would create it while the old one (same name) exists")
                        continue
                    client.delete(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace"))  # the API default: background
                    _wait_gone(client, obj)
                live = _apply_once_cached(client, obj, dry_run=False)
            except ApiError as err:
                problems.append(f"{label(obj)}: refused by the API server (HTTP {err.status}): {err}")
                continue
            applied += 1
            problems += [f"{label(obj)}: {d}" for d in differences({k: v for k, v in obj.items() if k != "status"}, live)]
    after = {resource_name(o) for o in new.objects}
    for name, obj in before.items():
        if name not in after:
            meta = obj["metadata"]
            try:
                client.delete(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace"))
            except ApiError as err:
                problems.append(f"{label(obj)}: deleting it failed (HTTP {err.status}): {err}")
    return Outcome(applied, problems)


def _wait_gone(client: Client, obj: dict, timeout: float = 300) -> None:
    """As Pulumi waits for a deleted object (the garbage collector finds a new CRD kind only at its
    next discovery, every 30 s, before it deletes dependents in the foreground)."""
    meta = obj["metadata"]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.get_or_none(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace")) is None:
            return
        time.sleep(0.3)
    raise ApiError(408, f"{label(obj)} still exists {timeout:.0f} s after its deletion (a finalizer holds it)")


def _refused(obj: dict, err: ApiError, what: str = "") -> list[str]:
    return [f"{label(obj)}{what}: refused by the API server (HTTP {err.status}): {err}"]


def dry_create(client: Client, obj: dict) -> list[str] | None:
    """A strict dry-run create of ``obj``: its problems (refusal, or values the server would not keep),
    or None when an object of that name exists already (the caller decides what that means)."""
    body = {k: v for k, v in obj.items() if k != "status"}
    try:
        return [f"{label(obj)}: {d}" for d in differences(body, client.create(body, dry_run=True, strict=True))]
    except ApiError as err:
        return None if err.status == 409 else _refused(obj, err)


def dry_create_renamed(client: Client, obj: dict, suffix: str, what: str = "") -> list[str]:
    """A strict dry-run create of ``obj`` under its name plus ``suffix`` (a replacement, or a copy that
    must not be judged merged into the existing object of its name)."""
    meta = obj["metadata"]
    other = {**{k: v for k, v in obj.items() if k != "status"}, "metadata": {**meta, "name": meta["name"][: 63 - len(suffix)] + suffix}}
    try:
        client.create(other, dry_run=True, strict=True)
    except ApiError as err:
        return _refused(obj, err, what)
    return []


def dry_run(client: Client, obj: dict) -> list[str]:
    """Would the API server take ``obj`` (schema, CEL rules, webhooks, admission policies), and keep
    it whole? A dry-run create; where it exists already, a dry-run apply, as an update would be; and
    where that meets an immutable field (an object Pulumi replaces on change), a dry-run create under
    another name, as the replacement would be created. Nothing is stored."""
    created = dry_create(client, obj)
    if created is not None:
        return created
    body = {k: v for k, v in obj.items() if k != "status"}
    try:
        return [f"{label(obj)}: {d}" for d in differences(body, client.apply(body, dry_run=True))]
    except ApiError as err:
        if err.status != 422 or "immutable" not in str(err):
            return _refused(obj, err)
    return dry_create_renamed(client, obj, "-dryrun", " (as its replacement)")
