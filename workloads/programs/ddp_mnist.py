"""MNIST classifier trained with DistributedDataParallel under torchrun.

NCCL on GPU, gloo on CPU, the same file. ``--synthetic`` trains on generated digits (what the
platform's DDP job does: no rank ever downloads anything); ``--data-dir`` reads the raw MNIST IDX
files from a directory where they already are (this program never downloads them). Checkpoints (model, optimizer, step, epoch, position in the epoch) go to
``--checkpoint-dir`` every ``--checkpoint-every`` steps and at each epoch end; on start the
newest complete checkpoint is restored, so a restarted job continues at the next step.
"""

from __future__ import annotations

import argparse
import gzip
import os
import struct
import time

import checkpoints
import torch
import torch.nn as nn
import torch.nn.functional as F
import trainlib
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte.gz",
    "train_labels": "train-labels-idx1-ubyte.gz",
    "test_images": "t10k-images-idx3-ubyte.gz",
    "test_labels": "t10k-labels-idx1-ubyte.gz",
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64, help="per process")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--data-dir", help="directory holding the four MNIST IDX .gz files")
    p.add_argument("--checkpoint-dir", default="/mnt/checkpoints/ddp-mnist")
    p.add_argument("--checkpoint-every", type=int, default=200, help="steps between checkpoints")
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0 = all epochs)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--synthetic", action="store_true", help="generated digits instead of MNIST files")
    p.add_argument("--synthetic-samples", type=int, default=2048)
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--num-workers", type=int, default=2)
    args = trainlib.parse_args(p, argv)
    for name in ("epochs", "batch_size", "checkpoint_every"):
        if getattr(args, name) < 1:
            trainlib.usage_error(p, f"--{name.replace('_', '-')} must be >= 1")
    if args.synthetic == bool(args.data_dir):
        trainlib.usage_error(p, "pass exactly one of --synthetic and --data-dir")
    return args


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def _read_idx(path: str) -> torch.Tensor:
    with gzip.open(path, "rb") as fh:
        data = fh.read()
    magic, count = struct.unpack(">II", data[:8])
    if magic == 2051:
        rows, cols = struct.unpack(">II", data[8:16])
        return torch.frombuffer(bytearray(data[16:]), dtype=torch.uint8).view(count, rows, cols)
    if magic == 2049:
        return torch.frombuffer(bytearray(data[8:]), dtype=torch.uint8).view(count)
    trainlib.fail_config(f"{path} is not an MNIST IDX file (magic {magic})")


