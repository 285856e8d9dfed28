"""The training image: the Dockerfile's pins are versions.py's, the stack builds it into its own
ECR repository, and TrainJobs run it by digest."""

from __future__ import annotations

import json
import pathlib
import re
import shutil

import pytest

import versions
from config.names import ECR_REPOSITORY
from config.settings import TrainerSettings
from infra import build_context, registry
from k8s.builders.runtimes import EFA_ENV
from tests.conftest import PROJECT, dev_config, find, run_config, run_stack
from versions import WORKLOAD_BUILD_ARGS

DOCKERFILE = PROJECT / "workloads" / "Dockerfile"
ECR_PATTERN = re.compile(r"(?:[a-z0-9]+(?:[._-][a-z0-9]+)*/)*[a-z0-9]+(?:[._-][a-z0-9]+)*")
REPO = "aws:ecr/repository:Repository"
POLICY = "aws:ecr/lifecyclePolicy:LifecyclePolicy"
BUILD = "docker-build:index:Image"


def instructions() -> list[tuple[str, str]]:
    return registry._instructions(DOCKERFILE.read_text())


def arg_defaults() -> dict[str, str]:
    out = {}
    for word, rest in instructions():
        if word == "ARG" and "=" in rest:
            key, _, value = rest.partition("=")
            out[key] = value
    return out


# --- the Dockerfile --------------------------------------------------------------------------


def test_dockerfile_build_args_default_to_versions_py():
    defaults = arg_defaults()
    for key, value in versions.WORKLOAD_BUILD_ARGS.items():
        assert defaults.get(key) == value, f"ARG {key} defaults to {defaults.get(key)!r}, versions.py says {value!r}"
    assert instructions()[1] == ("FROM", "${BASE_IMAGE}"), "the base image comes from the BASE_IMAGE build arg"


def test_dockerfile_installs_efa_and_checks_the_pinned_plugin_and_libfabric():
    runs = " ".join(rest for word, rest in instructions() if word == "RUN")
    assert "https://efa-installer.amazonaws.com/aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz" in runs
    assert "./efa_installer.sh -y --skip-kmod --skip-limit-conf --no-verify" in runs
    assert "libnccl-ofi" in runs and "${AWS_OFI_NCCL_VERSION}" in runs, "the build checks the installed aws-ofi-nccl version"
    assert "fi_info --version" in runs and "${LIBFABRIC_VERSION}" in runs, "the build checks the installed libfabric version"
    env = " ".join(rest for word, rest in instructions() if word == "ENV")
    assert "/opt/amazon/ofi-nccl/lib" in env and "/opt/amazon/efa/lib" in env


def test_efa_environment_is_set_per_job_not_in_the_image():
    env = " ".join(rest for word, rest in instructions() if word == "ENV")
    assert "FI_PROVIDER" not in env, "FI_PROVIDER=efa in the image breaks jobs on nodes without EFA"
    assert {"name": "FI_PROVIDER", "value": "efa"} in EFA_ENV and {"name": "FI_EFA_USE_DEVICE_RDMA", "value": "1"} in EFA_ENV


