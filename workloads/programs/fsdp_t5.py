"""T5 sequence-to-sequence fine-tuning with FSDP2 under torchrun.

The model is the platform's own T5 (``t5_model.py``, ``--impl native``: the same model and weights
as Hugging Face's, with fused projections and one attention mask per stack) or Hugging Face's
``T5ForConditionalGeneration`` (``--impl hf``). ``fully_shard`` per transformer block, then the root; bf16 mixed precision on GPU (fp32 gradient
reduction); optional activation checkpointing; pad tokens masked out of the loss (-100), the loss
computed in fp32; gradient accumulation. The model (config, safetensors weights, tokenizer) and the
dataset are read from local directories, ``--model-dir`` and ``--dataset-dir``: on the cluster the
Trainer's model and dataset initializers downloaded them there before this job started, so the
program never contacts the hub. The dataset is the split's parquet or JSON lines files
(``<split>-*.parquet`` as the hub's parquet layout names them, e.g. billsum's
``data/train-00000-of-00001.parquet``) with a text and a summary column. ``--init random`` builds
the model from a known config (``--model-config tiny`` for tests); ``--synthetic`` trains on
generated token sequences with no data at all (benchmarks).

Batches (``--padding bucketed``, the default): each run of ``--bucket-window`` global batches is
sorted by length, so samples of similar lengths train together and each batch is cut to its longest
sample (rounded up to ``--pad-multiple``); little of a step is spent on padding, which does no
useful work. The batch order is a function of the seed and the epoch (at a given world size and
batch size), the same on every rank.

Sharded checkpoints with ``torch.distributed.checkpoint``; on start the newest complete one is
restored. By default a save is asynchronous (``--checkpoint-mode async``): the state is copied to
host buffers that are reused from save to save (page-locked on a GPU) while the next step
computes, the loop waits for that copy only before its optimizer step, the files are written in the
background, and the checkpoint is marked complete only once they are; ``--checkpoint-mode sync``
writes in the loop.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import time
from typing import Any

import checkpoints
import t5_model
import torch
import torch.nn.functional as F
import trainlib
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load  # torch.distributed.checkpoint.load
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save  # torch.distributed.checkpoint.async_save
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save  # torch.distributed.checkpoint.save
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.utils.data import TensorDataset

# Architectures known without a download (public T5 v1.0 hyper-parameters) and a tiny one.
T5_CONFIGS: dict[str, dict[str, Any]] = {
    "tiny": {"d_model": 64, "d_ff": 128, "num_layers": 2, "num_decoder_layers": 2, "num_heads": 4, "d_kv": 16, "vocab_size": 512},
    "t5-small": {"d_model": 512, "d_ff": 2048, "num_layers": 6, "num_decoder_layers": 6, "num_heads": 8, "d_kv": 64, "vocab_size": 32128},
    "t5-base": {"d_model": 768, "d_ff": 3072, "num_layers": 12, "num_decoder_layers": 12, "num_heads": 12, "d_kv": 64, "vocab_size": 32128},
    "t5-large": {"d_model": 1024, "d_ff": 4096, "num_layers": 24, "num_decoder_layers": 24, "num_heads": 16, "d_kv": 64, "vocab_size": 32128},
}
PAD_ID = 0
IGNORE = -100
LEGACY = "hf-legacy"  # what a checkpoint without "impl" in its meta.json holds


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    p.add_argument("--model", default="google-t5/t5-large", help="hub model id (names the architecture for --init random)")
    p.add_argument("--model-dir", help="directory of the model (config, safetensors weights, tokenizer) the model initializer downloaded")
    p.add_argument("--dataset-dir", help="directory of the dataset the dataset initializer downloaded (parquet or JSON lines files)")
    p.add_argument("--split", default="train", help="dataset split: files named <split>-*.parquet|jsonl or <split>.parquet|jsonl")
    p.add_argument("--text-column", default="text")
    p.add_argument("--summary-column", default="summary")
    p.add_argument("--source-prefix", default="summarize: ", help="T5's task prefix for the source text")
    p.add_argument("--max-samples", type=int, default=0, help="use only the first N rows (0 = all)")
    p.add_argument("--init", choices=("pretrained", "random"), default="pretrained", help="pretrained: the weights in --model-dir")
    p.add_argument("--model-config", choices=sorted(T5_CONFIGS), default=None, help="architecture for --init random (default: from --model)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=8, help="micro-batch per process")
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--source-len", type=int, default=512)
    p.add_argument("--target-len", type=int, default=128)
    p.add_argument("--synthetic", action="store_true", help="generated token sequences instead of the dataset")
    p.add_argument("--synthetic-samples", type=int, default=1024)
    p.add_argument("--checkpoint-dir", default="/mnt/checkpoints/fsdp-t5")
    p.add_argument("--checkpoint-every", type=int, default=100)
    p.add_argument("--checkpoint-mode", choices=("sync", "async"), default="async", help="async: copy to host memory, write in the background")
    p.add_argument("--max-steps", type=int, default=0)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument("--precision", choices=("auto", "bf16", "fp32"), default="auto", help="auto: bf16 on GPU, fp32 on CPU")
    p.add_argument("--wrap", choices=("per-block", "root"), default="per-block", help="FSDP units: each transformer block, or the whole model as one")
    p.add_argument("--no-mask-pad", action="store_true", help="count pad tokens in the loss (for comparisons only)")
    p.add_argument("--compile", action="store_true", help="torch.compile each block")
    p.add_argument(
        "--impl", choices=("native", "hf"), default="native",
        help="native: this platform's T5 (t5_model.py: fused projections, one attention mask per stack), the same model and weights as hf: Hugging Face's T5ForConditionalGeneration",
    )
    p.add_argument("--attention", choices=("sdpa", "flex"), default="sdpa", help="native: scaled_dot_product_attention, or FlexAttention with the position bias as a score modification (GPU only)")
    p.add_argument("--dropout", type=float, default=None, help="dropout rate (default: the model config's, 0.1 for T5)")
    p.add_argument(
        "--padding", choices=("bucketed", "full"), default="bucketed",
        help="bucketed: samples of similar length batched together and each batch cut to its longest sample; full: every batch at --source-len/--target-len",
    )
    p.add_argument("--bucket-window", type=int, default=64, help="bucketed: global batches whose samples are sorted by length together")
    p.add_argument("--pad-multiple", type=int, default=16, help="bucketed: batch lengths rounded up to a multiple of this (fewer distinct shapes)")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--trace-dir", help="profile --trace-steps steps after warm-up with torch.profiler; rank 0 writes a Chrome trace here and prints the top operators (kernels on a GPU)")
    p.add_argument("--trace-steps", type=int, default=3)
    p.add_argument(
        "--report-step-times", action="store_true",
        help="list every step's loop time (compute, checkpoint stall included) and rank 0's useful tokens per step in the result event (benchmarks)",
    )
    return p


def parse_args(argv=None):
    p = build_parser()
    args = trainlib.parse_args(p, argv)
    for name in ("epochs", "batch_size", "grad_accum", "checkpoint_every", "source_len", "target_len", "bucket_window", "pad_multiple"):
        if getattr(args, name) < 1:
            trainlib.usage_error(p, f"--{name.replace('_', '-')} must be >= 1")
    if args.model_config is None:
        args.model_config = args.model.rsplit("/", 1)[-1]
    if args.init == "random" and args.model_config not in T5_CONFIGS:
        trainlib.usage_error(p, f"--init random needs --model-config, one of {', '.join(sorted(T5_CONFIGS))}")
    if args.init == "pretrained" and not args.model_dir:
        trainlib.usage_error(p, "--init pretrained needs --model-dir (the model initializer's directory)")
    if args.dropout is not None and not 0.0 <= args.dropout < 1.0:
        trainlib.usage_error(p, f"--dropout must be in [0, 1), not {args.dropout}")
    if args.attention == "flex" and args.impl != "native":
        trainlib.usage_error(p, "--attention flex needs --impl native")
    if args.attention == "flex" and args.dropout != 0.0:
        # flex_attention has no dropout on the attention probabilities: it would train another model
        trainlib.usage_error(p, "--attention flex applies no attention dropout: pass --dropout 0")
    if not args.synthetic and not (args.dataset_dir and args.model_dir):
        trainlib.usage_error(p, "training on a dataset needs --dataset-dir and --model-dir (its tokenizer); or pass --synthetic")
    return args


def build_model(args, d: trainlib.Dist):
    """The model in training mode (dropout on, at --dropout or the config's rate), on the host."""
    if args.impl == "native":
        if args.init == "random":
            settings = t5_model.T5Settings(**T5_CONFIGS[args.model_config], pad_token_id=PAD_ID, decoder_start_token_id=PAD_ID, eos_token_id=1)
            model = t5_model.T5Model(settings, attention=args.attention)
            t5_model.init_weights(model, seed=args.seed)  # identical initial weights on every rank
        else:
            _require_dir(args.model_dir, "model")
            model = t5_model.from_pretrained(args.model_dir, attention=args.attention)
        if args.dropout is not None:
            model.set_dropout(args.dropout)
        return model.train()
    from transformers import T5Config, T5ForConditionalGeneration

    # the config's dropout_rate reaches every dropout, the attention probabilities' included
    override = {} if args.dropout is None else {"dropout_rate": args.dropout}
    if args.init == "random":
        torch.manual_seed(args.seed)  # identical initial weights on every rank
        # decoder_start_token_id is no T5Config field; the strict dataclass keeps extra kwargs, its typed __init__ omits them
        config = T5Config(**T5_CONFIGS[args.model_config], decoder_start_token_id=PAD_ID, pad_token_id=PAD_ID, eos_token_id=1, **override)  # pyright: ignore[reportCallIssue]
        model = T5ForConditionalGeneration(config)
    else:
        _require_dir(args.model_dir, "model")
        model = T5ForConditionalGeneration.from_pretrained(args.model_dir, **override)
    return model.train()  # from_pretrained returns the model in eval mode


def vocab_size(model) -> int:
    return model.settings.vocab_size if isinstance(model, t5_model.T5Model) else model.config.vocab_size


def block_lists(model) -> tuple[torch.nn.ModuleList, torch.nn.ModuleList]:
    """The encoder's and the decoder's transformer blocks: the units sharded (and compiled) one by one."""
    if isinstance(model, t5_model.T5Model):
        return model.encoder.blocks, model.decoder.blocks
    return model.encoder.block, model.decoder.block


def _require_dir(path: str, what: str) -> None:
    if not os.path.isdir(path) or not os.listdir(path):
        trainlib.fail_config(f"{what} directory {path} is missing or empty (the {what} initializer writes it before the job starts)")


def split_files(dataset_dir: str, split: str) -> list[str]:
    """The split's data files under ``dataset_dir``, sorted: ``<split>-*`` shards or ``<split>.*``,
    parquet or JSON lines."""
    found = []
    for root, dirs, files in os.walk(dataset_dir):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))  # the hub client's .cache
        for name in files:
            if any(fnmatch.fnmatch(name, pat) for ext in ("parquet", "jsonl") for pat in (f"{split}-*.{ext}", f"{split}.{ext}")):
                found.append(os.path.join(root, name))
    return sorted(found)


