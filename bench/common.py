"""Run a training program as the Trainer would (torchrun) and return its result event."""

from __future__ import annotations

import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROGRAMS = ROOT / "workloads" / "programs"


def run_program(program: str, args: list[str], nproc: int = 1, env: dict | None = None, timeout: int = 900) -> dict:
    """torchrun --nproc-per-node N programs/<program> args; returns {'result': ..., 'events': [...]}"""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-port", str(_port()), str(PROGRAMS / program)] + args
        if "--checkpoint-dir" not in args:
            cmd += ["--checkpoint-dir", os.path.join(tmp, "ckpt")]
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        p = subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=timeout)
        events = [json.loads(line.split(" ", 1)[1]) for line in p.stdout.splitlines() if line.startswith("TRAINING_EVENT ")]
        if p.returncode != 0:
            raise RuntimeError(f"{program} {' '.join(args)} failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
        result = next(e for e in reversed(events) if e["event"] == "result")
        return {"result": result, "events": events}


def _port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def table(rows: list[dict], columns: list[str]) -> str:
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in columns}
    line = "  ".join(c.ljust(widths[c]) for c in columns)
    out = [line, "  ".join("-" * widths[c] for c in columns)]
    for r in rows:
        out.append("  ".join(str(r.get(c, "")).ljust(widths[c]) for c in columns))
    return "\n".join(out)


def checkpoint_figures(saves: list[dict]) -> tuple[float, float, float]:
    """(first save's stall, median stall, median total) of a run's ``checkpoint`` events: the first
    save allocates the reused host buffers, so the medians are over the later ones (all, if only one)."""
    later = saves[1:] or saves
    return saves[0]["ckpt_stall_s"], round(statistics.median(e["ckpt_stall_s"] for e in later), 4), round(statistics.median(e["ckpt_total_s"] for e in later), 4)
