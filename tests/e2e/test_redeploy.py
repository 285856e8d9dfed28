"""A second render applied over the first the way `pulumi up` would: a runtime change
(trainer.maxRestarts, part of the immutable failure policy) goes through without a 422."""

from __future__ import annotations

from tests.conftest import dev_config, run_config
from tests.e2e.conftest import wait_for
from tools.cluster.apply import apply_waves, redeploy
from tools.cluster.plan import stack_plan


def test_a_changed_runtime_applies_as_pulumi_would(clusters):
    up = clusters.get("dev", instance="redeploy")
    changed = stack_plan(run_config(dev_config(trainer={"maxRestarts": 5})), "us-west-2")
    old_runtimes = {o["metadata"]["name"] for o in up.plan.objects if o["kind"] == "ClusterTrainingRuntime"}
    new_runtimes = {o["metadata"]["name"] for o in changed.objects if o["kind"] == "ClusterTrainingRuntime"}
    assert old_runtimes != new_runtimes  # named by a hash of their immutable content
    outcome = redeploy(up.client(), up.plan, changed)
    assert outcome.problems == []
    client = up.client()
    for name in new_runtimes:
        runtime = client.get("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime", name)
        assert runtime["spec"]["template"]["spec"]["failurePolicy"]["maxRestarts"] == 5
    # the jobs were replaced onto the new runtimes, and the old runtimes go once nothing uses them
    for job in (o for o in changed.objects if o["kind"] == "TrainJob"):
        live = client.get("trainer.kubeflow.org/v1alpha1", "TrainJob", job["metadata"]["name"], job["metadata"]["namespace"])
        assert live["spec"]["runtimeRef"]["name"] in new_runtimes
    wait_for("the old runtimes deleted", lambda: all(client.get_or_none("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime", n) is None for n in old_runtimes - new_runtimes), up, timeout=90)


def test_an_in_place_change_to_an_immutable_field_is_the_api_servers_422(clusters):
    """What Pulumi would hit if a runtime were not named by its content: the CRD's rule refuses it."""
    up = clusters.get("dev", instance="redeploy")
    client = up.client()
    runtime = next(o for o in up.plan.objects if o["kind"] == "ClusterTrainingRuntime")
    live = client.get_or_none(runtime["apiVersion"], runtime["kind"], runtime["metadata"]["name"])
    if live is None:  # the first test replaced it: use a current one
        runtime = client.list(runtime["apiVersion"], runtime["kind"])[0]
        runtime = {k: runtime[k] for k in ("apiVersion", "kind", "spec")} | {"metadata": {"name": runtime["metadata"]["name"]}}
    mutated = {**runtime, "spec": {**runtime["spec"], "template": {**runtime["spec"]["template"], "spec": {**runtime["spec"]["template"]["spec"], "failurePolicy": {"maxRestarts": 42}}}}}
    from tools.cluster.client import ApiError

    try:
        client.apply(mutated)
    except ApiError as err:
        assert err.status == 422 and "immutable" in str(err).lower(), err
    else:
        raise AssertionError("the API server accepted an in-place change of an immutable failure policy")


def _previous_efs_volume(plan):
    """The workshop stack as the release before the EFS file-system policy rendered it: the
    platform's volume mounted the file system's root (volumeHandle = the file system id, no
    access point, no mount options) under the name ``training-checkpoints``."""
    import copy
    import dataclasses

    waves = copy.deepcopy(plan.waves)
    for obj in (o for wave in waves for o in wave):
        if obj["kind"] == "PersistentVolume" and obj["metadata"]["name"] == "training-checkpoints-ap":
            obj["metadata"]["name"] = "training-checkpoints"
            obj["spec"]["csi"]["volumeHandle"] = obj["spec"]["csi"]["volumeHandle"].split("::")[0]
            del obj["spec"]["mountOptions"]
        if obj["kind"] == "PersistentVolumeClaim" and obj["metadata"]["namespace"] == "training":
            obj["spec"]["volumeName"] = "training-checkpoints"
    return dataclasses.replace(plan, waves=waves)


def _release_claim(client, up) -> None:
    """The upgrade step docs/runbook.md names: a claim being deleted is held (pvc-protection) by
    every scheduled pod that names it, finished ones too (Kubernetes v1.33
    pkg/controller/volume/pvcprotection podUsesPVC checks only ``spec.nodeName``), so once the
    jobs have finished their pods are deleted (the Jobs and TrainJobs stay, complete)."""
    def finished() -> bool:
        jobs = client.list("trainer.kubeflow.org/v1alpha1", "TrainJob", "training")
        done = all(any(c["type"] in ("Complete", "Failed") and c["status"] == "True" for c in j.get("status", {}).get("conditions", [])) for j in jobs)
        return bool(jobs) and done and all(p.get("status", {}).get("phase") in ("Succeeded", "Failed") for p in client.list("v1", "Pod", "training"))

    wait_for("the training namespace's pods finished", finished, up, timeout=240)
    for pod in client.list("v1", "Pod", "training"):
        client.delete("v1", "Pod", pod["metadata"]["name"], "training")


def test_the_efs_volume_moves_to_its_access_point_as_pulumi_would(clusters):
    """A PV's source is immutable and a bound PV is held by its claim (pv-protection): the new
    volume is created beside the old one, the claim replaced (deleted first, once no running pod
    uses it), and the old volume deleted; the API server and the PV controller are the judges."""
    up = clusters.get("workshop", instance="redeploy")
    client = up.client()
    # as a second `pulumi up` would: a TrainJob the Trainer's webhook refused at the first because
    # its informer had not yet seen the runtime created a moment before is created now
    assert apply_waves(client, up.plan.waves).problems == []
    old = _previous_efs_volume(up.plan)
    _release_claim(client, up)
    assert redeploy(client, up.plan, old).problems == []  # the cluster as the previous release left it
    wait_for("the claim bound to the root volume", lambda: client.get("v1", "PersistentVolumeClaim", "checkpoints", "training").get("status", {}).get("phase") == "Bound", up, timeout=120)
    _release_claim(client, up)
    outcome = redeploy(client, old, up.plan)
    assert outcome.problems == []
    claim = lambda: client.get("v1", "PersistentVolumeClaim", "checkpoints", "training")  # noqa: E731
    wait_for("the claim bound to the access-point volume", lambda: claim().get("status", {}).get("phase") == "Bound", up, timeout=120)
    assert claim()["spec"]["volumeName"] == "training-checkpoints-ap"
    assert client.get("v1", "PersistentVolume", "training-checkpoints-ap")["spec"]["mountOptions"] == ["tls", "iam"]
    wait_for("the old volume gone", lambda: client.get_or_none("v1", "PersistentVolume", "training-checkpoints") is None, up, timeout=120)
