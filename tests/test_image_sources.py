"""Where the cluster pulls its images from: never Docker Hub by default.

Docker Hub limits anonymous pulls per IPv4 address, and every node behind a stack's NAT address
shares the limit (a scale-out ends in ``toomanyrequests`` and ImagePullBackOff). Every image an
object of a shipped stack names, and the image trainctl's jobs run without ``--image``, comes from
a registry without that limit: the stack's ECR (its build, its copies of Docker Hub images),
ECR Public, a vendor's registry."""

from __future__ import annotations

import json
import re

import pytest

import versions
from config.settings import load_settings
from infra import registry
from k8s.builders import images
from tests.conftest import PROJECT, dev_config, find, run_config, run_stack
from tools.render import manifests
from trainctl import code, objects
from workloads.builders import trainjobs as tj

SHIPPED = sorted(p.name.split(".")[1] for p in PROJECT.glob("Pulumi.*.yaml"))
RELEASE = "kubernetes:helm.sh/v3:Release"
REPO = "aws:ecr/repository:Repository"
INDEX = "docker-build:index:Index"
ECR = re.compile(r"^\d{12}\.dkr\.ecr\.[a-z0-9-]+\.amazonaws\.com(\.cn)?/")


def chart_value_images(values, path: str = "") -> list[tuple[str, str]]:
    """Images a Helm release's values set (``image: {registry?, repository, tag}`` or a plain string)."""
    found: list[tuple[str, str]] = []
    if isinstance(values, dict):
        if isinstance(values.get("repository"), str):
            found.append((path, "/".join(p for p in (values.get("registry"), values["repository"]) if p)))
        for k, v in values.items():
            found += [(f"{path}.image", v)] if k == "image" and isinstance(v, str) else chart_value_images(v, f"{path}.{k}")
    elif isinstance(values, list):
        for i, v in enumerate(values):
            found += chart_value_images(v, f"{path}[{i}]")
    return found


def cluster_images(run) -> list[tuple[str, str]]:
    """(where, reference) of every image the stack's objects and its Helm releases' values name."""
    found = [(f"{name}{path}", ref) for name, obj in manifests(run).items() for path, ref in images.image_fields(obj)]
    for release in run.by_type(RELEASE):
        found += [(f"helm release {release.name} values{path}", ref) for path, ref in chart_value_images(release.inputs.get("values") or {})]
    return found


def docker_hub(found: list[tuple[str, str]]) -> list[str]:
    return [f"{where}: {ref}" for where, ref in found if images.from_docker_hub(ref)]


def test_the_shipped_stacks_are_all_scanned():
    assert {"dev", "prod", "teams", "workshop"} <= set(SHIPPED)


@pytest.mark.parametrize("stack", SHIPPED)
def test_no_object_of_a_shipped_stack_pulls_from_docker_hub(stack):
    found = cluster_images(run_stack(stack))
    assert len(found) >= 5, "the scan sees the stack's images"
    assert not docker_hub(found), f"{stack}: images from Docker Hub (anonymous pulls limited per address): {docker_hub(found)}"


def test_the_scan_sees_a_docker_hub_image():
    """The scan fails on a stack that names one: a job's own image from Docker Hub, kept as the
    stack file names it."""
    run = run_config(dev_config(trainjobs={"tf": {"image": versions.TENSORFLOW_RUNTIME_IMAGE}}))
    assert docker_hub(cluster_images(run)) == [f"trainjob-training-tf-mnist.yaml.spec.trainer.image: {versions.TENSORFLOW_RUNTIME_IMAGE}"]
    assert chart_value_images({"a": {"image": {"repository": "grafana/grafana", "tag": "1"}}, "b": [{"image": "busybox:1"}]}) == [(".a.image", "grafana/grafana"), (".b[0].image", "busybox:1")]


