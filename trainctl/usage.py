"""GPU-hours per team and per job (showback) from Kueue's Workloads, as Kueue v0.19 writes them
(apis/kueue/v1beta2 workload_types.go):

- ``status.admission.clusterQueue``: the queue that admitted it (``team-<team>`` for a team, the
  stack's ``platform-jobs``);
- ``status.admission.podSetAssignments[].resourceUsage``: what the pod set uses in all, its
  ``count`` pods together (``nvidia.com/gpu`` among them);
- ``status.conditions``: ``QuotaReserved``/``Admitted`` (True from when it holds quota),
  ``Finished`` or ``Evicted`` (True from when it stopped holding it).

A job's GPU-hours over a period are its GPUs times the part of its admitted time inside the
period; a job still running counts up to now.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

GPU = "nvidia.com/gpu"
TEAM_QUEUE_PREFIX = "team-"


@dataclass(frozen=True)
class Row:
    team: str
    namespace: str
    job: str
    gpus: int
    start: datetime
    end: datetime | None  # None: still admitted
    gpu_hours: float


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)  # Kubernetes' timestamps (RFC 3339, from the Unix epoch): no Workload is older


def since_time(text: str, now: datetime) -> datetime:
    """``7d``, ``12h``, ``30m`` before now, or an ISO date/time; between the Unix epoch and now."""
    allowed = f"allowed: a duration such as 7d, 12h or 30m, or a date such as 2026-11-01, from {EARLIEST:%Y-%m-%d} to now"
    m = re.fullmatch(r"(\d{1,15})([dhm])", text, re.ASCII)  # more digits reach back before any date anyway
    if m:
        n, unit = int(m.group(1)), m.group(2)
        if n == 0:
            raise ValueError(f"--since {text!r} is a period of no length (it would count nothing); {allowed}")
        span = (now - EARLIEST).total_seconds() / {"d": 86400, "h": 3600, "m": 60}[unit]
        if n > span:
            raise ValueError(f"--since {text!r} reaches back before {EARLIEST:%Y-%m-%d} (at most {int(span)}{unit} from now); {allowed}")
        return now - {"d": timedelta(days=n), "h": timedelta(hours=n), "m": timedelta(minutes=n)}[unit]
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"--since {text!r}: {allowed}") from None
    t = t if t.tzinfo else t.replace(tzinfo=UTC)
    if not EARLIEST <= t <= now:
        raise ValueError(f"--since {text!r}: {'in the future' if t > now else 'before ' + format(EARLIEST, '%Y-%m-%d')}; {allowed}")
    return t


def _condition(wl: dict, kind: str) -> dict | None:
    return next((c for c in (wl.get("status") or {}).get("conditions") or [] if c.get("type") == kind and c.get("status") == "True"), None)


def _gpus(wl: dict) -> int:
    admission = (wl.get("status") or {}).get("admission") or {}
    return sum(int(float(str((ps.get("resourceUsage") or {}).get(GPU, 0)))) for ps in admission.get("podSetAssignments") or [])


def team_of(wl: dict) -> str:
    queue = ((wl.get("status") or {}).get("admission") or {}).get("clusterQueue", "")
    return queue[len(TEAM_QUEUE_PREFIX):] if queue.startswith(TEAM_QUEUE_PREFIX) else (queue or "-")


def job_of(wl: dict) -> str:
    owners = (wl.get("metadata") or {}).get("ownerReferences") or []
    return next((o["name"] for o in owners if o.get("kind") == "TrainJob"), (wl.get("metadata") or {}).get("name", "?"))


def borrowed(workloads: list[dict], quota: int) -> int:
    """GPUs Kueue holds for the Workloads beyond a team's nominal quota, flavor by flavor (each GPU
    pool is a flavor of the team's ClusterQueue with that quota: k8s/builders/kueue.py
    team_cluster_queue), from ``podSetAssignments[].flavors`` and ``resourceUsage`` of the ones
    holding quota: Kueue's ``borrowed``, which a team may not read on its cluster-scoped ClusterQueue."""
    per_flavor: dict[str, int] = {}
    for wl in workloads:
        if not (_condition(wl, "Admitted") or _condition(wl, "QuotaReserved")) or _condition(wl, "Finished") or _condition(wl, "Evicted"):
            continue
        for ps in ((wl.get("status") or {}).get("admission") or {}).get("podSetAssignments") or []:
            gpus = int(float(str((ps.get("resourceUsage") or {}).get(GPU, 0))))
            flavor = str((ps.get("flavors") or {}).get(GPU, ""))
            per_flavor[flavor] = per_flavor.get(flavor, 0) + gpus
    return sum(max(0, used - quota) for used in per_flavor.values())


def rows(workloads: list[dict], *, since: datetime, now: datetime, team: str | None = None) -> list[Row]:
    out = []
    for wl in workloads:
        admitted = _condition(wl, "Admitted") or _condition(wl, "QuotaReserved")
        gpus = _gpus(wl)
        if not admitted or gpus == 0:
            continue
        start = parse_time(admitted["lastTransitionTime"])
        stop = _condition(wl, "Finished") or _condition(wl, "Evicted")
        end = parse_time(stop["lastTransitionTime"]) if stop else None
        lo, hi = max(start, since), min(end or now, now)
        if hi <= lo:
            continue
        if team is not None and team_of(wl) != team:
            continue
        out.append(Row(team_of(wl), wl["metadata"].get("namespace", ""), job_of(wl), gpus, start, end, round(gpus * (hi - lo).total_seconds() / 3600, 3)))
    return sorted(out, key=lambda r: (r.team, -r.gpu_hours, r.job))


def per_team(rs: list[Row]) -> dict[str, float]:
    totals: dict[str, float] = {}
    for r in rs:
        totals[r.team] = round(totals.get(r.team, 0.0) + r.gpu_hours, 3)
    return dict(sorted(totals.items()))


def to_csv(rs: list[Row]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["team", "namespace", "job", "gpus", "start", "end", "gpu_hours"])
    for r in rs:
        w.writerow([r.team, r.namespace, r.job, r.gpus, r.start.isoformat(), r.end.isoformat() if r.end else "", f"{r.gpu_hours:.3f}"])
    return buf.getvalue()
