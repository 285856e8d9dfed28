"""How far a job is, from where it is told: the TrainJob's own status (Trainer v2.3.0's
``status.trainerStatus``, which the platform's programs fill through the Trainer's status server:
workloads/programs/trainer_status.py) or, where the Trainer does not carry it (v2.1.0, a local run,
a program of the user's own that reports nothing), the newest step event in node 0's log."""

from __future__ import annotations

import json
from collections.abc import Iterable

EVENT = "TRAINING_EVENT "


def of_lines(lines: Iterable[str]) -> dict | None:
    """Step, total steps, ETA and loss of the newest step event among ``lines`` (a pod's log)."""
    found = None
    for line in lines:
        i = line.find(EVENT)
        if i < 0:
            continue
        try:
            ev = json.loads(line[i + len(EVENT):])
        except ValueError:
            continue
        if isinstance(ev, dict) and ev.get("event") == "step":
            found = {k: ev[k] for k in ("step", "total_steps", "eta_s", "loss") if k in ev}
            found["source"] = "log"
    return found


def of_trainjob(trainjob: dict) -> dict | None:
    """Percent, ETA and metrics the Trainer holds for the job (``status.trainerStatus``)."""
    ts = (trainjob.get("status") or {}).get("trainerStatus")
    if not isinstance(ts, dict):
        return None
    out: dict = {"source": "trainer"}
    if ts.get("progressPercentage") is not None:
        out["percent"] = ts["progressPercentage"]
    if ts.get("estimatedRemainingSeconds") is not None:
        out["eta_s"] = ts["estimatedRemainingSeconds"]
    metrics = {m.get("name"): m.get("value") for m in ts.get("metrics") or [] if isinstance(m, dict) and m.get("name")}
    if metrics:
        out["metrics"] = metrics
    if ts.get("lastUpdatedTime"):
        out["updated"] = ts["lastUpdatedTime"]
    return out if len(out) > 1 else None


def text(p: dict | None) -> str:
    """One cell: ``42% eta 120s loss 1.93`` (from the Trainer) or ``7/30 eta 12s`` (from a log)."""
    if not p:
        return "-"
    eta = f" eta {int(float(p['eta_s']))}s" if p.get("eta_s") is not None else ""
    if "percent" in p:
        loss = (p.get("metrics") or {}).get("loss")
        return f"{p['percent']}%{eta}" + (f" loss {loss}" if loss is not None else "")
    if "step" not in p:
        return "-"
    return (f"{p['step']}/{p['total_steps']}" if p.get("total_steps") else str(p["step"])) + eta
