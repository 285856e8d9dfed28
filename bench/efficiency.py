"""GPU efficiency of the FSDP T5 program, side by side with the workshop's approach, in one run.

    python -m bench.efficiency                 # CPU: t5-small, 2 processes (gloo), fp32
    python -m bench.efficiency --gpu           # one GPU: t5-large, bf16
    python -m bench.efficiency --gpu --profile # also the top kernels of a few of our steps

Both programs train on the same data: the FSDP program's synthetic sequences (seeded; sources
of 1/4 to the whole --source-len, targets likewise), from the same random initialisation, with the
same micro-batch. "ours" is the program with the defaults the platform runs it with (native T5,
FSDP2 per block, pads masked, length-bucketed batches, asynchronous checkpoints every
--checkpoint-every steps); on a GPU a second row adds the opt-in torch.compile per block
(``--compile``). "workshop" is the workshop sample's approach (Hugging Face T5, the whole model one
FSDP unit, pads in the loss, every batch at full length, no checkpoints: that only flatters it).

Figures, over the steps after --warmup (the first compilations fall there; a new batch length
may still recompile later, and that time counts), from each step's loop time (forward, backward,
optimizer step, and the checkpoint stall):
  useful tokens/s   non-pad source + target tokens per second
  MFU               useful training FLOPs per second (bench/flops.py, counted per sample from its
                    own lengths) over the device's dense bf16 peak; n/a on a CPU
  HFU               the same with the FLOPs of the padded batches the hardware computed (no
                    activation-checkpointing recompute counted)
  padding %         the share of the computed FLOPs spent on padding
  ratio             ours / workshop
and for ours the checkpoint stall (time the loop was blocked per save) and total save time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile

from bench.common import PROGRAMS, checkpoint_figures, run_program, table
from bench.flops import mfu, peak_tflops, t5_train_flops_for

sys.path.insert(0, str(PROGRAMS))
import trainlib  # noqa: E402
from fsdp_t5 import PAD_ID, T5_CONFIGS, Profiler, build_parser, synthetic_dataset  # noqa: E402

OURS = ["--impl", "native", "--padding", "bucketed"]
WORKSHOP = ["--impl", "hf", "--wrap", "root", "--no-mask-pad", "--padding", "full"]
PROFILED_UNTIL = Profiler.WARMUP + 3 + 1  # the profiler waits, records 3 steps (--trace-steps default), exports in the next
def step_plan(run: argparse.Namespace, nproc: int) -> list[tuple[float, float, int, int]]:
    """(useful FLOPs, computed FLOPs, useful tokens, rank 0's useful tokens) of each step of a run,
    replayed from the program's own batch plan (trainlib.epoch_batches) over the same synthetic
    data, with the run's own arguments as the program parses them (``fsdp_t5.build_parser``)."""
    cfg = T5_CONFIGS[run.model_config]
    src, mask, tgt = synthetic_dataset(run, cfg["vocab_size"]).tensors
    lengths = list(zip(mask.sum(1).tolist(), (tgt != PAD_ID).sum(1).tolist(), strict=True))
    bucketed = run.padding == "bucketed"
    plan = trainlib.epoch_batches(lengths, global_batch=run.batch_size * nproc, seed=run.seed, epoch=0, bucket_window=run.bucket_window if bucketed else 0, granularity=run.pad_multiple)
    out = []
    for step in range(min(run.max_steps, len(plan) // run.grad_accum)):
        useful_flops = computed_flops = 0.0
        tokens = rank0 = 0
        for indices in plan[step * run.grad_accum : (step + 1) * run.grad_accum]:
            useful = [lengths[i] for i in indices]
            s_len, t_len = run.source_len, run.target_len
            if bucketed:
                s_len = trainlib.padded_length(max(s for s, _ in useful), run.pad_multiple, run.source_len)
                t_len = trainlib.padded_length(max(t for _, t in useful), run.pad_multiple, run.target_len)
            useful_flops += t5_train_flops_for(cfg, useful)
            computed_flops += t5_train_flops_for(cfg, [(s_len, t_len)] * len(useful))
            tokens += sum(s + t for s, t in useful)
            rank0 += sum(s + t for s, t in useful[: run.batch_size])
        out.append((useful_flops, computed_flops, tokens, rank0))
    return out


def measure(name: str, extra: list[str], *, model: str, batch: int, nproc: int, source_len: int, target_len: int, steps: int, warmup: int, peak: float | None) -> dict:
    samples = batch * nproc * (steps + 1)
    args = [
        "--synthetic", "--init", "random", "--model-config", model, "--batch-size", str(batch), "--source-len", str(source_len), "--target-len", str(target_len),
        "--synthetic-samples", str(samples), "--max-steps", str(steps), "--log-every", "100000", "--epochs", "1", "--report-step-times", *extra,
    ]
    run = run_program("fsdp_t5.py", args, nproc=nproc, timeout=3600)
    r = run["result"]
    plan = step_plan(build_parser().parse_args(args), nproc)
    if [p[3] for p in plan] != r["rank0_step_tokens"] or abs(sum(p[2] for p in plan) - r["useful_tokens"]) > 0.5:
        raise RuntimeError(f"{name}: the replayed batch plan does not match the run's useful tokens per step")
    times = r["loop_times_s"][warmup:]
    timed = plan[warmup : warmup + len(times)]
    seconds = sum(times)
    useful_flops, computed_flops, tokens = (sum(p[k] for p in timed) for k in range(3))
    row = {
        "program": name, "useful tok/s": round(tokens / seconds, 1), "step s (mean)": round(seconds / len(times), 4), "peak GiB": r["peak_memory_gib"],
        "useful TFLOP/s": round(useful_flops / seconds / 1e12, 4), "padding %": round(100 * (1 - useful_flops / computed_flops), 1),
        "MFU %": round(100 * mfu(useful_flops / nproc, seconds, peak * 1e12), 1) if peak else "n/a",
        "HFU %": round(100 * mfu(computed_flops / nproc, seconds, peak * 1e12), 1) if peak else "n/a",
        "final loss": r["final_loss"],
    }
    saves = [e for e in run["events"] if e["event"] == "checkpoint"]
    if saves:
        row["saves"] = len(saves)
        row["first stall s"], row["stall s (median)"], row["save total s (median)"] = checkpoint_figures(saves)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--gpu", action="store_true", help="one GPU, T5-large, bf16 (default: CPU, t5-small, 2 processes)")
    ap.add_argument("--model", choices=sorted(T5_CONFIGS), help="default: t5-large on a GPU, t5-small on CPU")
    ap.add_argument("--batch", type=int, help="micro-batch per process (default: 32 on a GPU, 4 on CPU)")
    ap.add_argument("--steps", type=int, help="steps per program (default: 60 on a GPU, 12 on CPU)")
    ap.add_argument("--warmup", type=int, help="steps left out of the figures (default: 10 on a GPU, 3 on CPU)")
    ap.add_argument("--checkpoint-every", type=int, help="ours saves every N steps (default: 15 on a GPU, 4 on CPU)")
    ap.add_argument("--ours", nargs=argparse.REMAINDER, default=[], help="extra arguments for ours (last on the line)")
    ap.add_argument("--no-compile", action="store_true", help="GPU: leave out the row of ours with torch.compile per block (--compile, opt-in in the program)")
    ap.add_argument("--profile", action="store_true", help="also profile a few of our steps and print the top operators (kernels on a GPU)")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args(argv)
    gpu = args.gpu
    model = args.model or ("t5-large" if gpu else "t5-small")
    batch, steps = args.batch or (32 if gpu else 4), args.steps or (60 if gpu else 12)
    warmup, every = args.warmup if args.warmup is not None else (10 if gpu else 3), args.checkpoint_every or (15 if gpu else 4)
    if args.profile:  # the profiled steps and the trace's export stay out of the timed steps
        warmup = max(warmup, PROFILED_UNTIL)
        if steps <= warmup:
            ap.error(f"--profile needs more than {warmup} --steps")
    source_len, target_len = (512, 128) if gpu else (64, 16)
    nproc = 1 if gpu else 2
    peak, device = None, "CPU (gloo, fp32)"
    if gpu:
        import torch

        device = torch.cuda.get_device_name(0)
        peak = peak_tflops(device)
    common = {"model": model, "batch": batch, "nproc": nproc, "source_len": source_len, "target_len": target_len, "steps": steps, "warmup": warmup, "peak": peak}
    print(f"{device}; peak {peak or 'n/a'} TFLOP/s; {model}, {source_len}->{target_len} tokens, batch {batch} x {nproc} processes, {steps} steps ({warmup} warm-up); {datetime.date.today()}")
    with tempfile.TemporaryDirectory() as tmp:
        def ours(name: str, *extra: str) -> list[str]:
            return [*OURS, "--checkpoint-every", str(every), "--checkpoint-dir", f"{tmp}/{name}", *extra, *args.ours]

        rows = [measure("ours", ours("ours", *(["--trace-dir", f"{tmp}/profile"] if args.profile else [])), **common)]
        if args.profile:
            print(open(f"{tmp}/profile/top_ops.txt").read())
        if gpu and not args.no_compile:
            rows.append(measure("ours + torch.compile", ours("ours-compiled", "--compile"), **common))
        rows.append(measure("workshop", WORKSHOP + ["--checkpoint-every", "100000", "--checkpoint-dir", f"{tmp}/workshop"], **common))
    *ours_rows, workshop_row = rows
    # (the rows' final loss stays in --json only: the workshop's counts pad targets, which are easy
    # to predict, so the two losses are not comparable)
    print(table(rows, ["program", "useful tok/s", "step s (mean)", "MFU %", "HFU %", "useful TFLOP/s", "padding %", "peak GiB"]))
    for row in ours_rows:
        print(f"{row['program']} / workshop: useful tokens/s {row['useful tok/s'] / workshop_row['useful tok/s']:.2f}x" + (f", MFU {row['MFU %']} % vs {workshop_row['MFU %']} %" if peak else ""))
    ours_row = ours_rows[0]
    if "saves" in ours_row:
        print(
            f"checkpoints (ours, every {every} steps, {ours_row['saves']} saves): stall {ours_row['stall s (median)']} s median "
            f"(first save {ours_row['first stall s']} s, host buffers allocated), total save {ours_row['save total s (median)']} s median"
        )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": device, "model": model, "batch": batch, "rows": rows}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