def load_mnist(args) -> tuple[TensorDataset, TensorDataset]:
    if args.synthetic:
        return _synthetic(args.synthetic_samples, args.seed), _synthetic(max(256, args.synthetic_samples // 8), args.seed + 1)
    missing = [f for f in MNIST_FILES.values() if not os.path.exists(os.path.join(args.data_dir, f))]
    if missing:
        trainlib.fail_config(f"{args.data_dir} lacks {', '.join(missing)} (this program never downloads them; or pass --synthetic)")
    t = {k: _read_idx(os.path.join(args.data_dir, f)) for k, f in MNIST_FILES.items()}

    def norm(images):
        return ((images.float() / 255.0) - 0.1307).div_(0.3081).unsqueeze(1)

    return TensorDataset(norm(t["train_images"]), t["train_labels"].long()), TensorDataset(norm(t["test_images"]), t["test_labels"].long())


def _synthetic(n: int, seed: int) -> TensorDataset:
    """Learnable fake digits: class k lights up a k-dependent band of the image, plus noise."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=g)
    images = torch.randn(n, 1, 28, 28, generator=g) * 0.5
    for k in range(10):
        images[labels == k, :, 2 * k + 4 : 2 * k + 7, 4:24] += 2.0
    return TensorDataset(images, labels)


def evaluate(model, loader, d: trainlib.Dist) -> tuple[float, float]:
    model.eval()
    totals = [0.0, 0.0, 0.0]  # loss sum, correct, count
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(d.device), y.to(d.device)
            out = model(x)
            totals[0] += F.cross_entropy(out, y, reduction="sum").item()
            totals[1] += (out.argmax(1) == y).sum().item()
            totals[2] += y.numel()
    loss_sum, correct, count = trainlib.all_reduce_sum(totals, d.device)
    model.train()
    return loss_sum / max(count, 1), correct / max(count, 1)


def main(argv=None) -> int:
    args = parse_args(argv)
    d = trainlib.setup()
    train_set, test_set = load_mnist(args)
    sampler = DistributedSampler(train_set, num_replicas=d.world_size, rank=d.rank, shuffle=True, seed=args.seed, drop_last=True)
    test_sampler = DistributedSampler(test_set, num_replicas=d.world_size, rank=d.rank, shuffle=False)
    pin = d.device.type == "cuda"
    workers = args.num_workers if pin else 0
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler, drop_last=True, num_workers=workers, pin_memory=pin)
    test_loader = DataLoader(test_set, batch_size=256, sampler=test_sampler, num_workers=workers, pin_memory=pin)
    steps_per_epoch = len(train_loader)
    if steps_per_epoch == 0:
        trainlib.fail_config(f"{len(train_set)} samples are fewer than one global batch ({args.batch_size} x {d.world_size})")

    torch.manual_seed(args.seed)  # identical initial weights on every rank
    model = Net().to(d.device)
    ddp = DistributedDataParallel(model, device_ids=[d.local_rank] if pin else None) if d.world_size > 1 else model
    opt = torch.optim.Adam(ddp.parameters(), lr=args.lr)
    total_steps = args.epochs * steps_per_epoch
    if args.max_steps:
        total_steps = min(total_steps, args.max_steps)

    def load(path: str) -> None:
        state = torch.load(os.path.join(path, "state.pt"), map_location=d.device, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])

    step, resumed_from, last_loss = checkpoints.resume(d, args.checkpoint_dir, load)
    writer = checkpoints.CheckpointWriter(d, args.checkpoint_dir)
    progress = trainlib.Progress(step, total_steps)

    def save(at_step: int) -> None:
        def write(tmp):
            if d.is_main:
                state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
                torch.save(state, os.path.join(tmp, "state.pt"))

        meta = {"epoch": at_step // steps_per_epoch, "batch_in_epoch": at_step % steps_per_epoch, "steps_per_epoch": steps_per_epoch, "world_size": d.world_size, "loss": last_loss}
        writer.save(at_step, meta, write)

    window = [0.0, 0.0, 0.0]  # loss sum, samples, seconds
    t_start = time.perf_counter()
    while step < total_steps:
        epoch, offset = divmod(step, steps_per_epoch)
        sampler.set_epoch(epoch)  # the epoch's order depends only on (seed, epoch)
        t0 = time.perf_counter()
        for i, (x, y) in enumerate(train_loader):
            if i < offset:  # resume mid-epoch at the exact next batch
                continue
            trainlib.seed_step(args.seed, step, d.rank)
            x, y = x.to(d.device, non_blocking=True), y.to(d.device, non_blocking=True)
            loss = F.cross_entropy(ddp(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            trainlib.fault_point(step)
            progress.step_done(step)
            window[0] += loss.item() * y.numel()
            window[1] += y.numel()
            if step % args.log_every == 0 or step == total_steps or step % args.checkpoint_every == 0 or step % steps_per_epoch == 0:
                window[2] = time.perf_counter() - t0
                loss_sum, samples = trainlib.all_reduce_sum(window[:2], d.device)
                seconds = trainlib.all_reduce_max(window[2], d.device)
                last_loss = loss_sum / max(samples, 1)
                trainlib.event(d, "step", step=step, epoch=epoch, loss=round(last_loss, 6), samples_per_s=round(samples / max(seconds, 1e-9), 1), **progress.fields(step))
                steps_logged = max(1.0, samples / (args.batch_size * d.world_size))  # drop_last: whole global batches
                trainlib.metric(
                    d, "step", step=step, epoch=epoch, loss=round(last_loss, 6), samples_per_s=round(samples / max(seconds, 1e-9), 1),
                    step_time_s=round(seconds / steps_logged, 5), memory_gib=round(trainlib.memory_gib(d), 3),
                )
                window = [0.0, 0.0, 0.0]
                t0 = time.perf_counter()
            if step % args.checkpoint_every == 0:
                save(step)
            if trainlib.preempted(d, step):
                save(step)
                writer.close()
                trainlib.exit_preempted(d, step)
            if step >= total_steps:
                break
        if step % steps_per_epoch == 0 or step >= total_steps:
            val_loss, acc = evaluate(ddp, test_loader, d)
            trainlib.log(d, f"epoch {epoch} step {step}: train_loss={last_loss:.4f} val_loss={val_loss:.4f} val_accuracy={acc:.4f}")
            trainlib.event(d, "eval", step=step, epoch=epoch, val_loss=round(val_loss, 6), val_accuracy=round(acc, 6))
            save(step)
    elapsed = trainlib.all_reduce_max(time.perf_counter() - t_start, d.device)
    trained = (step - (resumed_from or 0)) * args.batch_size * d.world_size
    trainlib.event(d, "result", final_step=step, final_loss=round(last_loss, 6), resumed_from_step=resumed_from, samples_per_s=round(trained / max(elapsed, 1e-9), 1))
    trainlib.metric(d, "result", step=step, loss=round(last_loss, 6), samples_per_s=round(trained / max(elapsed, 1e-9), 1), memory_gib=round(trainlib.memory_gib(d), 3))
    trainlib.finish()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
