"""Asynchronous checkpoints of the FSDP T5 program, for real under torchrun on CPU (2 processes, gloo):
complete saves are marked complete, a save interrupted in the background never is, and a run
resumed after the crash ends with exactly the parameters of an uninterrupted one."""

import json
import os
import socket
import subprocess
import sys

import pytest
import torch

from tools import fixture_hub
from workloads.builders.trainjobs import PROGRAMS_DIR, TINY_PROFILE

pytestmark = pytest.mark.slow
DATA: list[str] = []  # --dataset-dir/--model-dir of the fixture the initializers would have written


@pytest.fixture(scope="module", autouse=True)
def initialized_data(tmp_path_factory):
    hub, workspace = tmp_path_factory.mktemp("hub"), tmp_path_factory.mktemp("workspace")
    fixture_hub.build(str(hub), datasets=["FiscalNote/billsum"], models=["google-t5/t5-large"])
    fixture_hub.initialize(kind="dataset", uri="hf://FiscalNote/billsum", hub=str(hub), workspace=str(workspace))
    fixture_hub.initialize(kind="model", uri="hf://google-t5/t5-large", hub=str(hub), workspace=str(workspace))
    DATA[:] = ["--dataset-dir", str(workspace / "dataset"), "--model-dir", str(workspace / "model")]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_t5(ckpt_dir: str, *extra: str, env: dict | None = None) -> tuple[int, list[dict], str]:
    """torchrun 2 processes of fsdp_t5.py with the tiny profile; (exit code, events, output)."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(_port()),
        str(PROGRAMS_DIR / "fsdp_t5.py"), *DATA, *TINY_PROFILE["fsdp"], "--checkpoint-dir", ckpt_dir, *extra,
    ]
    # a session of its own: the fault injection SIGKILLs the launcher's whole process group
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}, timeout=300, start_new_session=True)
    events = [json.loads(line.split(" ", 1)[1]) for line in p.stdout.splitlines() if line.startswith("TRAINING_EVENT ")]
    return p.returncode, events, p.stdout[-2000:] + p.stderr[-3000:]


def complete_steps(ckpt_dir: str) -> list[int]:
    return sorted(int(n[5:]) for n in os.listdir(ckpt_dir) if n.startswith("step-") and os.path.isfile(os.path.join(ckpt_dir, n, "meta.json")))


def final_params(ckpt_dir: str, step: int, scratch: str) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = os.path.join(scratch, f"final-{os.path.basename(ckpt_dir)}.pt")
    dcp_to_torch_save(os.path.join(ckpt_dir, f"step-{step:08d}"), out)
    return torch.load(out, weights_only=False)["model"]


def assert_equal_params(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys() and len(a) > 0
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_async_checkpoints_complete_and_crash_mid_save_resumes_exactly(tmp_path):
    clean, crashed = str(tmp_path / "clean"), str(tmp_path / "crashed")

    rc, events, out = run_t5(clean)  # --checkpoint-mode async is the default
    assert rc == 0, out
    saves = [e for e in events if e["event"] == "checkpoint"]
    assert [e["step"] for e in saves] == [2, 4, 6, 8, 10, 12]
    for e in saves:
        assert e["mode"] == "async"
        assert 0 <= e["ckpt_stall_s"] <= e["ckpt_total_s"]
    assert complete_steps(clean) == [8, 10, 12]  # the newest 3 are kept, every one complete
    assert not [n for n in os.listdir(clean) if n.startswith(".tmp-")]
    for step in complete_steps(clean):
        assert os.path.isfile(os.path.join(clean, f"step-{step:08d}", ".metadata"))

    # the node dies right after the asynchronous save of step 6 has started: its files may be
    # partly written, but it is never marked complete
    rc, events, out = run_t5(crashed, env={"TRAINING_FAULT_IN_ASYNC_SAVE": "6"})
    assert rc != 0, out
    assert "fault injection" in out
    assert complete_steps(crashed) == [2, 4]
    assert not os.path.exists(os.path.join(crashed, "step-00000006"))
    assert os.path.isdir(os.path.join(crashed, ".tmp-step-00000006"))
    assert not os.path.exists(os.path.join(crashed, ".tmp-step-00000006", "meta.json"))

    rc, events, out = run_t5(crashed)
    assert rc == 0, out
    resumed = next(e for e in events if e["event"] == "resumed")
    assert resumed["step"] == 4  # the previous complete checkpoint
    result = next(e for e in events if e["event"] == "result")
    assert result["final_step"] == 12 and result["resumed_from_step"] == 4
    assert complete_steps(crashed) == [8, 10, 12]
    assert not [n for n in os.listdir(crashed) if n.startswith(".tmp-")]

    assert_equal_params(final_params(clean, 12, str(tmp_path)), final_params(crashed, 12, str(tmp_path)))


def test_sync_mode_saves_in_the_loop_with_the_same_result(tmp_path):
    sync_dir, async_dir = str(tmp_path / "sync"), str(tmp_path / "async")
    rc, events, out = run_t5(sync_dir, "--checkpoint-mode", "sync", "--max-steps", "6")
    assert rc == 0, out
    saves = [e for e in events if e["event"] == "checkpoint"]
    assert [e["step"] for e in saves] == [2, 4, 6]
    assert all(e["mode"] == "sync" and e["ckpt_stall_s"] == e["ckpt_total_s"] for e in saves)
    rc, _, out = run_t5(async_dir, "--checkpoint-mode", "async", "--max-steps", "6")
    assert rc == 0, out
    assert_equal_params(final_params(sync_dir, 6, str(tmp_path)), final_params(async_dir, 6, str(tmp_path)))
