"""The training image: an ECR repository the stack owns, and the image built from ``workloads/``
and pushed there (pulumi-docker-build, BuildKit).

The tag is a content hash of what the build reads (the Dockerfile, the files it copies from the
context with their modes, and the build args from ``versions.py``) and of the build settings the
provider compares, so a change to any of them pushes a new tag; tags are immutable, so an old tag
never changes under a running job. TrainJobs use the pushed image by digest
(``<repository url>@sha256:...``): a rebuild that yields a new digest changes (and so replaces)
the TrainJobs, a rebuild that yields the same image does not.

Never a second push of one tag. pulumi-docker-build 0.0.22 rebuilds and pushes an Image exactly
when its ``Diff`` (``provider/internal/image.go``) finds a change: an input it compares, or the
hash of the build context (``provider/internal/context.go``: every file of the context directory
that the ignore file leaves, with its path and mode; components/build_context.py). So the context
is narrowed to what the tag hashes (``workloads/.dockerignore``, generated from the Dockerfile's
COPY sources by :func:`dockerignore_text`, checked before the build is registered), and the
tag hashes every compared input the stack sets (:data:`BUILD_SETTINGS`): whenever the provider
would push, the tag is new. Unchanged inputs push nothing, on any machine, with or without a
layer cache. ``pull`` stays off: with it the provider rebuilds on every update (``Diff``:
"pull=true indicates that we want to keep base layers up-to-date"). ``buildOnPreview`` is off:
a preview only hashes the context (``Create`` returns before building on a dry run).
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import re
import shlex
from collections.abc import Iterable, Mapping

import pulumi
import pulumi_aws as aws
import pulumi_docker_build as docker_build

import versions
from components import build_context
from config.names import ECR_REPOSITORY

PROJECT_DIR = pathlib.Path(__file__).resolve().parent.parent
CONTEXT = "workloads"  # relative to the project directory, where Pulumi runs the program
DOCKERFILE = "Dockerfile"
PLATFORM = "linux/amd64"  # p5 / g6e and every other GPU type of the catalog are x86_64
# The Image inputs besides files and build args that pulumi-docker-build 0.0.22's Image.Diff compares
# and the stack sets (tags and registries name the destination: a new repository is a new place). A
# change to one makes the provider rebuild and push, so each is part of the tag.
BUILD_SETTINGS: dict[str, str | bool] = {
    "context": CONTEXT,
    "dockerfile": f"{CONTEXT}/{DOCKERFILE}",
    "platforms": PLATFORM,
    "push": True,
    "pull": False,  # true: a rebuild on every update (Image.Diff)
    "buildOnPreview": False,  # the default (true) builds the multi-GB image in every preview
}
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
    """The context paths the Dockerfile's COPY/ADD instructions read (not ``--from`` copies, not
    ADD's URLs)."""
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
        sources += [p for p in paths[:-1] if "://" not in p]
    return sources


def dockerignore_text(dockerfile: str) -> str:
    """The ignore file that leaves in the build context exactly what the Dockerfile copies:
    everything excluded (``*``; a directory's contents go with it), then each COPY/ADD source
    re-included (``!source``). A source that is the whole context (``.``) needs no file."""
    sources = [build_context.go_clean(s).lstrip("/") or "." for s in copied_sources(dockerfile)]
    header = (
        f"# Generated from {DOCKERFILE}'s COPY/ADD sources (components/registry.py dockerignore_text): the build context\n"
        "# is exactly what the image tag hashes, so a file the image does not copy never triggers a rebuild.\n"
    )
    if "." in sources:
        return header
    return header + "*\n" + "".join(f"!{s}\n" for s in dict.fromkeys(sources))


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


def context_modes(context: pathlib.Path, names: Iterable[str]) -> dict[str, str]:
    """Each file's mode as the provider hashes it (Go ``FileMode.String()`` of its lstat): COPY
    keeps a file's mode in the image, and the provider rebuilds on a mode change."""
    return {n: build_context.go_mode((context / n).lstat().st_mode) for n in names}


def content_tag(files: Mapping[str, bytes], build_args: Mapping[str, str], modes: Mapping[str, str] | None = None, settings: Mapping[str, str | bool] | None = None) -> str:
    """A tag that changes whenever a file the build reads (its content or mode), a build arg or a
    build setting changes."""
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(b"file\0" + name.encode() + b"\0" + (modes or {}).get(name, "").encode() + b"\0" + hashlib.sha256(files[name]).digest())
    for key in sorted(build_args):
        h.update(b"arg\0" + key.encode() + b"\0" + build_args[key].encode() + b"\0")
    if settings:
        h.update(b"settings\0" + json.dumps(dict(settings), sort_keys=True).encode())
    return h.hexdigest()[:TAG_LEN]


def image_tag(context: pathlib.Path | None = None, build_args: Mapping[str, str] | None = None) -> str:
    context = context or PROJECT_DIR / CONTEXT
    files = context_files(context)
    return content_tag(files, versions.WORKLOAD_BUILD_ARGS if build_args is None else build_args, context_modes(context, files), BUILD_SETTINGS)


def provider_files(context: pathlib.Path) -> set[str]:
    """The files whose content pulumi-docker-build 0.0.22's context hash reads: the Dockerfile
    (read by itself, ``hashDockerfile``) and what the context walk leaves (build_context)."""
    return {DOCKERFILE, *build_context.hashed_files(context, context / DOCKERFILE)}


def context_problem(context: pathlib.Path) -> str | None:
    """One line when the provider would hash other files than the tag does (a change to one of
    them would push the same tag again), else None."""
    tagged, hashed = set(context_files(context)), provider_files(context)
    if tagged == hashed:
        return None
    extra, missing = sorted(hashed - tagged), sorted(tagged - hashed)
    ignore = build_context.ignore_file(context, context / DOCKERFILE)
    where = ignore.relative_to(context.parent).as_posix() if ignore else f"{context.name}/{build_context.IGNORE_FILE}"
    return (
        f"{context.name}/: the image build context is not what the image tag hashes"
        f"{f' (also hashed: {extra[:5]})' if extra else ''}{f' (not in the context: {missing[:5]})' if missing else ''};"
        f" {where} must be components.registry.dockerignore_text of {DOCKERFILE}"
    )


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
        if problem := context_problem(PROJECT_DIR / CONTEXT):
            raise pulumi.RunError(problem)
        self.tag = image_tag()
        url = self.repository.repository_url
        self.image = docker_build.Image(
            name,
            context={"location": CONTEXT},
            dockerfile={"location": f"{CONTEXT}/{DOCKERFILE}"},
            platforms=[docker_build.Platform(PLATFORM)],
            build_args=dict(versions.WORKLOAD_BUILD_ARGS),
            tags=[url.apply(lambda u: f"{u}:{self.tag}")],
            push=True,
            pull=False,
            build_on_preview=False,
            registries=[{"address": url.apply(lambda u: u.split("/", 1)[0]), "username": token.user_name, "password": pulumi.Output.secret(token.password)}],
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.ref = pulumi.Output.all(url, self.image.digest).apply(lambda a: f"{a[0]}@{a[1]}")
        self.register_outputs({"repositoryUrl": url, "tag": self.tag, "ref": self.ref})