def test_runtimes_smoke_check_and_tf_job_run_the_stacks_copies():
    run = run_stack("dev")
    copies = {r.inputs["sources"][0]: r.state["ref"] for r in run.by_type(INDEX)}
    torch, tf = (images.repository_and_tag(r) for r in (versions.TORCH_RUNTIME_IMAGE, versions.TENSORFLOW_RUNTIME_IMAGE))
    assert set(copies) == {f"{torch[0]}:{torch[1]}", f"{tf[0]}:{tf[1]}"}, "each Docker Hub image the stack names by default, copied once"
    torch_copy, tf_copy = copies[f"{torch[0]}:{torch[1]}"], copies[f"{tf[0]}:{tf[1]}"]
    for ref in (torch_copy, tf_copy):
        assert ECR.match(ref) and "/training-dev-mirror/docker.io/" in ref and re.search(r":[\w.-]+@sha256:[0-9a-f]{64}$", ref)
    runtimes = {o["metadata"]["name"]: o for o in manifests(run).values() if o["kind"] == "ClusterTrainingRuntime"}
    trainer_images = {name: [ref for path, ref in images.image_fields(o) if "initializer" not in ref] for name, o in runtimes.items()}
    assert any(refs == [torch_copy] for name, refs in trainer_images.items() if name.startswith("torch-distributed-gpu-"))
    assert any(refs == [tf_copy] for name, refs in trainer_images.items() if name.startswith("tensorflow-distributed-"))
    smoke = [o for o in manifests(run).values() if o["kind"] == "Job" and o["metadata"]["name"].startswith("gpu-smoke-check")]
    assert smoke and smoke[0]["spec"]["template"]["spec"]["containers"][0]["image"] == torch_copy
    assert find(run, "TrainJob", "tf-mnist")["spec"]["trainer"]["image"] == tf_copy


def test_an_image_the_stack_file_names_is_kept():
    mine = "registry.example.com/ml/tf:2.20.0"
    run = run_config(dev_config(trainjobs={"tf": {"image": mine}}))
    assert find(run, "TrainJob", "tf-mnist")["spec"]["trainer"]["image"] == mine


def test_the_copies_live_in_immutable_repositories_and_outlive_a_new_pin():
    run = run_stack("dev")
    mirrors = [r for r in run.by_type(REPO) if r.name.startswith("images-")]
    assert sorted(r.inputs["name"] for r in mirrors) == ["training-dev-mirror/docker.io/pytorch/pytorch", "training-dev-mirror/docker.io/tensorflow/tensorflow"]
    assert all(r.inputs["imageTagMutability"] == "IMMUTABLE" and r.inputs["imageScanningConfiguration"] == {"scanOnPush": True} for r in mirrors)
    policies = {r.name: json.loads(r.inputs["policy"]) for r in run.by_type("aws:ecr/lifecyclePolicy:LifecyclePolicy") if r.name.startswith("images-")}
    assert len(policies) == 2 and all(p == json.loads(registry.lifecycle_policy(registry.KEEP_MIRRORED_IMAGES)) for p in policies.values())
    for copy in run.by_type(INDEX):
        url = next(r.state["repositoryUrl"] for r in mirrors if copy.name.startswith(r.name))
        tag = copy.inputs["sources"][0].rsplit(":", 1)[1]
        assert copy.inputs["tag"] == f"{url}:{tag}" and copy.inputs["push"] is True
        assert copy.inputs["registry"]["address"] == url.split("/")[0]
        assert copy.retain_on_delete, "pods started before a new pin keep pulling the old copy"
        assert copy.inputs["sources"][0].startswith("docker.io/")


@pytest.mark.parametrize("runtime", sorted(objects.RUNTIMES))
def test_trainctl_without_image_runs_the_image_of_the_clusters_runtime(runtime, tmp_path):
    (tmp_path / "train.py").write_text("print(1)\n")
    _, job = objects.build(objects.Request(namespace="vision", nodes=1, runtime=runtime, gpus_per_node=1, command=["python", "train.py"]), code.collect(tmp_path))
    assert "image" not in job["spec"]["trainer"], "no image of trainctl's own: the runtime's, which the cluster can pull"
    mine = "registry.example.com/ml/train:1"
    _, job = objects.build(objects.Request(namespace="vision", nodes=1, runtime=runtime, gpus_per_node=1, command=["python", "train.py"], image=mine), code.collect(tmp_path))
    assert job["spec"]["trainer"]["image"] == mine
    assert not hasattr(objects, "DEFAULT_IMAGES")


def test_trainjob_builder_names_no_image_only_when_asked():
    workload = tj.WORKLOADS["ddp"]
    cfg = {k.split(":", 1)[1]: v for k, v in dev_config().items() if k.startswith("training-platform:")}
    s = load_settings(cfg, stack="dev", region="us-west-2")
    job = s.trainjobs.jobs()["ddp"]
    assert "image" not in tj.trainjob(workload, job, s, code_configmap="c", image=tj.RUNTIME_IMAGE)["spec"]["trainer"]
    with pytest.raises(ValueError, match="no image"):
        tj.trainjob(workload, job, s, code_configmap="c")


