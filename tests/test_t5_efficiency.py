"""What the FSDP T5 program does for speed, checked on CPU: length-bucketed batches (every sample
once, the same plan on every rank and after a restart, little padding), the asynchronous staging
of checkpoints (the loop blocks only until the host copy is taken), the profiler hook, and the
per-step figures the efficiency benchmark reads."""

from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import Future

import pytest
import torch

from bench.common import run_program
from workloads.builders.trainjobs import PROGRAMS_DIR

sys.path.insert(0, str(PROGRAMS_DIR))  # the programs import trainlib by name, as in the image
import checkpoints  # noqa: E402
import trainlib  # noqa: E402


def _lengths(n: int, seed: int = 0) -> list[tuple[int, int]]:
    g = torch.Generator().manual_seed(seed)
    return list(zip(torch.randint(16, 513, (n,), generator=g).tolist(), torch.randint(4, 129, (n,), generator=g).tolist(), strict=True))


@pytest.mark.parametrize("window", [0, 4, 64])
def test_epoch_plan_uses_every_sample_at_most_once_and_depends_only_on_seed_and_epoch(window):
    lengths = _lengths(1003)
    plan = trainlib.epoch_batches(lengths, global_batch=16, seed=7, epoch=2, bucket_window=window)
    assert len(plan) == 1003 // 16 and all(len(b) == 16 for b in plan)  # the tail that fills no batch is dropped
    flat = [i for b in plan for i in b]
    assert len(set(flat)) == len(flat) and set(flat) <= set(range(1003))
    assert plan == trainlib.epoch_batches(lengths, global_batch=16, seed=7, epoch=2, bucket_window=window)  # every rank, every restart
    assert plan != trainlib.epoch_batches(lengths, global_batch=16, seed=7, epoch=3, bucket_window=window)
    assert plan != trainlib.epoch_batches(lengths, global_batch=16, seed=8, epoch=2, bucket_window=window)


def _computed_over_useful(plan: list[list[int]], lengths: list[tuple[int, int]], multiple: int) -> float:
    computed = sum(len(b) * (trainlib.padded_length(max(lengths[i][0] for i in b), multiple, 512) + trainlib.padded_length(max(lengths[i][1] for i in b), multiple, 128)) for b in plan)
    useful = sum(lengths[i][0] + lengths[i][1] for b in plan for i in b)
    return computed / useful


