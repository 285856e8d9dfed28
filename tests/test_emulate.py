"""The rendered TrainJobs run for real on CPU (gloo), 2 nodes, with an injected node failure;
the runtime's failure policies decide between restarting and failing, as JobSet and Job would."""

import copy
import os
import re
import subprocess
import sys

import pytest
import torch

from k8s.builders.runtimes import failure_policy, pod_failure_policy
from tests.conftest import PROJECT, dev_config, objects, run_stack
from tools.emulate import PodExit, emulate, job_failure, job_from_objects, jobset_rule, load_job, summary_line

pytestmark = pytest.mark.slow

FSDP_2_GPUS = {"config": dev_config(trainjobs={"fsdp": {"gpusPerNode": 2}})}  # 2 of g5.12xlarge's 4 GPUs


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


@pytest.mark.parametrize(("kind", "stack_config", "world_size"), [("ddp", None, 2), ("fsdp", FSDP_2_GPUS, 4)], ids=["ddp", "fsdp-2x2"])
def test_job_resumes_after_node_failure_with_identical_result(kind, stack_config, world_size, tmp_path):
    clean_dir, failed_dir = str(tmp_path / "clean"), str(tmp_path / "failed")
    job = load_job("dev", kind, clean_dir, stack_config=stack_config)
    assert job.num_nodes == 2 and job.nproc_per_node == world_size // 2  # the TrainJob's numProcPerNode
    clean = emulate(job, fail_node=None, fail_at_step=None, timeout_s=300, quiet=True)
    assert clean["status"] == "Complete" and clean["nodes"] == 2 and clean["world_size"] == world_size
    assert clean["restarts"] == 0 and clean["resumed_from_step"] is None
    assert clean["result"].get("world_size", world_size) == world_size  # what the program itself saw (fsdp reports it)
    assert 5 < clean["final_step"] <= 12  # --max-steps 12, or one epoch of the synthetic samples

    failed = emulate(load_job("dev", kind, failed_dir, stack_config=stack_config), fail_node=1, fail_at_step=5, timeout_s=300, quiet=True)
    assert failed["status"] == "Complete" and failed["world_size"] == world_size
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
    assert r["status"] == "Failed" and r["restarts"] == 0 and r["reason"] == "ReachedMaxRestarts"
    assert "status=Failed" in summary_line(r) and " reason=ReachedMaxRestarts failed_pod=" in summary_line(r)  # and which node, with its exit code


@pytest.mark.parametrize(("extra", "code"), [(["--batch-size", "0"], 2), (["--synthetic-samples", "1"], 3)], ids=["bad-args", "bad-config"])
def test_non_retryable_exit_fails_without_restart(extra, code, tmp_path, capsys):
    job = load_job("dev", "ddp", str(tmp_path))
    job.command = job.command + extra  # 2: argparse usage error; 3: fewer samples than one global batch
    r = emulate(job, fail_node=None, fail_at_step=None, timeout_s=300, quiet=True)
    assert r["status"] == "Failed" and r["restarts"] == 0 and r["reason"] == "FailJobSetFailurePolicyAction"
    assert "NonRetryableExit" in r["message"]
    out = capsys.readouterr().out
    assert re.search(rf"PodFailurePolicy: Container node for pod training/ddp-mnist-node-0-[01] failed with exit code {code} matching FailJob rule at index 0", out), out
    assert "restarting" not in out


def test_failure_policy_decisions_follow_job_and_jobset_semantics():
    fp, pfp = failure_policy(3), pod_failure_policy()
    reason, message = job_failure(pfp, "node", "training", [PodExit("j-node-0-1", 3)])
    assert (reason, message) == ("PodFailurePolicy", "Container node for pod training/j-node-0-1 failed with exit code 3 matching FailJob rule at index 0")
    assert (rule := jobset_rule(fp, "node", reason, message)) is not None and rule["action"] == "FailJobSet"
    # a vanished node: condition DisruptionTarget -> restart without counting towards maxRestarts
    reason, message = job_failure(pfp, "node", "training", [PodExit("j-node-0-0", 137, [{"type": "DisruptionTarget", "status": "True"}])])
    assert (reason, message) == ("PodFailurePolicy", "Pod training/j-node-0-0 has condition DisruptionTarget matching FailJob rule at index 1")
    assert (rule := jobset_rule(fp, "node", reason, message)) is not None and rule["action"] == "RestartJobSetAndIgnoreMaxRestarts"
    # anything else: the backoff limit (0) is exceeded and no rule applies (default: RestartJobSet)
    reason, message = job_failure(pfp, "node", "training", [PodExit("j-node-0-0", 137), PodExit("j-node-0-1", 1)])
    assert reason == "BackoffLimitExceeded" and jobset_rule(fp, "node", reason, message) is None
    # the rule's container and operator count
    other = {"rules": [{"action": "FailJob", "onExitCodes": {"containerName": "sidecar", "operator": "In", "values": [3]}}]}
    assert job_failure(other, "node", "training", [PodExit("p", 3)])[0] == "BackoffLimitExceeded"
    not_in = {"rules": [{"action": "FailJob", "onExitCodes": {"operator": "NotIn", "values": [1, 137]}}]}
    assert job_failure(not_in, "node", "ns", [PodExit("p", 1)])[0] == "BackoffLimitExceeded"
    assert job_failure(not_in, "node", "ns", [PodExit("p", 5)])[0] == "PodFailurePolicy"


