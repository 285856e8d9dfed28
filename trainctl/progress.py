"""How far a job is, from where it is told: the TrainJob's own status (Trainer v2.3.0's
``status.trainerStatus``, which the platform's programs fill through the Trainer's status server:
workloads/programs/trainer_status.py) or, where the Trainer does not carry it (v2.1.0, a local run,
a program of the user's own that reports nothing), the newest step event in node 0's log."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable

EVENT = "TRAINING_EVENT "
METRIC_KEY = "training_metric"  # the platform's programs' metric lines (workloads/programs/trainlib.py metric_line)
LOCAL_PREFIX = re.compile(r"^\[attempt \d+ node \d+[^\]]*\] ")  # the emulator's prefix of a local job's lines (trainctl/local.py NODE_LINE)
SERIES_FIELDS = ("loss", "samples_per_s", "tokens_per_s", "step_time_s", "time")
SIGNED = ("loss",)  # may be below zero (a loss can be); a negative rate, step time or time is left out
MAX_POINTS = 5000  # the newest steps a chart keeps
EXAMPLE = """import json
for step in range(1, 101):  # your training loop, on rank 0
    print("TRAINING_EVENT " + json.dumps({"event": "step", "step": step, "total_steps": 100, "loss": 2.0 / step, "samples_per_s": 512.0, "step_time_s": 0.25}), flush=True)"""
"""The three lines docs/progress-events.md and the portal's help page show (tests/test_portal_live.py
checks that the page's and the doc's are this and that its output parses)."""
DOCUMENTED_FIELDS = (
    ("event", "\"step\" (required: other events are not progress)"),
    ("step", "the step just done, a whole number from 0 (required)"),
    ("total_steps", "the steps the job will do: the portal and trainctl show step/total"),
    ("eta_s", "seconds left, your estimate: shown as eta"),
    ("loss", "the training loss: charted"),
    ("samples_per_s", "throughput in samples per second (or tokens_per_s in tokens): charted"),
    ("step_time_s", "seconds per step: charted (without it, from time)"),
    ("time", "seconds since the epoch when the event was written: gives the step time where step_time_s is missing"),
)
"""The fields of a step event, as docs/progress-events.md and the portal's help page give them."""


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


def _step_record(line: str) -> dict | None:
    """The step event of a line: a ``TRAINING_EVENT {"event": "step", ...}`` anywhere in it, or a
    metric line of rank 0 (``{"training_metric": "step", "rank": 0, ...}``) after any local prefix."""
    i = line.find(EVENT)
    if i >= 0:
        try:
            ev = json.loads(line[i + len(EVENT):])
        except ValueError:
            return None
        return ev if isinstance(ev, dict) and ev.get("event") == "step" else None
    rest = LOCAL_PREFIX.sub("", line, count=1)
    if not rest.startswith("{") or METRIC_KEY not in rest:
        return None
    try:
        rec = json.loads(rest)
    except ValueError:
        return None
    return rec if isinstance(rec, dict) and rec.get(METRIC_KEY) == "step" and rec.get("rank", 0) == 0 else None


def _number(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) else None


def series(lines: Iterable[str]) -> list[dict]:
    """Every step a log reports, oldest first: ``{"step", "loss", "samples_per_s" or
    "tokens_per_s", "step_time_s"}`` (what the step's events carry; a restarted job's later report
    of a step replaces the earlier; a negative loss is kept, a negative rate or time left out). Step time where no event gives it: from the events' ``time``
    (seconds since the epoch) between two reported steps. At most the newest ``MAX_POINTS``."""
    by_step: dict[int, dict] = {}
    reported: set[int] = set()  # steps a TRAINING_EVENT gave (a metric line adds to its step's point)
    for line in lines:
        ev = _step_record(line)
        step = ev.get("step") if ev else None
        if ev is None or not isinstance(step, int) or isinstance(step, bool) or step < 0:
            continue
        if METRIC_KEY not in ev:
            if step in reported:
                by_step.pop(step, None)
            reported.add(step)
        point = by_step.setdefault(step, {"step": step})
        for key in SERIES_FIELDS:
            value = _number(ev.get(key))
            if value is not None and (key in SIGNED or value >= 0):
                point[key] = value
    points = sorted(by_step.values(), key=lambda p: p["step"])[-MAX_POINTS:]
    for prev, p in zip(points, points[1:], strict=False):
        if "step_time_s" not in p and "time" in p and "time" in prev and p["time"] > prev["time"]:
            p["step_time_s"] = (p["time"] - prev["time"]) / (p["step"] - prev["step"])
    for p in points:
        p.pop("time", None)
    return points