def test_bucketing_cuts_the_padding_a_step_computes():
    lengths = _lengths(4096)
    full = sum(512 + 128 for _ in range(4096 // 32 * 32)) / sum(s + t for b in trainlib.epoch_batches(lengths, global_batch=32, seed=1, epoch=0) for s, t in (lengths[i] for i in b))
    unsorted = _computed_over_useful(trainlib.epoch_batches(lengths, global_batch=32, seed=1, epoch=0), lengths, 64)
    bucketed = _computed_over_useful(trainlib.epoch_batches(lengths, global_batch=32, seed=1, epoch=0, bucket_window=64, granularity=16), lengths, 16)
    by_source_only = _computed_over_useful(trainlib.epoch_batches(lengths, global_batch=32, seed=1, epoch=0, bucket_window=64), lengths, 16)
    assert full > 1.8  # uniform lengths: about half of a full-length batch is padding
    assert unsorted > 1.4  # cutting a random batch to its longest sample saves little
    # sorted windows: under 20 % of the computed tokens are padding, most of it in the targets,
    # whose lengths here do not follow the sources' (a window holds about two batches per source
    # length); sources that round alike are ordered by their targets, which saves a fifth of it
    assert bucketed < 1.2
    assert bucketed < by_source_only - 0.04
    # the window keeps batches random: the same batch plan never comes twice, nor in length order
    plan = trainlib.epoch_batches(lengths, global_batch=32, seed=1, epoch=0, bucket_window=64)
    firsts = [lengths[b[0]][0] for b in plan[:20]]
    assert firsts != sorted(firsts, reverse=True)


@pytest.mark.parametrize(("longest", "multiple", "cap", "expected"), [(1, 64, 512, 64), (64, 64, 512, 64), (65, 64, 512, 128), (500, 64, 512, 512), (511, 64, 500, 500), (0, 8, 16, 8)])
def test_batch_length_is_the_longest_sample_rounded_up_and_capped(longest, multiple, cap, expected):
    assert trainlib.padded_length(longest, multiple, cap) == expected


class _Solo:
    """A single-process Dist without a process group."""

    rank, world_size, local_rank, device, is_main, is_local_main = 0, 1, 0, torch.device("cpu"), True, True


def test_staged_save_blocks_the_loop_only_until_the_host_copy_is_taken(tmp_path, capsys):
    writer = checkpoints.CheckpointWriter(_Solo(), str(tmp_path), asynchronous=True)  # pyright: ignore[reportArgumentType]
    staged: Future = Future()
    written: Future = Future()
    writer.save(5, {"epoch": 0, "world_size": 1, "loss": 1.0}, lambda tmp: (staged, written))
    assert not staged.done() and not written.done()  # save returned while both still run
    threading.Timer(0.3, staged.set_result, args=(None,)).start()
    t1 = time.perf_counter()
    writer.wait_staged()  # the loop waits here, before its optimizer step
    assert time.perf_counter() - t1 >= 0.25
    writer.wait_staged()  # once taken, no further wait
    assert not (tmp_path / "step-00000005").exists()  # not complete before the write is
    threading.Timer(0.3, written.set_result, args=(None,)).start()
    writer.close()
    assert (tmp_path / "step-00000005" / "meta.json").is_file()
    event = next(line for line in capsys.readouterr().out.splitlines() if '"checkpoint"' in line)
    fields = __import__("json").loads(event.split(" ", 1)[1])
    # the staging wait counts as stall; the write, which ended 0.3 s later, does not
    assert 0.25 <= fields["ckpt_stall_s"] < fields["ckpt_total_s"] - 0.2


def test_a_failed_staging_fails_the_save(tmp_path):
    writer = checkpoints.CheckpointWriter(_Solo(), str(tmp_path), asynchronous=True)  # pyright: ignore[reportArgumentType]
    staged: Future = Future()
    written: Future = Future()
    writer.save(3, {"epoch": 0, "world_size": 1, "loss": 1.0}, lambda tmp: (staged, written))
    staged.set_exception(OSError("no memory to pin"))
    with pytest.raises(OSError, match="no memory to pin"):
        writer.wait_staged()
    written.set_exception(OSError("no memory to pin"))  # the upload waits for the staging (dcp async_save)
    with pytest.raises(OSError, match="no memory to pin"):
        writer.close()
    assert not (tmp_path / "step-00000003").exists()


TINY = ["--synthetic", "--init", "random", "--model-config", "tiny", "--batch-size", "4", "--source-len", "64", "--target-len", "16", "--synthetic-samples", "128", "--epochs", "1", "--max-steps", "8", "--log-every", "4"]


@pytest.mark.slow
def test_bucketed_run_computes_less_padding_and_reports_its_loop_times(tmp_path):
    bucketed = run_program("fsdp_t5.py", [*TINY, "--pad-multiple", "8", "--checkpoint-every", "4", "--report-step-times", "--trace-dir", str(tmp_path / "prof"), "--trace-steps", "2"], nproc=2)
    padded = run_program("fsdp_t5.py", [*TINY, "--padding", "full", "--checkpoint-every", "100"], nproc=2)
    b, p = bucketed["result"], padded["result"]
    # the synthetic sources are 16-64 tokens: a full-length batch is about 40 % padding
    assert p["useful_fraction"] < 0.7 and b["useful_fraction"] > 0.8
    assert b["first_step"] == 0 and len(b["loop_times_s"]) == len(b["rank0_step_tokens"]) == 8
    assert "loop_times_s" not in p
    # rank 0's useful tokens per step: its share of the job's
    assert 0 < sum(b["rank0_step_tokens"]) < b["useful_tokens"]
    top = (tmp_path / "prof" / "top_ops.txt").read_text()
    assert "aten::mm" in top or "aten::addmm" in top  # the profile names the operators
    assert (tmp_path / "prof" / "trace.json").stat().st_size > 1000


# fsdp_t5.py's options before the efficiency flags: a stack's extraArgs may abbreviate any of them
# (argparse accepts a unique prefix), so a new option must not make such a prefix ambiguous
EARLIER_OPTIONS = (
    "--model --model-dir --dataset-dir --split --text-column --summary-column --source-prefix --max-samples --init --model-config --epochs --batch-size "
    "--grad-accum --lr --source-len --target-len --synthetic --synthetic-samples --checkpoint-dir --checkpoint-every --checkpoint-mode --max-steps --seed "
    "--activation-checkpointing --precision --wrap --no-mask-pad --compile --log-every"
).split()


def test_abbreviations_of_earlier_options_still_resolve():
    """Every prefix of two letters or more that named an earlier option still names it (one-letter
    prefixes such as --p for --precision are not kept: --padding and --pad-multiple share it)."""
    import fsdp_t5

    parser_opts = [o for a in fsdp_t5.build_parser()._actions for o in a.option_strings if o.startswith("--")]
    for option in EARLIER_OPTIONS:
        for n in range(4, len(option) + 1):
            prefix = option[:n]
            if sum(o.startswith(prefix) for o in EARLIER_OPTIONS) == 1:  # resolved to this option before
                matches = [o for o in parser_opts if o.startswith(prefix)]
                assert matches == [option] or option in matches and prefix == option, (prefix, matches)


def test_compiled_blocks_keep_the_checkpoint_keys():
    """torch.compile wraps a block in an OptimizedModule (``_orig_mod``); the distributed state dict
    strips that (torch/distributed/checkpoint/state_dict.py ``_get_fqns``), so a run with --compile
    resumes from a run without it and the other way round."""
    import fsdp_t5
    import t5_model
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    def build():
        m = t5_model.T5Model(t5_model.T5Settings(**fsdp_t5.T5_CONFIGS["tiny"]))
        t5_model.init_weights(m, seed=0)
        return m

    plain, compiled = build(), build()
    for stack in fsdp_t5.block_lists(compiled):
        for i, block in enumerate(stack):
            stack[i] = torch.compile(block)  # as fsdp_t5.shard does; nothing compiles until a block runs
    assert any("_orig_mod" in k for k in compiled.state_dict())
    assert get_model_state_dict(compiled).keys() == get_model_state_dict(plain).keys()


@pytest.mark.slow
def test_a_checkpoint_of_the_hugging_face_model_resumes_with_it(tmp_path):
    """Checkpoints written before the native model (no "impl" in meta.json) hold Hugging Face's
    weight names: a restarted job continues with that implementation instead of failing to load."""
    import json

    ckpt = str(tmp_path / "ckpt")
    first = run_program("fsdp_t5.py", [*TINY, "--impl", "hf", "--max-steps", "4", "--checkpoint-every", "4", "--checkpoint-dir", ckpt], nproc=2)
    assert first["result"]["final_step"] == 4
    meta_path = tmp_path / "ckpt" / "step-00000004" / "meta.json"
    meta = json.loads(meta_path.read_text())
    assert meta["impl"] == "hf"
    del meta["impl"]  # as the previous release wrote it
    meta_path.write_text(json.dumps(meta))
    second = run_program("fsdp_t5.py", [*TINY, "--max-steps", "8", "--checkpoint-every", "4", "--checkpoint-dir", ckpt], nproc=2)  # --impl native by default
    assert second["result"]["resumed_from_step"] == 4 and second["result"]["final_step"] == 8
    # later restarts of that run keep treating it as the earlier release's (no dropout on a pretrained model)
    assert json.loads((tmp_path / "ckpt" / "step-00000008" / "meta.json").read_text())["impl"] == "hf-legacy"


@pytest.mark.slow
def test_compiled_blocks_train_like_eager_ones_and_their_checkpoint_resumes_uncompiled(tmp_path):
    """torch.compile of each native block under FSDP2 (inductor, on CPU here): the same losses as the
    eager run to rounding, and a checkpoint that an eager run resumes from."""
    compiled_dir, eager_dir = str(tmp_path / "compiled"), str(tmp_path / "eager")
    # no dropout: inductor draws its dropout masks from its own generator, not eager's
    short = [*TINY, "--max-steps", "6", "--checkpoint-every", "3", "--log-every", "3", "--dropout", "0"]
    compiled = run_program("fsdp_t5.py", [*short, "--compile", "--checkpoint-dir", compiled_dir], nproc=2)
    eager = run_program("fsdp_t5.py", [*short, "--checkpoint-dir", eager_dir], nproc=2)
    losses = [[e["loss"] for e in r["events"] if e["event"] == "step"] for r in (compiled, eager)]
    assert len(losses[0]) == 2 and losses[0] == pytest.approx(losses[1], rel=1e-3)
    resumed = run_program("fsdp_t5.py", [*TINY, "--max-steps", "8", "--checkpoint-every", "4", "--checkpoint-dir", compiled_dir], nproc=2)
    assert resumed["result"]["resumed_from_step"] == 6 and resumed["result"]["final_step"] == 8


@pytest.mark.slow
def test_native_model_trains_in_bf16_mixed_precision_as_on_a_gpu(tmp_path):
    """The GPU path's dtypes on CPU: FSDP2 bf16 parameters with fp32 reduction, the attention mask
    in the activations' dtype, the loss in fp32; it tracks the fp32 run to bf16 rounding."""
    short = [*TINY, "--max-steps", "4", "--log-every", "2", "--checkpoint-every", "100", "--dropout", "0"]
    bf16 = run_program("fsdp_t5.py", [*short, "--precision", "bf16"], nproc=2)
    fp32 = run_program("fsdp_t5.py", [*short, "--precision", "fp32"], nproc=2)
    assert bf16["result"]["precision"] == "bf16"
    losses = [[e["loss"] for e in r["events"] if e["event"] == "step"] for r in (bf16, fp32)]
    assert len(losses[0]) == 2 and losses[0] == pytest.approx(losses[1], rel=2e-2)


@pytest.mark.slow
@pytest.mark.parametrize("extra", [["--padding", "full"], ["--grad-accum", "2", "--pad-multiple", "8", "--seed", "5"]])
def test_the_efficiency_bench_replays_the_runs_own_batch_plan(extra):
    """bench.efficiency counts each step's FLOPs from the program's batch plan, replayed with the
    run's own arguments; measure() refuses a replay whose per-step tokens differ from the run's."""
    from bench import efficiency

    row = efficiency.measure("t", ["--checkpoint-every", "100", *extra], model="tiny", batch=4, nproc=2, source_len=64, target_len=16, steps=4, warmup=1, peak=1e-4)  # a peak the tiny model can show
    assert row["useful tok/s"] > 0 and 0 < row["MFU %"] < row["HFU %"]
    assert (row["padding %"] > 30) == ("full" in extra)  # full-length batches of 16-64 token sources


@pytest.mark.slow
def test_the_efficiency_bench_refuses_a_replay_that_differs_from_the_run(monkeypatch):
    from bench import efficiency

    real = trainlib.epoch_batches
    monkeypatch.setattr(efficiency.trainlib, "epoch_batches", lambda *a, **k: list(reversed(real(*a, **k))))
    with pytest.raises(RuntimeError, match="does not match"):
        efficiency.measure("t", ["--checkpoint-every", "100"], model="tiny", batch=4, nproc=2, source_len=64, target_len=16, steps=3, warmup=1, peak=None)
