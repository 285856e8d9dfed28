"""Training throughput: DDP samples/s; FSDP tokens/s, step time, peak memory and MFU, with our
FSDP setup side by side with the workshop sample's approach and variants.

    python -m bench.train            # CPU (2 processes, gloo): tiny/small models, runs anywhere
    python -m bench.train --gpu      # one GPU: T5-large, bf16, several batch sizes
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys

from bench.common import PROGRAMS, run_program, table
from bench.flops import mfu, peak_tflops, t5_train_flops, t5_train_flops_for

sys.path.insert(0, str(PROGRAMS))
from fsdp_t5 import PAD_ID, T5_CONFIGS, synthetic_dataset  # noqa: E402

VARIANTS = {
    # name: extra arguments on top of the common ones
    "ours (per-block FSDP2, pad masked)": [],
    "ours + activation ckpt": ["--activation-checkpointing"],
    "ours + torch.compile": ["--compile"],
    "workshop (one FSDP unit, pads in loss)": ["--wrap", "root", "--no-mask-pad"],
    "workshop, fp32 (one unit, pads, no AMP)": ["--wrap", "root", "--no-mask-pad", "--precision", "fp32"],
}


def fsdp_run(model_config: str, batch: int, source_len: int, target_len: int, steps: int, nproc: int, extra: list[str]) -> dict:
    args = [
        "--synthetic", "--init", "random", "--model-config", model_config, "--batch-size", str(batch), "--source-len", str(source_len), "--target-len", str(target_len),
        "--synthetic-samples", str(batch * nproc * (steps + 1)), "--max-steps", str(steps), "--checkpoint-every", "100000", "--log-every", "100000", "--epochs", "1",
    ] + extra
    r = run_program("fsdp_t5.py", args, nproc=nproc)["result"]
    cfg = T5_CONFIGS[model_config]
    flops = t5_train_flops(cfg, batch * nproc, source_len, target_len)  # the padded batch: hardware work
    r["padded_tokens_per_s"] = round(batch * nproc * (source_len + target_len) / r["step_time_s"], 1)
    r["model_tflops"] = round(flops / r["step_time_s"] / 1e12, 3)
    r["useful_tflops"] = round(useful_flops_per_sample(cfg, source_len, target_len, batch * nproc * (steps + 1)) * batch * nproc / r["step_time_s"] / 1e12, 3)
    return r


def useful_flops_per_sample(cfg: dict, source_len: int, target_len: int, samples: int, seed: int = 1234) -> float:
    """Mean training FLOPs of one sample of the program's synthetic data, non-pad tokens only."""
    import types

    src, mask, tgt = synthetic_dataset(types.SimpleNamespace(seed=seed, synthetic_samples=samples, source_len=source_len, target_len=target_len), cfg["vocab_size"]).tensors
    lengths = zip(mask.sum(1).tolist(), (tgt != PAD_ID).sum(1).tolist(), strict=True)
    return t5_train_flops_for(cfg, lengths) / samples


def cpu(args) -> list[dict]:
    rows = []
    ddp = run_program("ddp_mnist.py", ["--synthetic", "--synthetic-samples", "4096", "--batch-size", "32", "--epochs", "1", "--max-steps", "60", "--checkpoint-every", "100000", "--log-every", "100000"], nproc=2)["result"]
    print(f"DDP MNIST (CPU, 2 processes, batch 32/process): samples/s={ddp['samples_per_s']}")
    base = None
    for name, extra in VARIANTS.items():
        if "compile" in name and not args.compile:
            continue
        r = fsdp_run("t5-small", 4, 64, 16, 8, 2, extra)
        base = base or r
        rows.append({
            "variant": name, "tokens/s (non-pad)": r["tokens_per_s"], "padded tok/s": r["padded_tokens_per_s"], "step s": r["step_time_s"],
            "peak GiB (host RSS)": r["peak_memory_gib"], "GFLOP/s": round(r["model_tflops"] * 1000, 1), "useful GFLOP/s": round(r["useful_tflops"] * 1000, 1), "vs ours": round(r["padded_tokens_per_s"] / base["padded_tokens_per_s"], 2),
        })
    print("FSDP T5-small (CPU, 2 processes, gloo, fp32, batch 4/process, 64->16 tokens); MFU n/a: no CPU peak in the table")
    print(table(rows, list(rows[0])))
    return [{"ddp_samples_per_s": ddp["samples_per_s"]}] + rows


def gpu(args) -> list[dict]:
    import torch

    name = torch.cuda.get_device_name(0)
    peak = peak_tflops(name)
    print(f"device: {name}, bf16 dense peak {peak} TFLOP/s; T5-large, 512->128 tokens, 1 GPU, {datetime.date.today()}")
    rows = []
    batches = [args.variants_batch] if args.variants_batch else args.batch_sizes
    for batch in batches:
        r = fsdp_run("t5-large", batch, 512, 128, args.steps, 1, [])
        rows.append({"variant": f"ours, batch {batch}", **_gpu_cols(r, peak)})
    best = max(rows, key=lambda x: x["padded tok/s"])
    best_batch = int(best["variant"].rsplit(" ", 1)[-1])
    variants = [] if args.skip_variants else [(n, e) for n, e in list(VARIANTS.items())[1:] if not args.only or any(o in n for o in args.only)]
    for name_, extra in variants:
        try:
            r = fsdp_run("t5-large", best_batch, 512, 128, args.steps, 1, extra)
            rows.append({"variant": f"{name_}, batch {best_batch}", **_gpu_cols(r, peak)})
        except RuntimeError as err:
            rows.append({"variant": f"{name_}, batch {best_batch}", "tokens/s (non-pad)": f"failed: {str(err).splitlines()[0][:60]}"})
    for row in rows:
        row["vs best ours"] = round(row.get("padded tok/s", 0) / best["padded tok/s"], 2) if isinstance(row.get("padded tok/s"), float) else ""
    print(table(rows, ["variant", "tokens/s (non-pad)", "padded tok/s", "step s", "peak GiB", "MFU %", "HFU % (padded)", "vs best ours"]))
    return rows


def _gpu_cols(r: dict, peak: float | None) -> dict:
    return {
        "tokens/s (non-pad)": r["tokens_per_s"], "padded tok/s": r["padded_tokens_per_s"], "step s": r["step_time_s"], "peak GiB": r["peak_memory_gib"],
        "MFU %": round(100 * mfu(r["useful_tflops"], 1.0, peak), 1) if peak else "n/a",  # useful (non-pad) FLOPs
        "HFU % (padded)": round(100 * mfu(r["model_tflops"], 1.0, peak), 1) if peak else "n/a",
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--compile", action="store_true", help="include the torch.compile variant on CPU (slow to compile)")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--skip-variants", action="store_true", help="GPU: batch-size sweep only")
    ap.add_argument("--variants-batch", type=int, help="GPU: variants only, at this batch size")
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