# distribution/reference normalize.go splitDockerDomain: which host a reference names
@pytest.mark.parametrize(
    ("ref", "domain", "remainder"),
    [
        ("busybox:1.37.0", "docker.io", "library/busybox:1.37.0"),
        ("pytorch/pytorch:2.9.1-cuda12.8-cudnn9-runtime", "docker.io", "pytorch/pytorch:2.9.1-cuda12.8-cudnn9-runtime"),
        ("docker.io/ubuntu:24.04", "docker.io", "library/ubuntu:24.04"),
        ("index.docker.io/tensorflow/tensorflow:2.20.0-gpu", "docker.io", "tensorflow/tensorflow:2.20.0-gpu"),
        ("localhost/app:1", "localhost", "app:1"),
        ("localhost:5000/app:1", "localhost:5000", "app:1"),
        ("Example/app:1", "Example", "app:1"),
        ("public.ecr.aws/docker/library/busybox:1.37.0", "public.ecr.aws", "docker/library/busybox:1.37.0"),
        ("nvcr.io/nvidia/k8s-device-plugin:v0.20.0", "nvcr.io", "nvidia/k8s-device-plugin:v0.20.0"),
        ("ghcr.io/kubeflow/trainer/dataset-initializer:v2.3.0", "ghcr.io", "kubeflow/trainer/dataset-initializer:v2.3.0"),
    ],
)
def test_registry_of_a_reference_is_dockers_rule(ref, domain, remainder):
    assert images.split_domain(ref) == (domain, remainder)


def test_docker_hub_references():
    hub = ["busybox:1", "pytorch/pytorch:1", "docker.io/x/y:1", "index.docker.io/x/y:1", "registry-1.docker.io/x/y:1"]
    elsewhere = ["public.ecr.aws/docker/library/busybox:1", "123456789012.dkr.ecr.us-west-2.amazonaws.com/x:1", "registry.k8s.io/kueue/kueue:v0.19.2", "localhost:5000/x:1"]
    assert [images.from_docker_hub(r) for r in hub] == [True] * len(hub)
    assert [images.from_docker_hub(r) for r in elsewhere] == [False] * len(elsewhere)
    assert images.repository_and_tag("busybox:1.37.0") == ("docker.io/library/busybox", "1.37.0")
    with pytest.raises(ValueError):
        images.repository_and_tag("pytorch/pytorch@sha256:" + "0" * 64)


def test_with_images_replaces_only_the_named_images():
    obj = {"spec": {"containers": [{"name": "a", "image": "x/y:1"}, {"name": "b", "image": "other:2"}], "image_note": "x/y:1"}}
    assert images.with_images(obj, {"x/y:1": "ecr/x/y:1"}) == {"spec": {"containers": [{"name": "a", "image": "ecr/x/y:1"}, {"name": "b", "image": "other:2"}], "image_note": "x/y:1"}}
    assert images.with_images(obj, None) is obj


@pytest.mark.parametrize("cluster", ["training-dev", "Train_Me", "x" * 100])
def test_mirror_repository_names_fit_ecr(cluster):
    from config.names import ECR_REPOSITORY

    name = registry.mirror_repository_name(cluster, versions.TORCH_RUNTIME_IMAGE)
    assert ECR_REPOSITORY.fits(name) and re.fullmatch(r"(?:[a-z0-9]+(?:[._-][a-z0-9]+)*/)*[a-z0-9]+(?:[._-][a-z0-9]+)*", name)
    assert name.endswith("/docker.io/pytorch/pytorch")


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_every_node_role_may_pull_the_copies(stack):
    """The copies are in the stack's own ECR: the managed node groups' and Karpenter's node roles
    carry AmazonEC2ContainerRegistryReadOnly (every repository of the account)."""
    run = run_stack(stack)
    roles = {r.inputs["role"] for r in run.by_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment") if r.inputs["policyArn"].endswith(":policy/AmazonEC2ContainerRegistryReadOnly")}
    node_roles = {str(r.state.get("name") or r.inputs.get("name")) for r in run.by_type("aws:iam/role:Role") if "ec2.amazonaws.com" in json.dumps(r.inputs.get("assumeRolePolicy"))}
    assert node_roles and node_roles <= roles, f"node roles without ECR read: {sorted(node_roles - roles)}"
