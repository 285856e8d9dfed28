"""The rendered TrainJobs run for real on CPU (gloo), 2 nodes, with an injected node failure."""

import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import PROJECT
from tools.emulate import emulate, load_job, summary_line

pytestmark = pytest.mark.slow


def final_params(kind: str, work_dir: str) -> dict[str, torch.Tensor]:
    root = os.path.join(work_dir, "volumes", "checkpoints", {"ddp": "ddp-mnist", "fsdp": "fsdp-t5"}[kind])
    last = sorted(d for d in os.listdir(root) if d.startswith("step-"))[-1]
    path = os.path.join(root, last)
    if kind == "ddp":
        return torch.load(os.path.join(path, "state.pt"), weights_only=True)["model"]
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = os.path.join(work_dir, "final.pt")
    dcp_to_torch_save(path, out)
    return torch.load(out, weights_only=False)["model"]


@pytest.mark.parametrize("kind", ["ddp", "fsdp"])
def test_job_resumes_after_node_failure_with_identical_result(kind, tmp_path):
    clean_dir, failed_dir = str(tmp_path / "clean"), str(tmp_path / "failed")
    clean = emulate(load_job("dev", kind, clean_dir), fail_node=None, fail_at_step=None, timeout_s=300, quiet=True)
    assert clean["status"] == "Complete" and clean["nodes"] == 2
    assert clean["restarts"] == 0 and clean["resumed_from_step"] is None
    assert clean["final_step"] == 12

    failed = emulate(load_job("dev", kind, failed_dir), fail_node=1, fail_at_step=5, timeout_s=300, quiet=True)
    assert failed["status"] == "Complete"
    assert failed["restarts"] == 1
    assert 0 < failed["resumed_from_step"] <= 5  # the tiny profile checkpoints every 2 steps
    assert failed["final_step"] == clean["final_step"]
    assert failed["final_loss"] == clean["final_loss"]

    a, b = final_params(kind, clean_dir), final_params(kind, failed_dir)
    assert a.keys() == b.keys() and len(a) > 0
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_failure_beyond_max_restarts_fails_the_job(tmp_path):
    job = load_job("dev", "ddp", str(tmp_path))
    job.max_restarts = 0
    r = emulate(job, fail_node=0, fail_at_step=3, timeout_s=300, quiet=True)
    assert r["status"] == "Failed" and r["restarts"] == 0
    assert "status=Failed" in summary_line(r)


def test_non_retryable_exit_fails_without_restart(tmp_path):
    job = load_job("dev", "ddp", str(tmp_path))
    job.command = job.command + ["--batch-size", "0"]  # argparse usage error: exit code 2
    r = emulate(job, fail_node=None, fail_at_step=None, timeout_s=300, quiet=True)
    assert r["status"] == "Failed" and r["restarts"] == 0


def test_emulate_cli_prints_the_summary_line(tmp_path):
    p = subprocess.run(
        [sys.executable, "-m", "tools.emulate", "--stack", "dev", "--job", "ddp", "--fail-node", "1", "--fail-at-step", "5", "--quiet", "--work-dir", str(tmp_path)],
        cwd=PROJECT, capture_output=True, text=True, timeout=600,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    last = p.stdout.strip().splitlines()[-1]
    assert last.startswith("emulate: job=ddp-mnist status=Complete nodes=2 restarts=1 resumed_from_step=4 final_step=12 final_loss=")


def test_emulate_cli_rejects_a_job_that_is_not_enabled(tmp_path):
    p = subprocess.run([sys.executable, "-m", "tools.emulate", "--stack", "prod", "--job", "ddp", "--work-dir", str(tmp_path)], cwd=PROJECT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "trainjobs.ddp.enabled" in p.stderr


def test_v2_1_trainjob_shape_runs_the_same_way(tmp_path):
    from tests.conftest import dev_config

    cfg = dev_config(trainer={"version": "v2.1.0"})
    job = load_job("dev", "ddp", str(tmp_path), stack_config={"config": cfg})
    assert "/opt/training/code" in job.mounts and "/mnt/checkpoints" in job.mounts
    r = emulate(job, fail_node=None, fail_at_step=None, timeout_s=300, quiet=True)
    assert r["status"] == "Complete" and r["final_step"] == 12
