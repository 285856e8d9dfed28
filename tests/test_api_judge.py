"""The API server is the one judge of Kubernetes objects (``make validate``, ``tools.validate``):
a bare kube-apiserver with the pinned CRDs refuses what a cluster refuses (unknown fields, CEL
rules with cel-go's semantics, immutable fields on update, admission policies), and what it cannot
judge without the controllers' webhooks (a TrainJob's runtimeRef) is checked beside it."""

from __future__ import annotations

import copy
import pathlib

import pytest
import yaml

from tests.conftest import dev_config, objects, run_config, run_stack
from tools import render
from tools import validate as v


@pytest.fixture(autouse=True, scope="module")
def shared_judges():
    """One API server per Trainer version for the whole module (make validate starts its own)."""
    from tools.cluster import bare

    for version in ("v2.3.0", "v2.1.0"):
        bare.judge_for(version)


def rendered(kind: str, stack_objects: dict | None = None) -> dict:
    found = [o for o in (stack_objects or objects(run_stack("dev"))).values() if o["kind"] == kind]
    assert found, f"no {kind} rendered"
    return copy.deepcopy(found[0])


def test_unknown_fields_are_refused_not_pruned():
    pool = rendered("NodePool")
    pool["spec"]["template"]["spec"]["nodeClassRefTypo"] = {"name": "x"}
    problems = v.validate(pool)
    assert len(problems) == 1 and "nodeClassRefTypo" in problems[0] and "HTTP 400" in problems[0]


def test_ec2nodeclass_network_interface_rules():
    node_class = rendered("EC2NodeClass")
    node_class["spec"]["networkInterfaces"] = [
        {"networkCardIndex": 0, "deviceIndex": 0, "interfaceType": "interface"},
        {"networkCardIndex": 1, "deviceIndex": 0, "interfaceType": "efa-only"},
    ]
    assert v.validate(node_class) == []
    two_primary = copy.deepcopy(node_class)
    two_primary["spec"]["networkInterfaces"][1] = {"networkCardIndex": 0, "deviceIndex": 0, "interfaceType": "interface"}
    assert any("duplicate networkCardIndex and deviceIndex pairs" in p for p in v.validate(two_primary))
    two_efa = copy.deepcopy(node_class)
    two_efa["spec"]["networkInterfaces"].append({"networkCardIndex": 1, "deviceIndex": 1, "interfaceType": "efa-only"})
    assert any("at most one efa device per network card" in p for p in v.validate(two_efa))
    no_primary = copy.deepcopy(node_class)
    no_primary["spec"]["networkInterfaces"] = no_primary["spec"]["networkInterfaces"][1:]
    assert any("must include a primary interface" in p for p in v.validate(no_primary))


def test_nodepool_rules():
    pool = rendered("NodePool")
    assert v.validate(pool) == []
    restricted = copy.deepcopy(pool)
    restricted["spec"]["template"]["spec"]["requirements"].append({"key": "karpenter.sh/nodepool", "operator": "In", "values": ["x"]})
    assert v.validate(restricted)
    empty_in = copy.deepcopy(pool)
    empty_in["spec"]["template"]["spec"]["requirements"].append({"key": "example.com/team", "operator": "In", "values": []})
    assert any("requirements with operator 'In' must have a value defined" in p for p in v.validate(empty_in))
    not_a_number = copy.deepcopy(pool)
    not_a_number["spec"]["template"]["spec"]["requirements"].append({"key": "example.com/size", "operator": "Gt", "values": ["big"]})
    assert v.validate(not_a_number)  # cel-go: int('big') is an error, and a rule that errors refuses


def test_empty_capacity_reservation_tags_are_refused_as_config_says():
    node_class = rendered("EC2NodeClass")
    node_class["spec"]["capacityReservationSelectorTerms"] = [{"tags": {"team": ""}}]
    assert any("empty tag keys or values aren't supported" in p for p in v.validate(node_class))


def test_trainjob_and_runtime_rules():
    job = rendered("TrainJob")
    assert v.validate(job) == []
    job["metadata"]["name"] = "a" * 64
    assert any("metadata.name must be no more than 63 characters" in p for p in v.validate(job))
    runtime = rendered("ClusterTrainingRuntime", objects(run_config(dev_config(trainer={"version": "v2.1.0"}))))
    torch = runtime["spec"]["mlPolicy"]["torch"]
    for value, ok in [("auto", True), ("gpu", True), (4, True), ("many", False), (0, False)]:
        torch["numProcPerNode"] = value  # x-kubernetes-int-or-string on v2.1.0
        problems = v.validate(runtime, "v2.1.0")
        assert (problems == []) == ok, (value, problems)


@pytest.mark.parametrize("stack", ["dev", "prod", "teams"])
def test_rendered_stacks_are_taken_whole_by_the_api_server(stack):
    objs = list(objects(run_stack(stack)).values())
    assert {"ClusterTrainingRuntime", "TrainJob", "NodePool", "EC2NodeClass"} <= {o["kind"] for o in objs}
    for obj in objs:
        assert v.validate(obj) == [], obj["metadata"]["name"]
    assert v.runtime_ref_problems(objs) == []


