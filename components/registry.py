"""The training image: an ECR repository the stack owns, and the image built from ``workloads/``
and pushed there (pulumi-docker-build, BuildKit).

The tag is a content hash of what the build reads (the Dockerfile, the files it copies from the
context, and the build args from ``versions.py``), so a change to any of them pushes a new tag;
tags are immutable, so an old tag never changes under a running job. TrainJobs use the pushed
image by digest (``<repository url>@sha256:...``): a rebuild that yields a new digest changes
(and so replaces) the TrainJobs, a rebuild that yields the same image does not.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import re
import shlex
from collections.abc import Mapping

import pulumi
import pulumi_aws as aws
import pulumi_docker_build as docker_build

import versions
from config.names import ECR_REPOSITORY

PROJECT_DIR = pathlib.Path(__file__).resolve().parent.parent
CONTEXT = "workloads"  # relative to the project directory, where Pulumi runs the program
DOCKERFILE = "Dockerfile"
PLATFORM = "linux/amd64"  # p5 / g6e and every other GPU type of the catalog are x86_64
TAG_LEN = 20
UNTAGGED_EXPIRE_DAYS = 7
KEEP_TAGGED_IMAGES = 30


def _instructions(dockerfile: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction: continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in dockerfile.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = (pending + stripped).strip()
        pending = ""
        if full:
            word, _, rest = full.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def copied_sources(dockerfile: str) -> list[str]:
    """The context paths the Dockerfile's COPY/ADD instructions read (not ``--from`` copies)."""
    sources: list[str] = []
    for word, rest in _instructions(dockerfile):
        if word not in ("COPY", "ADD"):
            continue
        if rest.startswith("["):
            args = json.loads(rest)
        else:
            args = shlex.split(rest)
        flags = [a for a in args if a.startswith("--")]
        if any(f.startswith("--from") for f in flags):
            continue
        paths = [a for a in args if not a.startswith("--")]
        sources += paths[:-1]
    return sources


def context_files(context: pathlib.Path) -> dict[str, bytes]:
    """What the build reads from ``context``: the Dockerfile and every file its COPY/ADD sources
    name (globs and directories expanded), by path relative to the context. Other files in the
    directory (the Pulumi builders, the training programs shipped in the code ConfigMap) are not
    part of the image and do not change its tag."""
    dockerfile = context / DOCKERFILE
    files = {DOCKERFILE: dockerfile.read_bytes()}
    for src in copied_sources(dockerfile.read_text()):
        matches = sorted(context.glob(src.lstrip("/"))) or [context / src]
        for m in matches:
            if not m.exists():
                raise FileNotFoundError(f"{DOCKERFILE} copies {src!r}, which is not in the build context {context.name}/")
            for f in sorted(m.rglob("*")) if m.is_dir() else [m]:
                if f.is_file():
                    files[f.relative_to(context).as_posix()] = f.read_bytes()
    return files


def content_tag(files: Mapping[str, bytes], build_args: Mapping[str, str]) -> str:
    """A tag that changes whenever a file the build reads or a build arg changes."""
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(b"file\0" + name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    for key in sorted(build_args):
        h.update(b"arg\0" + key.encode() + b"\0" + build_args[key].encode() + b"\0")
    return h.hexdigest()[:TAG_LEN]


def image_tag(context: pathlib.Path | None = None, build_args: Mapping[str, str] | None = None) -> str:
    return content_tag(context_files(context or PROJECT_DIR / CONTEXT), versions.WORKLOAD_BUILD_ARGS if build_args is None else build_args)


def repository_name(cluster_name: str) -> str:
    """``<cluster>/workloads``-like, in ECR's alphabet: lowercase, single separators between
    alphanumerics. A cluster name that had to change for that gets a hash of the original, so
    ``Train`` and ``train`` stay two repositories."""
    base = re.sub(r"[^a-z0-9]+", "-", cluster_name.lower()).strip("-") or "cluster"
    if base != cluster_name:
        base = f"{base}-{hashlib.sha256(cluster_name.encode()).hexdigest()[:8]}"
    return ECR_REPOSITORY.name(base, "workloads")


def lifecycle_policy() -> str:
    """Untagged images (left behind by rebuilds) expire after a week; of the tagged ones the
    newest ``KEEP_TAGGED_IMAGES`` stay, so recent jobs can still pull what they were started with."""
    rules = [
        {
            "rulePriority": 1,
            "description": f"expire untagged images after {UNTAGGED_EXPIRE_DAYS} days",
            "selection": {"tagStatus": "untagged", "countType": "sinceImagePushed", "countUnit": "days", "countNumber": UNTAGGED_EXPIRE_DAYS},
            "action": {"type": "expire"},
        },
        {
            "rulePriority": 2,
            "description": f"keep the newest {KEEP_TAGGED_IMAGES} images",
            "selection": {"tagStatus": "any", "countType": "imageCountMoreThan", "countNumber": KEEP_TAGGED_IMAGES},
            "action": {"type": "expire"},
        },
    ]
    return json.dumps({"rules": rules}, sort_keys=True)


class TrainingImage(pulumi.ComponentResource):
    """The ECR repository and the training image built into it; ``ref`` is ``<repo url>@<digest>``."""

    repository: aws.ecr.Repository
    image: docker_build.Image
    tag: str
    ref: pulumi.Output[str]

    def __init__(self, name: str, *, cluster_name: str, tags: dict[str, str], opts: pulumi.ResourceOptions | None = None):
        super().__init__("training-platform:infra:TrainingImage", name, None, opts)
        self.repository = aws.ecr.Repository(
            name,
            name=repository_name(cluster_name),
            image_tag_mutability="IMMUTABLE",
            image_scanning_configuration={"scan_on_push": True},
            encryption_configurations=[{"encryption_type": "AES256"}],
            # the repository only holds what this stack built: removing it (every job brings its
            # own image) removes the images too
            force_delete=True,
            tags=tags,
            opts=pulumi.ResourceOptions(parent=self),
        )
        aws.ecr.LifecyclePolicy(name, repository=self.repository.name, policy=lifecycle_policy(), opts=pulumi.ResourceOptions(parent=self))
        token = aws.ecr.get_authorization_token_output(registry_id=self.repository.registry_id, opts=pulumi.InvokeOutputOptions(parent=self))
        self.tag = image_tag()
        url = self.repository.repository_url
        self.image = docker_build.Image(
            name,
            context={"location": CONTEXT},
            dockerfile={"location": f"{CONTEXT}/{DOCKERFILE}"},
            platforms=[docker_build.Platform.LINUX_AMD64],
            build_args=dict(versions.WORKLOAD_BUILD_ARGS),
            tags=[url.apply(lambda u: f"{u}:{self.tag}")],
            push=True,
            registries=[{"address": url.apply(lambda u: u.split("/", 1)[0]), "username": token.user_name, "password": pulumi.Output.secret(token.password)}],
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.ref = pulumi.Output.all(url, self.image.digest).apply(lambda a: f"{a[0]}@{a[1]}")
        self.register_outputs({"repositoryUrl": url, "tag": self.tag, "ref": self.ref})