def _with_initializer(objs: list[dict], command: list[str], env: list[dict] | None = None) -> list[dict]:
    """The rendered objects with a synthetic initializer job that ``node`` depends on."""
    objs = copy.deepcopy(objs)
    tj = next(o for o in objs if o["kind"] == "TrainJob" and o["metadata"]["name"] == "ddp-mnist")
    rt = next(o for o in objs if o["kind"] == "ClusterTrainingRuntime" and o["metadata"]["name"] == tj["spec"]["runtimeRef"]["name"])
    jobs = rt["spec"]["template"]["spec"]["replicatedJobs"]
    node = next(j for j in jobs if j["name"] == "node")
    init = copy.deepcopy(node)
    init.update(name="initializer")
    init["template"]["spec"]["template"]["spec"]["containers"][0].update(name="initializer", command=command, env=env or [])
    init["template"]["spec"]["podFailurePolicy"]["rules"][0]["onExitCodes"]["containerName"] = "initializer"
    node["dependsOn"] = [{"name": "initializer", "status": "Complete"}]
    jobs.insert(0, init)
    return objs


def test_initializers_run_first_and_their_failure_policy_applies(tmp_path, capsys):
    objs = list(objects(run_stack("dev")).values())
    write = ["python3", "-c", "import os; open(os.environ['MARKER'], 'w').write('x')"]
    ok = job_from_objects(_with_initializer(objs, write, [{"name": "MARKER", "value": "/mnt/checkpoints/initialized"}]), "dev", "ddp", str(tmp_path / "ok"))
    assert [i.name for i in ok.init_jobs] == ["initializer"]
    r = emulate(ok, fail_node=None, fail_at_step=None, timeout_s=300, quiet=True)
    assert r["status"] == "Complete" and os.path.exists(os.path.join(ok.mounts["/mnt/checkpoints"], "initialized"))

    bad = job_from_objects(_with_initializer(objs, ["python3", "-c", "raise SystemExit(3)"]), "dev", "ddp", str(tmp_path / "bad"))
    r = emulate(bad, fail_node=None, fail_at_step=None, timeout_s=300, quiet=True)
    assert r["status"] == "Failed" and r["restarts"] == 0 and r["reason"] == "FailJobSetFailurePolicyAction" and r["final_step"] is None
    out = capsys.readouterr().out
    assert "Container initializer for pod training/ddp-mnist-initializer-0-0 failed with exit code 3 matching FailJob rule at index 0" in out


def test_emulate_cli_prints_the_summary_line_and_leaves_no_temporary_files(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    p = subprocess.run(
        [sys.executable, "-m", "tools.emulate", "--stack", "dev", "--job", "ddp", "--fail-node", "1", "--fail-at-step", "5", "--quiet"],
        cwd=PROJECT, capture_output=True, text=True, timeout=600, env={**os.environ, "TMPDIR": str(tmp)},
    )
    assert p.returncode == 0, p.stdout + p.stderr
    last = p.stdout.strip().splitlines()[-1]
    assert last.startswith("emulate: job=ddp-mnist status=Complete nodes=2 world_size=2 restarts=1 resumed_from_step=4 final_step=12 final_loss=")
    assert os.listdir(tmp) == []  # the work directory, each pod's TMPDIR (launch.py's exit file of the killed node)


def test_emulate_cli_rejects_a_fault_beyond_the_last_step(tmp_path):
    p = subprocess.run(
        [sys.executable, "-m", "tools.emulate", "--stack", "dev", "--job", "ddp", "--fail-node", "1", "--fail-at-step", "13", "--work-dir", str(tmp_path)],
        cwd=PROJECT, capture_output=True, text=True, timeout=120,
    )
    assert p.returncode == 2 and "--fail-at-step 13 is beyond the last step of the run (12" in p.stderr, p.stderr
    assert os.listdir(tmp_path) == []  # nothing rendered or started


def test_emulate_cli_rejects_a_job_that_is_not_enabled(tmp_path):
    p = subprocess.run([sys.executable, "-m", "tools.emulate", "--stack", "prod", "--job", "ddp", "--work-dir", str(tmp_path)], cwd=PROJECT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "trainjobs.ddp.enabled" in p.stderr


def test_v2_1_trainjob_shape_runs_the_same_way(tmp_path):
    cfg = dev_config(trainer={"version": "v2.1.0"})
    job = load_job("dev", "ddp", str(tmp_path), stack_config={"config": cfg})
    assert "/opt/training/code" in job.mounts and "/mnt/checkpoints" in job.mounts
    assert job.nproc_per_node == 1  # the TrainJob's numProcPerNode wins over the runtime's "auto"
    r = emulate(job, fail_node=None, fail_at_step=None, timeout_s=300, quiet=True)
    assert r["status"] == "Complete" and r["final_step"] == 12



def test_tiny_profile_has_samples_for_every_step_at_any_world_size():
    """With 2 nodes x 4 processes the README's fault at step 5 must still happen."""
    from tools.emulate import max_steps, sized_profile
    from tools.fixture_hub import FIXTURE_ROWS
    from workloads.builders.trainjobs import TINY_PROFILE

    for kind, profile in TINY_PROFILE.items():
        if max_steps(profile) is None:  # the all-reduce check: no training steps
            assert sized_profile(profile, 16) == profile
            continue
        for world in (1, 2, 4, 8, 16):
            sized = sized_profile(profile, world)
            # FSDP trains on the fixture dataset the emulated initializers copy (tools/fixture_hub.py)
            samples = int(sized[sized.index("--synthetic-samples") + 1]) if "--synthetic-samples" in sized else FIXTURE_ROWS
            batch = int(sized[sized.index("--batch-size") + 1])
            assert samples // (batch * world) >= max_steps(sized), (kind, world)
        assert sized_profile(profile, 1) == profile  # small worlds keep the profile
