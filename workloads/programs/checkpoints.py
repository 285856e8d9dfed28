"""Checkpoints of the platform's programs: atomic all-ranks saves (synchronous or in the
background), resume from the newest checkpoint that loads, and what the disk can do to them
(durability, corruption, a full volume). Shipped beside the programs, imported by name."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor

import torch.distributed as dist
from trainlib import Dist, all_reduce_max, barrier, event, fail_config, fault_in_async_save, metric

_STEP_DIR = re.compile(r"^step-(\d{8})$")
DISK_FULL_ENV = "TRAINING_FAULT_DISK_FULL_AT_STEP"  # the emulator's --fill-volume-at-step



def step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"step-{step:08d}")


def list_checkpoints(root: str) -> list[tuple[int, str]]:
    if not root or not os.path.isdir(root):
        return []
    found = []
    for name in os.listdir(root):
        m = _STEP_DIR.match(name)
        path = os.path.join(root, name)
        if m and os.path.isfile(os.path.join(path, "meta.json")):
            found.append((int(m.group(1)), path))
    return sorted(found)


def latest_checkpoint(root: str) -> tuple[str, dict] | None:
    ckpts = list_checkpoints(root)
    if not ckpts:
        return None
    path = ckpts[-1][1]
    with open(os.path.join(path, "meta.json")) as fh:
        return path, json.load(fh)


def _set_aside(d: Dist, path: str) -> None:
    """A checkpoint no rank can load is renamed ``corrupt-step-N`` (kept for a look, never loaded
    again, never counted as the newest when pruning)."""
    if d.is_main and os.path.isdir(path):
        os.replace(path, os.path.join(os.path.dirname(path), "corrupt-" + os.path.basename(path)))
    barrier()


def resume(d: Dist, root: str, load_state) -> tuple[int, int | None, float]:
    """Restore the newest checkpoint that loads with ``load_state(path)``, if there is one: a
    checkpoint that fails to load on any rank (a torn write, a bad disk) is set aside, saying so,
    and the next older one is tried. Returns (step to continue from, step resumed from or None,
    last logged loss)."""
    t0 = time.perf_counter()
    meta: dict = {}
    for path in [p for _, p in reversed(list_checkpoints(root))]:
        try:
            with open(os.path.join(path, "meta.json")) as fh:
                meta = json.load(fh)
            load_state(path)
            failed = 0.0
        except Exception as err:  # noqa: BLE001 - whatever the loader raises, this checkpoint is unusable
            failed = 1.0
            print(f"checkpoint {path} does not load on rank {d.rank} ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); trying an older one", file=sys.stderr, flush=True)
        if all_reduce_max(failed, d.device) > 0:  # every rank must load the same one
            event(d, "checkpoint_unreadable", path=path)
            _set_aside(d, path)
            continue
        break
    else:
        metric(d, "start", resumed_from_step=None, world_size=d.world_size)  # one per attempt: restarts count them
        return 0, None, float("nan")
    seconds = all_reduce_max(time.perf_counter() - t0, d.device)
    event(d, "resumed", step=meta["step"], epoch=meta["epoch"], path=path, seconds=round(seconds, 4))
    metric(d, "start", resumed_from_step=meta["step"], world_size=d.world_size, restore_s=round(seconds, 4))
    return meta["step"], meta["step"], meta.get("loss", float("nan"))


class CheckpointWriter:
    """Atomic, all-ranks checkpoint saves; ``write_state(tmp_dir)`` does the actual writing.

    Synchronous when ``write_state`` returns None. When it returns a future (an asynchronous
    save that has copied the state to host memory and writes it in the background), ``save``
    returns at once and rank 0 completes the checkpoint (``meta.json``, then the rename) in a
    background thread only after the write has finished on every rank. ``write_state`` may also
    return a pair of futures, (staged, written), when even the copy to host memory runs in the
    background: the training loop then calls ``wait_staged`` before it next changes the state
    (the optimizer step), and only that wait blocks it. At most one save is in flight: the next
    ``save`` and ``close`` wait for it. Each finished save logs a ``checkpoint`` event with
    ``ckpt_stall_s`` (time the training loop was blocked in ``save`` and ``wait_staged``, waiting
    for the previous save included) and ``ckpt_total_s`` (from the start of ``save`` to the
    rename).
    """

    def __init__(self, d: Dist, root: str, keep: int = 3, asynchronous: bool = False):
        self.d = d
        self.root = root
        self.keep = keep
        self.last_step: int | None = None
        # async saves run their collectives in a background thread: on a group of their own
        # (gloo, as async_save needs a CPU backend), never interleaved with the training loop's
        group = dist.new_group(backend="gloo") if asynchronous and dist.is_initialized() else None
        self.group: dist.ProcessGroup | None = group if isinstance(group, dist.ProcessGroup) else None  # every rank is a member
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-finalize") if asynchronous else None
        self._pending: tuple[int, float, Future] | None = None  # (step, stall, completion)
        self._staged: Future | None = None  # the copy to host memory of the save in flight, if still running
        self._staging_wait = 0.0  # time the loop spent in wait_staged for the save in flight

    def save(self, step: int, meta: dict, write_state) -> str:
        t0 = time.perf_counter()
        self.wait()  # at most one save in flight
        final = step_dir(self.root, step)
        if step == self.last_step or os.path.isdir(final):
            return final  # already saved (e.g. the epoch-end save after a periodic one)
        self.last_step = step
        tmp = os.path.join(self.root, f".tmp-step-{step:08d}")
        if self.d.is_main:
            os.makedirs(self.root, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            newest = list_checkpoints(self.root)
            room_for(self.root, tree_size(newest[-1][1]) if newest else 0)
            os.makedirs(tmp)
        barrier()
        try:
            if os.environ.get(DISK_FULL_ENV) == str(step):  # fault injection: the volume is full at this save
                raise OSError(errno.ENOSPC, "No space left on device (fault injection)", tmp)
            written = write_state(tmp)
        except (OSError, RuntimeError) as err:
            if not disk_full(err, self.root):
                raise
            shutil.rmtree(tmp, ignore_errors=True)
            free = shutil.disk_usage(self.root).free
            # not retryable: every restart would fill it again (a crash loop); older checkpoints were pruned first
            fail_config(f"checkpoint volume full while saving step {step} to {self.root} ({free // 2**20} MiB free): free space or enlarge the volume, then resubmit; the newest complete checkpoint is kept")
        if written is None:  # synchronous: every rank has written once the barrier passes
            barrier()
            if self.d.is_main:
                self._complete(tmp, final, meta, step)
            barrier()
            seconds = time.perf_counter() - t0
            self._event(step, seconds, seconds, "sync")
            return final
        staged = None
        if isinstance(written, tuple):
            staged, written = written
        fault_in_async_save(step)
        done = self._pool.submit(self._complete_after, written, tmp, final, meta, step, t0) if self._pool and self.d.is_main else written
        self._staged, self._staging_wait = staged, 0.0
        self._pending = (step, time.perf_counter() - t0, done)
        return final

    def wait_staged(self) -> None:
        """Block until the save in flight has its copy of the state in host memory (call before
        the state changes: the optimizer step). Returns at once when it has, or when none is."""
        if self._staged is None:
            return
        t0 = time.perf_counter()
        self._staged.result()
        self._staged = None
        self._staging_wait += time.perf_counter() - t0

    def _complete_after(self, written: Future, tmp: str, final: str, meta: dict, step: int, t0: float) -> float:
        # the save's final collective gathers every rank's write results on rank 0 before its
        # future resolves there, so every shard is on storage when rank 0 gets past this line
        written.result()
        self._complete(tmp, final, meta, step)
        return time.perf_counter() - t0

    def _complete(self, tmp: str, final: str, meta: dict, step: int) -> None:
        """Mark the checkpoint complete: its files and directory on storage first (fsync), then
        ``meta.json``, then the rename, then the parent directory (so the rename is durable)."""
        _fsync_tree(tmp)
        meta = {**meta, "step": step, "saved_at": time.time()}
        with open(os.path.join(tmp, "meta.json"), "w") as fh:
            json.dump(meta, fh)
            fh.flush()
            os.fsync(fh.fileno())
        _fsync_dir(tmp)
        os.rename(tmp, final)
        _fsync_dir(self.root)
        self._prune()

    def poll(self) -> None:
        """Report a finished background save without blocking."""
        if self._pending and self._pending[2].done():
            self.wait()

    def wait(self) -> None:
        """Block until the save in flight (if any) is complete; raises its error."""
        if not self._pending:
            return
        self.wait_staged()
        step, stall, done = self._pending
        stall += self._staging_wait
        self._pending = None
        total = done.result()
        self._event(step, stall, max(total, stall) if isinstance(total, float) else stall, "async")

    def close(self) -> None:
        """Wait for the last save and make sure every rank sees it complete."""
        self.wait()
        barrier()
        if self._pool:
            self._pool.shutdown(wait=True)

    def _event(self, step: int, stall: float, total: float, mode: str) -> None:
        event(self.d, "checkpoint", step=step, seconds=round(total, 4), ckpt_stall_s=round(stall, 4), ckpt_total_s=round(total, 4), mode=mode)

    def _prune(self) -> None:
        for _, path in list_checkpoints(self.root)[: -self.keep]:
            shutil.rmtree(path, ignore_errors=True)
        for name in os.listdir(self.root):
            if name.startswith(".tmp-step-"):
                shutil.rmtree(os.path.join(self.root, name), ignore_errors=True)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: str) -> None:
    """Every file under ``root`` and every directory, on storage."""
    for dirpath, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(dirpath)


def room_for(root: str, needed: int, keep_newest: int = 1) -> None:
    """Before a save: when the volume has less free space than ``needed`` bytes (the last
    checkpoint's size), prune the oldest checkpoints (keeping the newest ``keep_newest``) first."""
    if not os.path.isdir(root):
        return
    ckpts = list_checkpoints(root)
    while ckpts[:-keep_newest] and shutil.disk_usage(root).free < needed:
        _, oldest = ckpts.pop(0)
        print(f"checkpoint volume low on space: removing {oldest} before saving", file=sys.stderr, flush=True)
        shutil.rmtree(oldest, ignore_errors=True)


def disk_full(err: BaseException, root: str) -> bool:
    """A write that failed for want of space: ENOSPC, or torch.save's C++ stream errors
    ("basic_ios::clear", "file write failed") on a volume with (almost) no space left."""
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(err)
    return ("basic_ios" in text or "write failed" in text) and shutil.disk_usage(root).free < 64 * 2**20


def tree_size(path: str) -> int:
    return sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(path) for f in fs)
