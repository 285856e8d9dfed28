"""Checkpoint cost of the FSDP job: time to save (sharded, atomic) and to restore, and size.

    python -m bench.checkpoint                 # CPU, 2 processes: tiny and t5-small
    python -m bench.checkpoint --gpu           # one GPU: t5-large, bf16
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from bench.common import run_program, table


def measure(model_config: str, nproc: int, batch: int, source_len: int, target_len: int) -> dict:
    with tempfile.TemporaryDirectory() as ckpt:
        common = [
            "--synthetic", "--init", "random", "--model-config", model_config, "--batch-size", str(batch), "--source-len", str(source_len), "--target-len", str(target_len),
            "--synthetic-samples", str(batch * nproc * 8), "--checkpoint-dir", ckpt, "--checkpoint-every", "2", "--log-every", "100000", "--epochs", "1",
        ]
        first = run_program("fsdp_t5.py", common + ["--max-steps", "4"], nproc=nproc)
        saves = [e["seconds"] for e in first["events"] if e["event"] == "checkpoint"]
        size = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(os.path.join(ckpt, "step-00000004")) for f in fs)
        second = run_program("fsdp_t5.py", common + ["--max-steps", "5"], nproc=nproc)
        restore = next(e["seconds"] for e in second["events"] if e["event"] == "resumed")
    return {"model": model_config, "processes": nproc, "save s (last)": saves[-1], "restore s": restore, "size MiB": round(size / 2**20, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu", action="store_true")
    args = ap.parse_args(argv)
    if args.gpu:
        rows = [measure("t5-large", 1, 4, 512, 128)]
    else:
        rows = [measure("tiny", 2, 4, 32, 16), measure("t5-small", 2, 2, 64, 16)]
    print("FSDP checkpoint cost (model + AdamW state, torch.distributed.checkpoint, written then renamed):")
    print(table(rows, list(rows[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