def test_trainer_v2_1_0_render_passes_against_its_own_crds():
    objs = objects(run_config(dev_config(trainer={"version": "v2.1.0"})))
    trainer_objs = [o for o in objs.values() if o["apiVersion"].startswith("trainer.kubeflow.org/")]
    assert {"ClusterTrainingRuntime", "TrainJob"} <= {o["kind"] for o in trainer_objs}
    for obj in trainer_objs:
        assert v.validate(obj, "v2.1.0") == []
    assert any(v.validate(o, "v2.3.0") for o in trainer_objs if o["kind"] == "TrainJob")  # the CRDs do differ


def write_render(run, out: pathlib.Path) -> pathlib.Path:
    render.write(run, str(out))
    return out / run.stack / "manifests"


def test_cli_infers_the_trainer_version_from_the_plan(tmp_path, capsys):
    manifests = write_render(run_config(dev_config(trainer={"version": "v2.1.0"})), tmp_path / "v21")
    assert v.trainer_version_of(manifests)[0] == "v2.1.0"
    assert v.main([str(manifests)]) == 0
    out = capsys.readouterr().out
    assert "Trainer v2.1.0 (from the kubeflow-trainer chart 2.1.0" in out and "judged by the API server, 0 problems" in out
    assert v.main([str(manifests), "--trainer", "v2.3.0"]) == 1
    (manifests.parent / "plan.json").unlink()
    assert v.trainer_version_of(manifests)[0] is None
    capsys.readouterr()
    assert v.main([str(manifests)]) == 1  # the default, v2.3.0, with a note
    assert "note: no " in capsys.readouterr().out


def runtime_file(manifests: pathlib.Path) -> pathlib.Path:
    """The manifest of a ClusterTrainingRuntime that has a failurePolicy (names are not fixed)."""
    for path in sorted(manifests.glob("*.yaml")):
        obj = yaml.safe_load(path.read_text())
        if obj["kind"] == "ClusterTrainingRuntime" and "failurePolicy" in obj["spec"]["template"]["spec"]:
            return path
    raise AssertionError("no ClusterTrainingRuntime with a failurePolicy rendered")


def test_previous_render_catches_an_immutable_field_change(tmp_path, capsys):
    run = run_stack("dev")
    old = write_render(run, tmp_path / "old")
    new = write_render(run, tmp_path / "new")
    assert v.main([str(new), "--previous", str(old)]) == 0, capsys.readouterr().out
    path = runtime_file(new)
    runtime = yaml.safe_load(path.read_text())
    runtime["spec"]["template"]["spec"]["failurePolicy"]["maxRestarts"] += 1
    path.write_text(yaml.safe_dump(runtime, sort_keys=False))
    capsys.readouterr()
    assert v.main([str(new)]) == 0  # a valid object on its own
    assert v.main([str(new), "--previous", str(old)]) == 1
    out = capsys.readouterr().out
    assert f"ClusterTrainingRuntime {runtime['metadata']['name']}: update: refused by the API server (HTTP 422)" in out and "immutable" in out
    # an object with another name is a new object: no transition
    runtime["metadata"]["name"] += "-renamed"
    path.write_text(yaml.safe_dump(runtime, sort_keys=False))
    assert v.main([str(new), "--previous", str(old)]) == 0


def test_trainjob_runtime_ref_must_resolve(tmp_path, capsys):
    objs = copy.deepcopy(list(objects(run_stack("dev")).values()))
    assert v.runtime_ref_problems(objs) == []
    job = next(o for o in objs if o["kind"] == "TrainJob")
    job["spec"]["runtimeRef"]["name"] = "no-such-runtime"
    problems = v.runtime_ref_problems(objs)
    assert problems == [f"TrainJob/{job['metadata']['name']}: spec.runtimeRef: ClusterTrainingRuntime 'no-such-runtime' (trainer.kubeflow.org) is not among the rendered objects"]
    job["spec"]["runtimeRef"] = {"kind": "TrainingRuntime", "name": "x"}
    assert v.runtime_ref_problems(objs)
    namespaced = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainingRuntime", "metadata": {"name": "x", "namespace": job["metadata"]["namespace"]}}
    assert v.runtime_ref_problems(objs + [namespaced]) == []
    manifests = write_render(run_stack("dev"), tmp_path / "r")
    path = next(p for p in manifests.glob("*.yaml") if yaml.safe_load(p.read_text())["kind"] == "TrainJob")
    broken = yaml.safe_load(path.read_text())
    broken["spec"]["runtimeRef"]["name"] = "no-such-runtime"
    path.write_text(yaml.safe_dump(broken, sort_keys=False))
    assert v.main([str(manifests)]) == 1
    assert "'no-such-runtime' (trainer.kubeflow.org) is not among the rendered objects" in capsys.readouterr().out


