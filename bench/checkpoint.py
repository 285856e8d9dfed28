"""Checkpoint cost of the FSDP job, synchronous against asynchronous saves of the same state: the
time the training loop is blocked per save (stall), the total save time (start to the checkpoint
being marked complete), the time to restore, and the size.

    python -m bench.checkpoint                 # CPU, 2 processes: tiny and t5-small
    python -m bench.checkpoint --gpu           # one GPU: t5-large, bf16
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from bench.common import checkpoint_figures, run_program, table


def measure(model_config: str, nproc: int, batch: int, source_len: int, target_len: int, mode: str) -> dict:
    with tempfile.TemporaryDirectory() as ckpt:
        common = [
            "--synthetic", "--init", "random", "--model-config", model_config, "--batch-size", str(batch), "--source-len", str(source_len), "--target-len", str(target_len),
            "--synthetic-samples", str(batch * nproc * 16), "--checkpoint-dir", ckpt, "--checkpoint-every", "3", "--log-every", "100000", "--epochs", "1",
            "--checkpoint-mode", mode,
        ]
        first = run_program("fsdp_t5.py", common + ["--max-steps", "9"], nproc=nproc)  # saves at steps 3, 6, 9: same seed, same states
        saves = [e for e in first["events"] if e["event"] == "checkpoint"]
        size = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(os.path.join(ckpt, "step-00000009")) for f in fs)
        second = run_program("fsdp_t5.py", common + ["--max-steps", "10"], nproc=nproc)
        restore = next(e["seconds"] for e in second["events"] if e["event"] == "resumed")
    return {
        "model": model_config, "mode": mode, "processes": nproc, "step s": first["result"]["step_time_s"],
        **dict(zip(("first stall s", "stall s (median)", "total s (median)"), checkpoint_figures(saves), strict=True)),
        "restore s": restore, "size MiB": round(size / 2**20, 1),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu", action="store_true")
    args = ap.parse_args(argv)
    configs = [("t5-large", 1, 4, 512, 128)] if args.gpu else [("tiny", 2, 4, 32, 16), ("t5-small", 2, 2, 64, 16)]
    rows = [measure(*c, mode) for c in configs for mode in ("sync", "async")]
    print("FSDP checkpoint cost (model + AdamW state, torch.distributed.checkpoint, written then renamed; first save at step 3, then the median of the saves at steps 6 and 9):")
    print(table(rows, list(rows[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