def read_rows(path: str, columns: tuple[str, str]) -> list[tuple[str, str]]:
    """(text, summary) pairs of one parquet or JSON lines file."""
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        names = pq.read_schema(path).names
        missing = [c for c in columns if c not in names]
        if missing:
            trainlib.fail_config(f"{path}: no column {', '.join(missing)} (it has {', '.join(names)})")
        table = pq.read_table(path, columns=list(columns)).to_pydict()
        return list(zip(table[columns[0]], table[columns[1]], strict=True))
    rows = []
    with open(path) as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            if not all(c in row for c in columns):
                trainlib.fail_config(f"{path}:{n}: needs the keys {', '.join(columns)}")
            rows.append((row[columns[0]], row[columns[1]]))
    return rows


def synthetic_dataset(args, vocab: int) -> TensorDataset:
    """Variable-length sequences; the target is the reversed source (learnable), padded."""
    g = torch.Generator().manual_seed(args.seed)
    n = args.synthetic_samples
    src = torch.randint(2, vocab, (n, args.source_len), generator=g)
    src_len = torch.randint(max(2, args.source_len // 4), args.source_len + 1, (n,), generator=g)
    tgt_len = torch.minimum(src_len, torch.randint(max(2, args.target_len // 4), args.target_len + 1, (n,), generator=g))
    pos_s = torch.arange(args.source_len)
    src = torch.where(pos_s[None, :] < src_len[:, None], src, PAD_ID)
    tgt = torch.full((n, args.target_len), PAD_ID)
    for i in range(n):
        rev = src[i, : src_len[i]].flip(0)[: tgt_len[i] - 1]
        tgt[i, : len(rev)] = rev
        tgt[i, len(rev)] = 1  # eos
    mask = (pos_s[None, :] < src_len[:, None]).long()
    return TensorDataset(src, mask, tgt)


def text_dataset(args, vocab: int) -> TensorDataset:
    """The split's (text, summary) rows tokenized with the model's tokenizer; rows with an empty
    text or summary are dropped. Every rank reads the same files in the same order."""
    from transformers import AutoTokenizer

    _require_dir(args.dataset_dir, "dataset")
    _require_dir(args.model_dir, "model")
    files = split_files(args.dataset_dir, args.split)
    if not files:
        trainlib.fail_config(f"no {args.split}-*.parquet / {args.split}-*.jsonl files under {args.dataset_dir}")
    rows = [r for f in files for r in read_rows(f, (args.text_column, args.summary_column)) if r[0] and r[1]]
    if args.max_samples:
        rows = rows[: args.max_samples]
    if not rows:
        trainlib.fail_config(f"{args.dataset_dir}: no rows with a {args.text_column} and a {args.summary_column}")
    tok = AutoTokenizer.from_pretrained(args.model_dir)
    if len(tok) > vocab:
        trainlib.fail_config(f"the tokenizer in {args.model_dir} has {len(tok)} tokens, the model {vocab}")
    if tok.pad_token_id != PAD_ID:
        trainlib.fail_config(f"the tokenizer's pad token id is {tok.pad_token_id}; T5 pads with {PAD_ID}")
    enc = tok([args.source_prefix + r[0] for r in rows], max_length=args.source_len, padding="max_length", truncation=True, return_tensors="pt")
    dec = tok([r[1] for r in rows], max_length=args.target_len, padding="max_length", truncation=True, return_tensors="pt")
    return TensorDataset(enc["input_ids"], enc["attention_mask"], dec["input_ids"])


def shard(model, args, d: trainlib.Dist, bf16: bool):
    mesh = init_device_mesh(d.device.type, (d.world_size,))
    mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()  # the latter is fully_shard's default
    if args.activation_checkpointing and isinstance(model, t5_model.T5Model):
        model.activation_checkpointing = True  # each block recomputed in backward (non-reentrant checkpoint)
    elif args.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if args.wrap == "per-block":
        for stack in block_lists(model):
            for i, block in enumerate(stack):
                if args.compile:
                    block = torch.compile(block)
                    assert isinstance(block, torch.nn.Module)  # a compiled module is an OptimizedModule
                    stack[i] = block
                fully_shard(block, mesh=mesh, mp_policy=mp_policy)
    fully_shard(model, mesh=mesh, mp_policy=mp_policy)
    return model


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), labels.view(-1), ignore_index=IGNORE)


class Profiler:
    """torch.profiler over a few steps after warm-up: rank 0 writes a Chrome trace and prints the
    operators (kernels, on a GPU) that took the most time, so what holds MFU down is measured."""

    WARMUP = 5

    def __init__(self, out_dir: str, steps: int, d: trainlib.Dist):
        self.out_dir, self.steps, self.d = out_dir, steps, d
        self.prof: torch.profiler.profile | None = None
        self.done = False

    def at_step(self, index: int) -> None:
        if self.prof is None and not self.done and index == self.WARMUP:
            activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if self.d.device.type == "cuda" else [])
            self.prof = torch.profiler.profile(activities=activities)
            self.prof.__enter__()
        elif self.prof is not None and index == self.WARMUP + self.steps:
            self.stop()

    def stop(self) -> None:
        if self.prof is None:
            return
        prof, self.prof, self.done = self.prof, None, True
        prof.__exit__(None, None, None)
        if self.d.is_main:
            os.makedirs(self.out_dir, exist_ok=True)
            prof.export_chrome_trace(os.path.join(self.out_dir, "trace.json"))
            key = "self_device_time_total" if self.d.device.type == "cuda" else "self_cpu_time_total"
            table = prof.key_averages().table(sort_by=key, row_limit=20)
            with open(os.path.join(self.out_dir, "top_ops.txt"), "w") as fh:
                fh.write(table)
            print(f"profile of {self.steps} steps (sorted by {key}):\n{table}", flush=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    d = trainlib.setup()
    cuda = d.device.type == "cuda"
    bf16 = args.precision == "bf16" or (args.precision == "auto" and cuda)
    if args.attention == "flex" and not cuda:
        trainlib.fail_config("--attention flex trains only on a GPU (torch's FlexAttention has no backward on CPU); use --attention sdpa")
    # the two implementations name and fuse their weights differently: a job resumes with the one
    # its checkpoint holds, decided on rank 0 for every rank (all must build the same model)
    found = checkpoints.latest_checkpoint(args.checkpoint_dir) if d.is_main else None
    written_by = trainlib.broadcast_object((found[1].get("impl", LEGACY) if found else args.impl), d)
    if written_by != args.impl:
        trainlib.log(d, f"fsdp-t5: the newest checkpoint holds the {written_by} T5; continuing with it")
        if written_by == LEGACY:
            # the release before --impl: Hugging Face's T5, and a pretrained model trained as
            # from_pretrained returned it, in eval mode (no dropout); the rest of the epoch follows
            # this release's batch plan
            args.dropout = 0.0 if args.init == "pretrained" and args.dropout is None else args.dropout
        args.impl = "hf" if written_by == LEGACY else written_by
        args.attention = "sdpa" if args.impl == "hf" else args.attention
    checkpoint_impl = written_by  # what this run's checkpoints say they hold (a legacy run stays legacy)
    model = build_model(args, d)
    dataset = synthetic_dataset(args, vocab_size(model)) if args.synthetic else text_dataset(args, vocab_size(model))
    model.to(d.device)  # pyright: ignore[reportArgumentType]  # transformers wraps Module.to with functools.wraps, which pyright does not bind as a method
    model = shard(model, args, d, bf16)
    assert isinstance(model, FSDPModule)  # fully_shard swapped in an FSDP subclass of the model's class
    # fused AdamW on GPU: one kernel per parameter group instead of a handful per tensor
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, fused=cuda)

    src_all, mask_all, tgt_all = dataset.tensors
    lengths = list(zip(mask_all.sum(1).tolist(), (tgt_all != PAD_ID).sum(1).tolist(), strict=True))  # useful tokens (right-padded)
    global_batch = args.batch_size * d.world_size
    steps_per_epoch = len(dataset) // global_batch // args.grad_accum
    if steps_per_epoch == 0:
        trainlib.fail_config(f"{len(dataset)} samples are fewer than one step ({args.batch_size} x {args.grad_accum} x {d.world_size})")
    total_steps = args.epochs * steps_per_epoch
    if args.max_steps:
        total_steps = min(total_steps, args.max_steps)
    bucket_window = args.bucket_window if args.padding == "bucketed" else 0

    def micro_batch(indices: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """This rank's slice of a global batch on the device; every rank cuts the batch to the same
        lengths, so their steps take the same time."""
        s_len, t_len = args.source_len, args.target_len
        if bucket_window:
            s_len = trainlib.padded_length(max(lengths[i][0] for i in indices), args.pad_multiple, args.source_len)
            t_len = trainlib.padded_length(max(lengths[i][1] for i in indices), args.pad_multiple, args.target_len)
        mine = torch.tensor(indices[d.rank * args.batch_size : (d.rank + 1) * args.batch_size])
        host = (src_all[mine, :s_len], mask_all[mine, :s_len], tgt_all[mine, :t_len])
        # from page-locked memory the copy to the GPU is asynchronous: the host goes on launching
        return tuple(t.pin_memory().to(d.device, non_blocking=True) if cuda else t for t in host)  # pyright: ignore[reportReturnType]

    def load(path: str) -> None:
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd}
        dcp_load(state, checkpoint_id=path)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])

    step, resumed_from, last_loss = checkpoints.resume(d, args.checkpoint_dir, load)
    writer = checkpoints.CheckpointWriter(d, args.checkpoint_dir, asynchronous=args.checkpoint_mode == "async")
    progress = trainlib.Progress(step, total_steps)

    # one stager for the whole run: its host copy of the state (page-locked on a GPU, so the copy
    # runs at full PCIe speed on a stream of its own) is allocated at the first save and reused
    # (torch.distributed.checkpoint.staging.DefaultStager caches staged storages per source
    # storage); the copy runs in its thread while the next step computes, and the loop waits for
    # it only before the optimizer step changes the state
    stager = DefaultStager(StagingOptions(use_pinned_memory=cuda, use_shared_memory=False, use_async_staging=True, use_non_blocking_copy=cuda)) if args.checkpoint_mode == "async" else None

    def save(at_step: int) -> None:
        def write(tmp):
            if cuda:
                # the stager copies on a stream of its own, which does not wait for this one: the
                # optimizer step's kernels must have finished writing the state first
                torch.cuda.current_stream(d.device).synchronize()
            msd, osd = get_state_dict(model, opt)
            if stager is None:
                dcp_save({"model": msd, "optim": osd}, checkpoint_id=tmp)
                return None
            # the write runs in a thread, on the writer's own gloo group, once the stager's copy is taken
            pending = dcp_async_save({"model": msd, "optim": osd}, checkpoint_id=tmp, process_group=writer.group, async_stager=stager)
            return (pending.staging_completion, pending.upload_completion) if isinstance(pending, AsyncSaveResponse) else pending

        writer.save(at_step, {"epoch": at_step // steps_per_epoch, "micro_batch_in_epoch": (at_step % steps_per_epoch) * args.grad_accum, "world_size": d.world_size, "loss": last_loss, "impl": checkpoint_impl}, write)

    if cuda:
        torch.cuda.reset_peak_memory_stats(d.device)
    # loss sum over micro-batches, micro-batches, useful tokens: kept on the device so the step
    # never waits for the GPU except where it is timed; tokens computed (padding included) are
    # known on the host (a tensor made from a host value would be a blocking copy per micro-batch)
    window = torch.zeros(3, dtype=torch.float64, device=d.device)
    computed_window = 0.0
    step_times: list[float] = []  # forward, backward and optimizer step
    loop_times: list[float] = []  # the whole iteration: checkpoint saves and waits included
    step_tokens: list[int] = []  # --report-step-times: this rank's useful tokens per step
    tokens_total = computed_total = 0.0
    profiler = Profiler(args.trace_dir, args.trace_steps, d) if args.trace_dir else None
    t_train = time.perf_counter()
    while step < total_steps:
        epoch, offset = divmod(step, steps_per_epoch)
        batches = trainlib.epoch_batches(lengths, global_batch=global_batch, seed=args.seed, epoch=epoch, bucket_window=bucket_window, granularity=args.pad_multiple)
        for step_in_epoch in range(offset, steps_per_epoch):  # a resumed job starts at the exact next micro-batch
            t0 = time.perf_counter()
            if profiler:
                profiler.at_step(len(step_times))
            trainlib.seed_step(args.seed, step, d.rank)
            for micro in range(args.grad_accum):
                src, mask, tgt = micro_batch(batches[step_in_epoch * args.grad_accum + micro])
                labels = tgt if args.no_mask_pad else tgt.masked_fill(tgt == PAD_ID, IGNORE)
                model.set_requires_gradient_sync(micro == args.grad_accum - 1)
                out = model(input_ids=src, attention_mask=mask, labels=labels)
                logits = out if isinstance(out, torch.Tensor) else out.logits
                loss = loss_fn(logits, labels) / args.grad_accum
                loss.backward()
                window += torch.stack([loss.detach().double() * args.grad_accum, torch.ones((), dtype=torch.float64, device=d.device), (mask.sum() + (tgt != PAD_ID).sum()).double()])
                computed_window += src.numel() + tgt.numel()
            if args.report_step_times:  # this rank's useful tokens, from the plan (no device sync)
                mine = [i for m in range(args.grad_accum) for i in batches[step_in_epoch * args.grad_accum + m][d.rank * args.batch_size : (d.rank + 1) * args.batch_size]]
                step_tokens.append(sum(lengths[i][0] + lengths[i][1] for i in mine))
            writer.wait_staged()  # a save's copy of the state must be taken before the step changes it
            opt.step()
            opt.zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.synchronize(d.device)
            step_times.append(time.perf_counter() - t0)
            step += 1
            trainlib.fault_point(step)
            progress.step_done(step)
            writer.poll()
            if step % args.log_every == 0 or step % args.checkpoint_every == 0 or step == total_steps or step % steps_per_epoch == 0:
                loss_sum, micro_batches, tokens, computed = trainlib.all_reduce_sum([*window.tolist(), computed_window], d.device)
                last_loss = loss_sum / max(micro_batches, 1)
                tokens_total += tokens
                computed_total += computed
                trainlib.event(d, "step", step=step, epoch=epoch, loss=round(last_loss, 6), **progress.fields(step))
                logged = max(1, round(micro_batches / (args.grad_accum * d.world_size)))  # steps since the last line
                window_s = sum(step_times[-logged:])
                trainlib.metric(
                    d, "step", step=step, epoch=epoch, loss=round(last_loss, 6), tokens_per_s=round(tokens / max(window_s, 1e-9), 1),
                    step_time_s=round(window_s / logged, 5), memory_gib=round(trainlib.memory_gib(d), 3),
                )
                window.zero_()
                computed_window = 0.0
            if step % args.checkpoint_every == 0 or step % steps_per_epoch == 0:
                save(step)
            if trainlib.preempted(d, step):  # SIGTERM: this step saved, then out, retryably
                save(step)
                writer.close()
                if stager is not None:
                    stager.close()
                trainlib.exit_preempted(d, step)
            loop_times.append(time.perf_counter() - t0)
            if step >= total_steps:
                break
    if profiler:
        profiler.stop()
    writer.close()  # the last checkpoint is complete before the job reports success
    if stager is not None:
        stager.close()
    elapsed = trainlib.all_reduce_max(time.perf_counter() - t_train, d.device)
    peak = trainlib.all_reduce_max(trainlib.memory_gib(d), d.device)
    warm = sorted(step_times[3:] if len(step_times) >= 6 else step_times[1:] or step_times)
    step_time = trainlib.all_reduce_max(warm[len(warm) // 2] if warm else 0.0, d.device)  # median after warm-up
    trainlib.log(d, f"fsdp-t5: steps={step} loss={last_loss:.4f} tokens/s={tokens_total / max(elapsed, 1e-9):.1f} step_time_s={step_time:.4f} peak_memory_gib={peak:.2f}")
    trainlib.event(
        d, "result", final_step=step, final_loss=round(last_loss, 6), resumed_from_step=resumed_from,
        tokens_per_s=round(tokens_total / max(elapsed, 1e-9), 1), step_time_s=round(step_time, 5), peak_memory_gib=round(peak, 3),
        world_size=d.world_size, precision="bf16" if bf16 else "fp32", useful_tokens=tokens_total, useful_fraction=round(tokens_total / max(computed_total, 1.0), 4),
        **({"loop_times_s": [round(t, 5) for t in loop_times], "rank0_step_tokens": step_tokens, "first_step": step - len(loop_times)} if args.report_step_times else {}),
    )
    trainlib.metric(
        d, "result", step=step, loss=round(last_loss, 6), tokens_per_s=round(tokens_total / max(elapsed, 1e-9), 1), step_time_s=round(step_time, 5), memory_gib=round(peak, 3)
    )
    trainlib.finish()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
