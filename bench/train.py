"""Training throughput: DDP samples/s; FSDP useful tokens/s, step time, peak memory and MFU for
each variant of the FSDP program, next to the workshop sample's approach.

    python -m bench.train            # CPU (2 processes, gloo): t5-small, runs anywhere
    python -m bench.train --gpu      # one GPU: T5-large, bf16, a batch-size sweep, then the variants

Every FSDP figure comes from bench.efficiency.measure: the steps after warm-up, each step's useful
FLOPs counted from its own samples (the program's batch plan replayed), over the loop time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys

from bench.common import run_program, table
from bench.efficiency import OURS, WORKSHOP, measure
from bench.flops import peak_tflops

VARIANTS = {
    # name: arguments on top of the common ones; "ours" is the program's defaults
    "ours (native T5, FSDP2 per block, length-bucketed)": OURS,
    "ours, Hugging Face T5": ["--impl", "hf"],
    "ours, every batch full length": ["--padding", "full"],
    "ours + activation checkpointing": ["--activation-checkpointing"],
    "ours + torch.compile per block": ["--compile"],
    "ours + FlexAttention (no dropout; GPU only)": ["--attention", "flex", "--dropout", "0"],
    "ours, no dropout": ["--dropout", "0"],
    "workshop (HF T5, one FSDP unit, pads in loss, full length)": WORKSHOP,
    "workshop, fp32 (no AMP)": [*WORKSHOP, "--precision", "fp32"],
}
CPU_SKIP = ("compile", "Flex", "fp32")  # slow to compile on 2 cores / training needs a GPU / the CPU runs fp32 anyway
COLUMNS = ["variant", "useful tok/s", "step s (mean)", "MFU %", "HFU %", "padding %", "peak GiB", "vs ours"]


def fsdp_rows(variants: dict[str, list[str]], common: dict) -> list[dict]:
    rows = []
    for name, extra in variants.items():
        try:
            row = measure(name, [*extra, "--checkpoint-every", "100000"], **common)
        except RuntimeError as err:
            row = {"program": name, "useful tok/s": f"failed: {str(err).splitlines()[0][:60]}"}
        rows.append({"variant": name, **{k: v for k, v in row.items() if k != "program"}})
    return rows


def compare(rows: list[dict], base: dict | None) -> None:
    """Each measured row's "vs ours": its useful tokens/s over ``base``'s."""
    for r in rows:
        r["vs ours"] = round(r["useful tok/s"] / base["useful tok/s"], 2) if base and isinstance(r.get("useful tok/s"), float) else ""


def cpu(args) -> list[dict]:
    ddp = run_program("ddp_mnist.py", ["--synthetic", "--synthetic-samples", "4096", "--batch-size", "32", "--epochs", "1", "--max-steps", "60", "--checkpoint-every", "100000", "--log-every", "100000"], nproc=2)["result"]
    print(f"DDP MNIST (CPU, 2 processes, batch 32/process): samples/s={ddp['samples_per_s']}")
    variants = {n: e for n, e in VARIANTS.items() if args.compile and "compile" in n or not any(k in n for k in CPU_SKIP)}
    common = {"model": "t5-small", "batch": 4, "nproc": 2, "source_len": 64, "target_len": 16, "steps": args.steps or 10, "warmup": 3, "peak": None}
    rows = fsdp_rows(variants, common)
    compare(rows, next((r for r in rows if isinstance(r.get("useful tok/s"), float)), None))  # the first that ran: ours
    print("FSDP T5-small (CPU, 2 processes, gloo, fp32, batch 4/process, 64->16 tokens); MFU n/a: no CPU peak")
    print(table(rows, COLUMNS))
    return [{"ddp_samples_per_s": ddp["samples_per_s"]}, *rows]


def gpu(args) -> list[dict]:
    import torch

    name = torch.cuda.get_device_name(0)
    peak = peak_tflops(name)
    steps = args.steps or 40
    print(f"device: {name}, bf16 dense peak {peak} TFLOP/s; T5-large, 512->128 tokens, 1 GPU, {datetime.date.today()}")
    common = {"model": "t5-large", "nproc": 1, "source_len": 512, "target_len": 128, "steps": steps, "warmup": 8, "peak": peak}
    batches = [args.variants_batch] if args.variants_batch else args.batch_sizes
    rows = []
    for b in batches:
        rows += fsdp_rows({f"ours, batch {b}": OURS}, {**common, "batch": b})
    best = max((r for r in rows if isinstance(r.get("useful tok/s"), float)), key=lambda r: r["useful tok/s"])
    best_batch = int(best["variant"].rsplit(" ", 1)[-1])
    if not args.skip_variants:
        chosen = {n: e for n, e in list(VARIANTS.items())[1:] if not args.only or any(o in n for o in args.only)}
        rows += fsdp_rows({f"{n}, batch {best_batch}": e for n, e in chosen.items()}, {**common, "batch": best_batch})
        # activation checkpointing pays only if the memory it frees buys a larger micro-batch
        rows += fsdp_rows({f"ours + activation checkpointing, batch {2 * best_batch}": ["--activation-checkpointing"]}, {**common, "batch": 2 * best_batch})
    compare(rows, best)
    print(table(rows, COLUMNS))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--compile", action="store_true", help="CPU: include the torch.compile variant (slow to compile)")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[16, 32, 48], help="GPU: the sweep")
    ap.add_argument("--steps", type=int, help="steps per run (default: 40 on a GPU, 10 on CPU)")
    ap.add_argument("--skip-variants", action="store_true", help="GPU: batch-size sweep only")
    ap.add_argument("--variants-batch", type=int, help="GPU: no sweep, the variants at this batch size")
    ap.add_argument("--only", nargs="+", help="GPU: run only the variants whose name contains one of these words")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args(argv)
    rows = gpu(args) if args.gpu else cpu(args)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