@pytest.mark.parametrize("change", [{"maxRestarts": 9}, {"shmSize": "128Gi"}])
def test_changing_runtime_settings_changes_no_immutable_field_of_a_kept_name(tmp_path, capsys, change):
    """Two renders that differ in trainer settings pass --previous: maxRestarts renames the runtimes
    (their failurePolicy is immutable); shmSize keeps the names and changes only mutable fields;
    the TrainJobs whose runtimeRef changes are replaced (replaceOnChanges), not updated."""
    old = write_render(run_stack("dev"), tmp_path / "old")
    new = write_render(run_config(dev_config(trainer=change)), tmp_path / "new")
    assert v.main([str(new), "--previous", str(old)]) == 0, capsys.readouterr().out
    names = lambda d: {o["metadata"]["name"] for o in v.load_dir(d) if o["kind"] == "ClusterTrainingRuntime"}  # noqa: E731
    assert (names(old) == names(new)) == ("maxRestarts" not in change)
    if "maxRestarts" in change:
        assert v.replaced_on_changes(new)
        (new.parent / "plan.json").unlink()  # without the replacement facts the TrainJobs' update is refused
        capsys.readouterr()
        assert v.main([str(new), "--previous", str(old)]) == 1
        assert "spec.runtimeRef" in capsys.readouterr().out


@pytest.mark.parametrize("stack, version", [("workshop", "v2.1.0"), ("dev", "v2.3.0"), ("prod", "v2.3.0"), ("teams", "v2.3.0")])
def test_make_validate_passes_for_each_stack_against_its_own_trainer(tmp_path, capsys, stack, version):
    manifests = write_render(run_stack(stack), tmp_path)
    assert v.main([str(manifests)]) == 0, capsys.readouterr().out
    assert f"Trainer {version} (from the kubeflow-trainer chart" in capsys.readouterr().out


def test_the_render_s_admission_policies_judge_the_rest(tmp_path, capsys):
    """make validate installs the render's ValidatingAdmissionPolicies before the other objects."""
    run = run_stack("teams")
    manifests = write_render(run, tmp_path)
    policies = [o for o in v.load_dir(manifests) if o["kind"] == "ValidatingAdmissionPolicy"]
    assert policies
    job = next(o for o in v.load_dir(manifests) if o["kind"] == "TrainJob")
    team_ns = next(o["metadata"]["name"] for o in v.load_dir(manifests) if o["kind"] == "Namespace" and o["metadata"].get("labels", {}).get("training-platform/team"))
    bad = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "escape", "namespace": team_ns}, "spec": {"hostNetwork": True, "containers": [{"name": "c", "image": "public.ecr.aws/docker/library/busybox:1.37.0"}]}}
    (manifests / "pod-escape.yaml").write_text(yaml.safe_dump(bad))
    assert job and v.main([str(manifests)]) == 1
    out = capsys.readouterr().out
    assert f"Pod {team_ns}/escape: refused by the API server" in out and "hostNetwork" in out  # Pod Security restricted


def test_ci_crd_fetch_list_matches_the_schema_layout(need_schemas):
    """tools.fetch_crds (for CI runners without ../shared) fetches exactly the files the tests read."""
    from tools import fetch_crds

    wanted = set(fetch_crds.sources())
    present = {str(p.relative_to(v.schemas_dir())) for p in v.schemas_dir().rglob("*.yaml")}
    assert wanted == present
    assert all(url.startswith("https://raw.githubusercontent.com/") and "/main/" not in url for url in fetch_crds.sources().values())


def test_no_judge_outlives_the_process_that_started_it(tmp_path):
    """A run stopped by a signal that skips atexit (a CI timeout's SIGKILL) takes its API server
    and etcd with it (tools/cluster/procs.py: PR_SET_PDEATHSIG)."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    from tools.cluster.procs import Proc, alive

    code = "import json, sys, time\nfrom tools.cluster.bare import Judge\nj = Judge(echo=lambda *a, **k: None).start()\nprint(json.dumps([p.__dict__ for p in j.procs.procs]), flush=True)\ntime.sleep(300)\n"
    root = pathlib.Path(__file__).resolve().parent.parent
    child = subprocess.Popen([sys.executable, "-c", code], cwd=root, stdout=subprocess.PIPE, text=True)
    try:
        procs = [Proc(**p) for p in json.loads(child.stdout.readline())]  # type: ignore[union-attr]
        assert procs and all(alive(p) for p in procs)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    deadline = time.monotonic() + 30
    while any(alive(p) for p in procs) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [p for p in procs if alive(p)]
    for p in left:  # stop what the test started, by pid, before failing
        os.kill(p.pid, signal.SIGKILL)
    import shutil

    shutil.rmtree(pathlib.Path(procs[0].log).parent.parent, ignore_errors=True)  # the judge's own temporary directory (its atexit never ran)
    assert left == []


def test_component_ports_are_chosen_below_the_ephemeral_range_and_never_twice():
    """A port an outgoing connection can take (the kernel's ephemeral range) is never handed to a
    component to listen on; nor is one port handed out twice in a process."""
    from tools.cluster import procs

    low, _ = procs._ephemeral_range()
    ports = [procs.free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    if low - procs._LOWEST_PORT >= 1000:
        assert all(procs._LOWEST_PORT <= p < low for p in ports), ports
    assert not any(procs.port_in_use(p) for p in ports)  # chosen free (nothing here listens on them)
