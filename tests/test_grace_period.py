"""The time a training pod has between SIGTERM and SIGKILL (preemption, a drain, a spot
interruption) to finish its step and save: set on every runtime, per job on Trainer v2.3.0, told
to the programs, which say when their checkpoint does not fit, and kept by the emulator."""

from __future__ import annotations

import sys

import pytest

from config.settings import ConfigError, load_settings
from manifests import trainer_api
from manifests.runtimes import GRACE_ENV
from tests.conftest import dev_config, objects, run_config
from tools import emulate


def _trainer_pod(obj: dict) -> dict:
    return next(j for j in obj["spec"]["template"]["spec"]["replicatedJobs"] if j["name"] == "node")["template"]["spec"]["template"]["spec"]


def test_every_runtime_gives_its_pods_the_stacks_grace_period_and_says_it_in_their_env():
    run = run_config(dev_config(trainer={"terminationGraceSeconds": 300}))
    runtimes = [o for o in objects(run).values() if o["kind"] == "ClusterTrainingRuntime"]
    assert runtimes
    for rt in runtimes:
        pod = _trainer_pod(rt)
        assert pod["terminationGracePeriodSeconds"] == 300, rt["metadata"]["name"]
        assert {"name": GRACE_ENV, "value": "300"} in pod["containers"][0]["env"]
    default = run_config(dev_config())
    assert {_trainer_pod(o)["terminationGracePeriodSeconds"] for o in objects(default).values() if o["kind"] == "ClusterTrainingRuntime"} == {120}


def test_a_job_sets_its_own_grace_period_on_trainer_v2_3():
    run = run_config(dev_config(trainjobs={"fsdp": {"enabled": True, "terminationGraceSeconds": 600}}))
    fsdp = next(o for o in objects(run).values() if o["kind"] == "TrainJob" and o["metadata"]["name"] == "fsdp-t5")
    pod = trainer_api.read_pod_customization(fsdp["spec"])
    assert pod["terminationGracePeriodSeconds"] == 600
    assert {"name": GRACE_ENV, "value": "600"} in fsdp["spec"]["trainer"]["env"]  # overrides the runtime's by name
    ddp = next(o for o in objects(run).values() if o["kind"] == "TrainJob" and o["metadata"]["name"] == "ddp-mnist")
    assert "terminationGracePeriodSeconds" not in trainer_api.read_pod_customization(ddp["spec"])


@pytest.mark.parametrize("raw,line", [
    ({"trainer": {"version": "v2.1.0"}, "trainjobs": {"ddp": {"enabled": True, "terminationGraceSeconds": 300}}}, "trainjobs.ddp.terminationGraceSeconds = 300: Trainer v2.1.0 cannot set a job's own grace period"),
    ({"trainer": {"terminationGraceSeconds": 5}}, "trainer.terminationGraceSeconds = 5: allowed: an integer from 30 to 3600"),
    ({"trainjobs": {"ddp": {"enabled": True, "terminationGraceSeconds": 7200}}}, "trainjobs.ddp.terminationGraceSeconds = 7200: allowed: an integer from 30 to 3600"),
])
def test_grace_periods_the_platform_cannot_keep_are_refused(raw, line):
    with pytest.raises(ConfigError) as err:
        load_settings(raw, stack="dev", region="us-west-2")
    assert any(line in problem for problem in str(err.value).splitlines()), str(err.value)


def test_the_program_says_once_when_its_checkpoint_does_not_fit_the_grace_period(monkeypatch, capsys):
    import trainlib

    monkeypatch.setenv(GRACE_ENV, "60")
    monkeypatch.setattr(trainlib, "_grace_warned", [])
    trainlib._check_grace({"step": 10, "ckpt_total_s": 20.0})  # fits
    assert capsys.readouterr().err == ""
    trainlib._check_grace({"step": 20, "ckpt_total_s": 45.0})
    trainlib._check_grace({"step": 30, "ckpt_total_s": 50.0})
    err = capsys.readouterr().err
    assert err.count("checkpoint: saving step 20 took 45 s, more than half the pod's grace period (60 s)") == 1
    assert "terminationGraceSeconds" in err and "step 30" not in err


def test_the_emulator_kills_a_node_that_outstays_its_grace_period():
    """SIGTERM, then the pod's grace period, then SIGKILL (exit 137), as from the kubelet."""
    ignores = [sys.executable, "-c", f"import time; print({emulate.SIGTERM_LINE!r}, flush=True); time.sleep(60)"]
    leaves = [sys.executable, "-c", "import time; time.sleep(60)"]
    env = {"PATH": "/usr/bin:/bin", GRACE_ENV: "1"}
    result = emulate._run_pods([(ignores, env), (leaves, env)], ["j-node-0-0", "j-node-0-1"], "node", timeout_s=30, quiet=True)
    assert [(f.pod, f.exit_code) for f in result.failed] == [("j-node-0-0", 137)]