def test_image_runs_as_the_non_root_user_the_runtimes_and_volumes_are_prepared_for():
    """The image ends as the uid the runtimes run trainer pods as, and the uid the checkpoint
    volume's root is handed to before jobs start (a new FSx/EFS root is root-owned, no fsGroup)."""
    from k8s.builders.runtimes import torch_runtime
    from k8s.builders.volume_setup import checkpoint_owner_job, owner_script

    run = " ".join(rest for word, rest in instructions() if word == "RUN")
    assert 'useradd --uid "${TRAINING_UID}"' in run
    users = [rest for word, rest in instructions() if word == "USER"]
    assert users == ["${TRAINING_UID}:${TRAINING_UID}"] and instructions()[-1][0] == "USER"
    uid = int(WORKLOAD_BUILD_ARGS["TRAINING_UID"])
    pod = torch_runtime(TrainerSettings())["spec"]["template"]["spec"]["replicatedJobs"][-1]["template"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == uid
    job = checkpoint_owner_job("training", uid=uid, image="busybox:1")
    assert job["spec"]["template"]["spec"]["containers"][0]["command"][-1] == owner_script(uid) and f"chown {uid}:{uid}" in owner_script(uid)


def test_python_dependencies_are_pinned():
    lines = [ln.strip() for ln in (PROJECT / "workloads" / "requirements.txt").read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert lines and all(re.fullmatch(r"[A-Za-z0-9_.\[\]-]+==[\w.]+", ln) for ln in lines), lines


def test_make_image_passes_the_build_args():
    make = (PROJECT / "Makefile").read_text()
    target = make[make.index("\nimage:") :].split("\n\n")[0]
    assert "WORKLOAD_BUILD_ARGS" in target and "--build-arg" in target


# --- the content tag ------------------------------------------------------------------------


def _copy_context(tmp_path: pathlib.Path) -> pathlib.Path:
    ctx = tmp_path / "workloads"
    shutil.copytree(PROJECT / "workloads", ctx, ignore=shutil.ignore_patterns("__pycache__"))
    return ctx


def test_tag_follows_what_the_build_reads(tmp_path: pathlib.Path):
    ctx = _copy_context(tmp_path)
    files = registry.context_files(ctx)
    assert set(files) == {"Dockerfile", "requirements.txt"}, "the build reads the Dockerfile and what it copies"
    tag = registry.image_tag(ctx)
    assert re.fullmatch(r"[0-9a-f]{20}", tag) and tag == registry.image_tag(ctx)
    (ctx / "requirements.txt").write_text((ctx / "requirements.txt").read_text() + "numpy==2.0.0\n")
    assert registry.image_tag(ctx) != tag, "a changed requirement pushes a new tag"
    changed = registry.image_tag(ctx)
    (ctx / "programs" / "ddp_mnist.py").write_text("# shipped in the code ConfigMap, not the image\n")
    (ctx / "trainjob.py").write_text("# the Pulumi builders are not in the image\n")
    assert registry.image_tag(ctx) == changed
    assert registry.image_tag(ctx, {**versions.WORKLOAD_BUILD_ARGS, "EFA_INSTALLER_VERSION": "9.9.9"}) != changed, "a version bump pushes a new tag"
    (ctx / "requirements.txt").chmod(0o755)
    assert registry.image_tag(ctx) != changed, "COPY keeps the executable bit: a new one is a new tag (the umask's bits are not: tests/test_image_pushes.py)"


# --- the context the provider hashes (pulumi-docker-build 0.0.22, infra/build_context.py) ---


def test_the_provider_hashes_exactly_what_the_tag_hashes():
    ctx = PROJECT / "workloads"
    assert registry.provider_files(ctx) == set(registry.context_files(ctx))
    assert registry.context_problem(ctx) is None


def test_the_ignore_file_is_generated_from_the_dockerfile():
    """workloads/.dockerignore is the file the provider reads (no Dockerfile.dockerignore, which
    would take precedence: context.go getIgnorePatterns) and is what dockerignore_text makes."""
    ctx = PROJECT / "workloads"
    assert build_context.ignore_file(ctx, ctx / "Dockerfile") == ctx / ".dockerignore"
    expected = registry.dockerignore_text(DOCKERFILE.read_text())
    assert (ctx / ".dockerignore").read_text() == expected, f"workloads/.dockerignore must read:\n{expected}"


def test_programs_stray_files_and_caches_change_neither_the_tag_nor_the_provider_hash(tmp_path: pathlib.Path):
    ctx = _copy_context(tmp_path)
    dockerfile = ctx / "Dockerfile"
    tag, hashed = registry.image_tag(ctx), build_context.context_hash(ctx, dockerfile)
    (ctx / "programs" / "ddp_mnist.py").write_text("# edited\n")
    (ctx / "programs" / "__pycache__").mkdir()
    (ctx / "programs" / "__pycache__" / "ddp_mnist.cpython-312.pyc").write_bytes(b"\0")
    (ctx / "__pycache__").mkdir()
    (ctx / "__pycache__" / "x.pyc").write_bytes(b"\0")
    (ctx / ".DS_Store").write_bytes(b"\0")
    (ctx / "requirements-tf.txt").write_text("tensorflow-cpu==0\n")
    assert registry.image_tag(ctx) == tag
    assert build_context.context_hash(ctx, dockerfile) == hashed, "the provider would rebuild and push the same tag again"
    assert registry.provider_files(ctx) == {"Dockerfile", "requirements.txt"}
    (ctx / "requirements.txt").write_text("torch==0\n")
    assert registry.image_tag(ctx) != tag and build_context.context_hash(ctx, dockerfile) != hashed


def test_without_the_ignore_file_the_provider_would_hash_the_programs(tmp_path: pathlib.Path):
    """Why the file exists: the provider's context is the whole directory, so a program edit
    would rebuild the image and push the unchanged tag to the IMMUTABLE repository."""
    ctx = _copy_context(tmp_path)
    (ctx / ".dockerignore").unlink()
    assert "programs/ddp_mnist.py" in registry.provider_files(ctx)
    before = build_context.context_hash(ctx, ctx / "Dockerfile")
    (ctx / "programs" / "ddp_mnist.py").write_text("# edited\n")
    assert build_context.context_hash(ctx, ctx / "Dockerfile") != before
    problem = registry.context_problem(ctx)
    assert problem and "also hashed: [" in problem and "workloads/.dockerignore" in problem and "\n" not in problem


def test_a_dockerfile_specific_ignore_file_takes_precedence(tmp_path: pathlib.Path):
    ctx = _copy_context(tmp_path)
    (ctx / "Dockerfile.dockerignore").write_text("programs\n")  # leaves everything else in the directory
    everything = {p.relative_to(ctx).as_posix() for p in ctx.rglob("*") if p.is_file()}
    assert registry.provider_files(ctx) == {p for p in everything if not p.startswith("programs/")}
    assert {"requirements-tf.txt", ".dockerignore", "Dockerfile.dockerignore"} <= registry.provider_files(ctx)
    assert "workloads/Dockerfile.dockerignore" in (registry.context_problem(ctx) or "")


def test_a_new_copy_source_is_checked(tmp_path: pathlib.Path):
    ctx = _copy_context(tmp_path)
    (ctx / "Dockerfile").write_text(DOCKERFILE.read_text() + "COPY programs/launch.py /opt/launch.py\n")
    assert "programs/launch.py" in (registry.context_problem(ctx) or ""), "copied but excluded from the context"
    (ctx / ".dockerignore").write_text(registry.dockerignore_text((ctx / "Dockerfile").read_text()))
    assert registry.context_problem(ctx) is None
    assert registry.provider_files(ctx) == {"Dockerfile", "requirements.txt", "programs/launch.py"}


@pytest.mark.parametrize(
    ("dockerfile", "patterns"),
    [
        ("FROM a\nCOPY ./x.txt /x\n", ["*", "!x.txt"]),
        ("FROM a\nCOPY --chown=1:1 dir/ /d/\nADD https://example.com/f /f\n", ["*", "!dir"]),
        ("FROM a\nCOPY . /app\n", []),
    ],
)
def test_dockerignore_text(dockerfile, patterns):
    assert build_context.read_ignore_file(registry.dockerignore_text(dockerfile)) == patterns


# patternmatcher v0.6.1 patternmatcher_test.go TestMatches (a selection): pattern(s), path, excluded
PATTERN_CASES = [
    (["**"], "dir/file", True),
    (["dir/**"], "dir/dir2/file", True),
    (["**/dir2/*"], "dir/dir2/file", True),
    (["**/file*.txt"], "dir/dir/file.txt", True),
    (["**/**/*.txt2"], "dir/dir/file.txt", False),
    (["**/*.txt"], "file.txt", True),
    (["a**/*.txt"], "a/dir/dir/file.txt", True),
    (["a/*.txt"], "a/dir/file.txt", False),
    (["a[b-d]e"], "ace", True),
    (["a[^b-d]e"], "aze", True),
    ([".*"], "foo", False),
    (["abc.def"], "abcZdef", False),
    (["abc?def"], "abcZdef", True),
    (["abc/**"], "abc", False),
    (["**/.foo"], "bar.foo", False),
    (["a.|)$(}+{bc"], "a.|)$(}+{bc", True),
    (["a\\*b"], "a*b", True),
    (["**", "!util/docker/web"], "util/docker/web/foo", False),
    (["**", "!util/docker/web", "util/docker/web/foo"], "util/docker/web/foo", True),
    (["**", "!dist/*.whl"], "dist/proxy.py-2.4.0rc3.dev36+g08acad9-py3-none-any.whl", False),
    (["docs", "!docs/README.md"], "docs/README.md", False),  # TestPatternMatchesFolderExclusions
]


@pytest.mark.parametrize(("patterns", "path", "excluded"), PATTERN_CASES)
def test_pattern_semantics_are_patternmatchers(patterns, path, excluded):
    compiled = build_context.compile_patterns(patterns)
    parent = None
    parts = path.split("/")[:-1]
    for n in range(len(parts)):  # the walk matches each directory above first
        _, parent = build_context.matches(compiled, "/".join(parts[: n + 1]), parent)
    assert build_context.matches(compiled, path, parent)[0] is excluded
    assert build_context.matches(compiled, path, None)[0] is excluded, "without the parents' results, as MatchesOrParentMatches"


def test_ignore_file_parsing_is_ignorefiles():
    """ignorefile.ReadAll v0.6.1: BOM, comments only at column 0, trimmed, cleaned, leading / dropped."""
    text = "\ufeff# c\n  # not a comment\n\n /a/./b/ \n! /c\n*\n"
    assert build_context.read_ignore_file(text) == ["# not a comment", "a/b", "!c", "*"]


def test_modes_are_gos_filemode_strings():
    import stat as st

    assert build_context.go_mode(st.S_IFREG | 0o644) == "-rw-r--r--"
    assert build_context.go_mode(st.S_IFREG | 0o4755) == "urwxr-xr-x"
    assert build_context.go_mode(st.S_IFLNK | 0o777) == "Lrwxrwxrwx"


def test_content_tag_is_a_pure_function_of_files_and_args():
    a = registry.content_tag({"Dockerfile": b"FROM x\n"}, {"A": "1"})
    assert a == registry.content_tag({"Dockerfile": b"FROM x\n"}, {"A": "1"})
    assert a != registry.content_tag({"Dockerfile": b"FROM y\n"}, {"A": "1"})
    assert a != registry.content_tag({"Dockerfile": b"FROM x\n"}, {"A": "2"})
    assert a != registry.content_tag({"Dockerfile": b"FROM x\n", "b.txt": b""}, {"A": "1"})


def test_copied_sources_reads_copy_and_add_but_not_other_stages():
    text = 'FROM a AS b\nCOPY --chown=1:1 x.txt y/ /dst/\nADD ["z.txt", "/z"]\nCOPY --from=b /opt /opt\nRUN echo COPY nope\n'
    assert registry.copied_sources(text) == ["x.txt", "y/", "z.txt"]


@pytest.mark.parametrize("cluster", ["training-dev", "Train_Me", "a--b", "x" * 100, "A"])
def test_repository_names_fit_ecr(cluster):
    name = registry.repository_name(cluster)
    assert ECR_REPOSITORY.fits(name) and ECR_PATTERN.fullmatch(name), name
    assert len(name) >= 2


def test_repository_names_stay_distinct():
    names = {registry.repository_name(c) for c in ("train", "Train", "TRAIN", "tr_ain", "tr-ain")}
    assert len(names) == 5


# --- the rendered stack -----------------------------------------------------------------------


def test_dev_builds_the_image_into_its_own_repository_and_jobs_use_the_digest():
    run = run_stack("dev")
    repo = run.one(REPO, "workloads")
    assert repo.inputs["imageTagMutability"] == "IMMUTABLE"
    assert repo.inputs["imageScanningConfiguration"] == {"scanOnPush": True}
    assert repo.inputs["encryptionConfigurations"][0]["encryptionType"] in ("AES256", "KMS")
    policy = json.loads(run.one(POLICY, "workloads").inputs["policy"])
    assert {r["selection"]["tagStatus"] for r in policy["rules"]} == {"tagged", "untagged", "any"}  # tagged: the current tag, protected (test_image_pushes.py)
    build = run.one(BUILD)
    assert build.inputs["context"] == {"location": "workloads"} and build.inputs["push"] is True
    assert build.inputs["platforms"] == ["linux/amd64"]
    assert build.inputs["buildArgs"] == versions.WORKLOAD_BUILD_ARGS
    # not built on preview (the default, true, builds the CUDA image in every PR's preview), never
    # pull (a rebuild on every update), and every other input the provider's Diff compares is in the tag
    assert build.inputs["buildOnPreview"] is False and build.inputs.get("pull") is False
    compared = {"context": build.inputs["context"]["location"], "dockerfile": build.inputs["dockerfile"]["location"], "platforms": ",".join(build.inputs["platforms"]),
                "push": build.inputs["push"], "pull": build.inputs["pull"], "buildOnPreview": build.inputs["buildOnPreview"]}
    assert compared == registry.BUILD_SETTINGS
    # the rest: the build args (in the tag), the destination, and the SDK's default network (constant)
    assert set(build.inputs) - set(compared) == {"buildArgs", "tags", "registries", "network"} and build.inputs["network"] == "default"
    url = repo.state["repositoryUrl"]
    assert url == f"123456789012.dkr.ecr.us-west-2.amazonaws.com/{repo.inputs['name']}"
    assert build.inputs["tags"] == [f"{url}:{registry.image_tag()}"]
    assert build.inputs["registries"][0]["address"] == url.split("/")[0]
    digest = build.state["digest"]
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest)
    for job in ("ddp-mnist", "fsdp-t5"):
        assert find(run, "TrainJob", job)["spec"]["trainer"]["image"] == f"{url}@{digest}"
    assert run.outputs["trainingImage"] == f"{url}@{digest}"


def test_china_regions_get_the_cn_registry_domain():
    cfg = dev_config(**{"aws:region": "cn-north-1"})  # the same config test_aws_facts renders there
    cfg["training-platform:cluster"] = json.loads(json.dumps(cfg["training-platform:cluster"]).replace('"arn:aws:', '"arn:aws-cn:'))  # the partition's ARNs
    run = run_config(cfg)
    repo = run.one(REPO, "workloads")
    assert repo.state["repositoryUrl"] == f"123456789012.dkr.ecr.cn-north-1.amazonaws.com.cn/{repo.inputs['name']}"
    assert repo.state["arn"].startswith("arn:aws-cn:ecr:cn-north-1:")


def test_jobs_with_their_own_images_build_nothing():
    mine = "registry.example.com/team/train:1.2.3"
    # the TF job's default is the TensorFlow image (versions.py), never the built one
    run = run_config(dev_config(trainjobs={"ddp": {"image": mine}, "fsdp": {"image": mine}, "ncclCheck": {"image": mine}}))
    assert not [r for r in run.by_type(REPO) + run.by_type(POLICY) if r.name == "workloads"] and not run.by_type(BUILD)
    assert find(run, "TrainJob", "ddp-mnist")["spec"]["trainer"]["image"] == mine
    assert "trainingImage" not in run.outputs


def test_a_job_without_an_image_still_gets_the_built_one():
    mine = "registry.example.com/team/train:1.2.3"
    run = run_config(dev_config(trainjobs={"ddp": {"image": mine}}))
    build = run.one(BUILD)
    assert find(run, "TrainJob", "ddp-mnist")["spec"]["trainer"]["image"] == mine
    assert find(run, "TrainJob", "fsdp-t5")["spec"]["trainer"]["image"].endswith("@" + build.state["digest"])
