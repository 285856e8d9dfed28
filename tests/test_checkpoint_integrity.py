"""Checkpoints that survive the disk (workloads/programs/trainlib.py): durable before they are
marked complete, a corrupt newest one skipped for the newest that loads, a full volume a clear
non-retryable stop with older checkpoints pruned first."""

from __future__ import annotations

import errno
import os
from collections import namedtuple

import checkpoints  # the programs directory is on sys.path (tests/conftest.py), as in the image
import pytest
import torch
import trainlib

D = trainlib.Dist(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


def _save(writer: checkpoints.CheckpointWriter, step: int, value: float) -> None:
    writer.save(step, {"epoch": 0, "loss": value}, lambda tmp: torch.save({"w": torch.tensor([value])}, os.path.join(tmp, "state.pt")))


def _load_into(box: dict):
    def load(path: str) -> None:
        box["w"] = torch.load(os.path.join(path, "state.pt"), weights_only=True)["w"].item()

    return load


def test_a_corrupt_newest_checkpoint_is_set_aside_for_the_newest_that_loads(tmp_path, capsys):
    root = str(tmp_path / "ckpt")
    writer = checkpoints.CheckpointWriter(D, root, keep=3)
    for step, value in ((2, 0.2), (4, 0.4), (6, 0.6)):
        _save(writer, step, value)
    with open(os.path.join(checkpoints.step_dir(root, 6), "state.pt"), "r+b") as fh:  # a torn write
        fh.truncate(10)
    box: dict = {}
    step, resumed, _ = checkpoints.resume(D, root, _load_into(box))
    assert (step, resumed, box["w"]) == (4, 4, pytest.approx(0.4))
    assert "does not load" in capsys.readouterr().err
    assert os.path.isdir(os.path.join(root, "corrupt-step-00000006"))  # kept for a look, never loaded again
    assert [s for s, _ in checkpoints.list_checkpoints(root)] == [2, 4]


def test_no_loadable_checkpoint_starts_from_scratch(tmp_path):
    root = str(tmp_path / "ckpt")
    writer = checkpoints.CheckpointWriter(D, root)
    _save(writer, 2, 0.2)
    os.remove(os.path.join(checkpoints.step_dir(root, 2), "state.pt"))
    assert checkpoints.resume(D, root, _load_into({}))[:2] == (0, None)


def test_files_and_directories_reach_storage_before_the_checkpoint_is_complete(tmp_path, monkeypatch):
    synced: list[str] = []
    real_fsync, real_open = os.fsync, os.open
    opened: dict[int, str] = {}

    def tracking_open(path, flags, *a, **kw):
        fd = real_open(path, flags, *a, **kw)
        opened[fd] = str(path)
        return fd

    monkeypatch.setattr(os, "open", tracking_open)
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(opened.get(fd, "meta.json")), real_fsync(fd))[1])
    renamed_after: list[int] = []
    real_rename = os.rename
    monkeypatch.setattr(os, "rename", lambda a, b: (renamed_after.append(len(synced)), real_rename(a, b))[1])
    root = str(tmp_path / "ckpt")
    _save(checkpoints.CheckpointWriter(D, root), 2, 0.2)
    before = synced[: renamed_after[0]]
    assert any(p.endswith("state.pt") for p in before) and any(p.endswith(".tmp-step-00000002") for p in before)
    assert synced[renamed_after[0]:] == [root]  # then the parent: the rename itself is durable


Usage = namedtuple("Usage", "total used free")


@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, "No space left on device"), RuntimeError("basic_ios::clear: iostream error")])
def test_a_full_volume_prunes_older_checkpoints_then_stops_for_good(tmp_path, monkeypatch, capsys, error):
    root = str(tmp_path / "ckpt")
    writer = checkpoints.CheckpointWriter(D, root, keep=3)
    for step in (2, 4, 6):
        _save(writer, step, step / 10)
    monkeypatch.setattr(checkpoints.shutil, "disk_usage", lambda _p: Usage(100, 100, 0))  # nothing free
    exit_file = tmp_path / "exit"
    monkeypatch.setenv(trainlib.EXIT_FILE_ENV, str(exit_file))

    def full(tmp):
        raise error

    with pytest.raises(SystemExit) as stop:
        writer.save(8, {"epoch": 0}, full)
    assert stop.value.code == trainlib.EXIT_BAD_CONFIG  # non-retryable: no crash loop
    captured = capsys.readouterr()
    err = captured.err
    assert "checkpoint volume full while saving step 8" in err and "removing" in err
    assert trainlib.ALERT_TOKENS["failed"] in captured.out  # the line the "failed TrainJobs" alarm counts
    assert [s for s, _ in checkpoints.list_checkpoints(root)] == [6]  # older ones pruned, the newest kept
    assert not os.path.exists(os.path.join(root, ".tmp-step-00000008"))
    assert exit_file.read_text().strip() == "3"
