"""Render time: the dev stack (median of several runs, one process each), the program alone,
and how the program's time grows with 1, 10, 50 extra TrainJobs + runtimes.

    python -m bench.render [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from bench.common import ROOT, table

TIMER = r"""
import json, os, sys, time
sys.path.insert(0, {root!r})
t0 = time.perf_counter()
from tools.mock_runtime import run_program
t1 = time.perf_counter()
run = run_program({root!r}, "dev", main={main!r})
t2 = time.perf_counter()
print(json.dumps({{"imports_s": t1 - t0, "program_s": t2 - t1, "resources": len(run.registrations)}}))
"""


def one(main: str | None, env: dict | None = None) -> dict:
    code = TIMER.format(root=str(ROOT), main=main)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    wall = time.perf_counter() - t0
    return {**json.loads(p.stdout.strip().splitlines()[-1]), "process_s": wall}


def main(argv=None) -> int:
    import os

    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args(argv)
    runs = [one(None) for _ in range(args.runs)]
    med = {k: statistics.median(r[k] for r in runs) for k in ("process_s", "imports_s", "program_s")}
    print(f"dev stack: {runs[0]['resources']} resources; median of {args.runs} runs: whole process {med['process_s']:.2f} s, imports {med['imports_s']:.2f} s, program {med['program_s']:.2f} s (target < 2 s)")
    rows = []
    for n in (1, 10, 50):
        env = {**os.environ, "SCALE_N": str(n)}
        rs = [one(str(ROOT / "bench" / "scale_program.py"), env) for _ in range(max(3, args.runs // 2))]
        prog = statistics.median(r["program_s"] for r in rs)
        rows.append({"extra jobs+runtimes": n, "resources": rs[0]["resources"], "program s (median)": round(prog, 3)})
    base = rows[0]
    for r in rows:
        extra = r["resources"] - base["resources"]
        r["ms per extra resource"] = round(1000 * (r["program s (median)"] - base["program s (median)"]) / extra, 2) if extra else ""
    print(table(rows, list(rows[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
