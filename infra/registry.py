"""The training image: an ECR repository the stack owns, and the image built from ``workloads/``
and pushed there (pulumi-docker-build, BuildKit); the one rule every image the stack pushes follows
(the portal's and the mirrored copies too).

The tag is a content hash of what the build reads (the Dockerfile, the files it copies from the
context, whether each is executable, and the build args from ``versions.py``) and of the build
settings the provider compares: nothing of the deployer's machine (umask, clock, checkout path), so
every machine computes the same tag for the same inputs. TrainJobs use the pushed image by digest
(``<repository url>@sha256:...``).

Never a second push of one tag (our repositories are IMMUTABLE). pulumi-docker-build 0.0.22 diffs an
``Image`` only against its own last state (``provider/internal/image.go`` ``Diff``: the inputs, and
the hash of the build context with each file's full mode, ``context.go``) and pushes without asking
the registry. So the stack asks the registry at deploy (ECR ListImages through ``aws.ecr.get_images``)
and registers a build only for a tag the repository does not hold; a tag it holds (a revert of the
inputs, a deployer with another umask, a second machine) is used by the digest the registry gives,
and nothing is built or pushed. Builds are ``retain_on_delete``: the provider's ``Image.Delete``
deletes the pushed digest from the registry, and a build leaves the program once its tag is held.
The context is still narrowed to what the tag hashes (``workloads/.dockerignore``, generated from the
Dockerfile's COPY sources by :func:`dockerignore_text`), so a file the image does not copy never
makes a new tag. ``pull`` stays off (with it the provider rebuilds on every update); ``buildOnPreview``
is off (a preview only hashes the context). No registry cache (``cacheTo``) in the repository:
BuildKit re-pushes its cache manifest under the same tag on every build, which IMMUTABLE refuses.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import re
import shlex
import stat
from collections.abc import Iterable, Mapping
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_docker_build as docker_build

import versions
from config.names import ECR_REPOSITORY
from infra import build_context, deploy_state
from k8s.builders import images

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
KEEP_MIRRORED_IMAGES = 5  # per copied repository: the current pin and a few before it


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
        f"# Generated from {DOCKERFILE}'s COPY/ADD sources (infra/registry.py dockerignore_text): the build context\n"
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


def portable_mode(st_mode: int) -> str:
    """What of a file's mode the tag hashes: its kind and whether it is executable, as git records
    it (``100644`` / ``100755``), in Go's ``FileMode.String()`` form. The permission bits that the
    deployer's umask decides (group and other write, a private checkout's missing read bits) are
    left out, so machines with different umasks compute the same tag."""
    if stat.S_ISLNK(st_mode):
        return build_context.go_mode(stat.S_IFLNK | 0o777)
    return build_context.go_mode(stat.S_IFREG | (0o755 if st_mode & stat.S_IXUSR else 0o644))


def context_modes(context: pathlib.Path, names: Iterable[str]) -> dict[str, str]:
    """Each file's :func:`portable_mode` (of its lstat): COPY keeps a file's executable bit in the
    image, so a change of it is a new image."""
    return {n: portable_mode((context / n).lstat().st_mode) for n in names}


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
        f" {where} must be infra.registry.dockerignore_text of {DOCKERFILE}"
    )


def _base(cluster_name: str) -> str:
    """The cluster name in ECR's alphabet: lowercase, single separators between alphanumerics. A
    cluster name that had to change for that gets a hash of the original, so ``Train`` and
    ``train`` stay apart."""
    base = re.sub(r"[^a-z0-9]+", "-", cluster_name.lower()).strip("-") or "cluster"
    if base != cluster_name:
        base = f"{base}-{hashlib.sha256(cluster_name.encode()).hexdigest()[:8]}"
    return base


def repository_name(cluster_name: str, suffix: str = "workloads", sep: str = "-") -> str:
    """``<cluster><sep><suffix>`` (``training-dev-workloads``, ``training-dev/portal``), in ECR's
    alphabet (:func:`_base`): every repository the stack owns is named here."""
    return ECR_REPOSITORY.name(_base(cluster_name), suffix, sep=sep)


def mirror_repository_name(cluster_name: str, upstream: str) -> str:
    """``<cluster>-mirror/<upstream host>/<upstream path>``: one repository per upstream
    repository (``training-dev-mirror/docker.io/pytorch/pytorch``)."""
    repo, _tag = images.repository_and_tag(upstream)
    return f"{repository_name(cluster_name, 'mirror')}/{repo}"


def lifecycle_policy(keep: int = KEEP_TAGGED_IMAGES, current: str | None = None) -> str:
    """Untagged images (left behind by rebuilds) expire after a week; of the tagged ones the
    newest ``keep`` stay, so recent jobs can still pull what they were started with. The
    ``current`` tag (what the stack's jobs run) never expires: a rule of its own, first, matches
    it, and an image a rule matches cannot be expired by a rule of lower priority (ECR User Guide,
    "Lifecycle policy evaluation rules"); the count rule ranks by push time, and a tag held since
    long ago (a revert A -> B -> A) would otherwise be the first to go."""
    rules = [
        *([{
            "rulePriority": 1,
            "description": "never expire the tag the stack's jobs run",
            "selection": {"tagStatus": "tagged", "tagPatternList": [current], "countType": "imageCountMoreThan", "countNumber": 1},
            "action": {"type": "expire"},
        }] if current else []),
        {
            "rulePriority": 2,
            "description": f"expire untagged images after {UNTAGGED_EXPIRE_DAYS} days",
            "selection": {"tagStatus": "untagged", "countType": "sinceImagePushed", "countUnit": "days", "countNumber": UNTAGGED_EXPIRE_DAYS},
            "action": {"type": "expire"},
        },
        {
            "rulePriority": 3,
            "description": f"keep the newest {keep} images",
            "selection": {"tagStatus": "any", "countType": "imageCountMoreThan", "countNumber": keep},
            "action": {"type": "expire"},
        },
    ]
    return json.dumps({"rules": rules}, sort_keys=True)


def _repository(name: str, repo_name: str, tags: dict[str, str], keep: int, parent: pulumi.Resource, current: str | None = None) -> aws.ecr.Repository:
    """An ECR repository the stack owns: tags immutable, scanned on push, encrypted, with the
    lifecycle policy; removing it removes its images (it only holds what the stack put there)."""
    repository = aws.ecr.Repository(
        name,
        name=repo_name,
        image_tag_mutability="IMMUTABLE",
        image_scanning_configuration={"scan_on_push": True},
        encryption_configurations=[{"encryption_type": "AES256"}],
        force_delete=True,
        tags=tags,
        opts=pulumi.ResourceOptions(parent=parent),
    )
    aws.ecr.LifecyclePolicy(name, repository=repository.name, policy=lifecycle_policy(keep, current), opts=pulumi.ResourceOptions(parent=parent))
    return repository


def held_tags(repository_name: str, parent: pulumi.Resource) -> dict[str, str]:
    """tag -> digest of the images ``repository_name`` holds now, asked before anything is
    registered; {} for a repository that does not exist yet (a first deploy). The repository is
    looked for first (``aws.ecr.get_repositories``: DescribeRepositories): the images data source
    reports a missing repository only as "couldn't find resource", without ECR's error code
    (terraform-provider-aws ``internal/service/ecr/images_data_source.go``), so any error of the
    images read itself is raised. Then every image (``aws.ecr.get_images``: ListImages, every page)."""
    invoke = pulumi.InvokeOptions(parent=parent)
    if repository_name not in (aws.ecr.get_repositories(opts=invoke).names or []):
        return {}
    found = aws.ecr.get_images(repository_name=repository_name, opts=invoke)
    return {i.image_tag: i.image_digest for i in found.image_ids or [] if i.image_tag and i.image_digest}


def pushed_image(name: str, *, repository: aws.ecr.Repository, repository_name: str, tag: str, context: str, dockerfile: str, build_args: Mapping[str, str],
                 cluster_name: str, kind: str, tags: dict[str, str], parent: pulumi.Resource) -> pulumi.Output[str]:
    """``<repository url>@<digest>`` of the image ``tag``: the registry's own digest when the
    repository holds the tag already (nothing built, nothing pushed), else the digest of the build
    registered here and pushed at deploy.

    A stack deployed before builds were ``retain_on_delete`` still has its build in the state
    without that option, and a build dropped from the program then would be deleted by the
    provider, its pushed digest with it (``Image.Delete``). So the rule applies once an SSM
    parameter (infra/deploy_state.py, ``retained-builds-<kind>``, written after the build by every
    deploy) says the state's build is retained; until then the build stays registered (unchanged
    inputs: no push) and gets the option."""
    url = repository.repository_url
    invoke = pulumi.InvokeOptions(parent=parent)
    param = deploy_state.parameter_name(cluster_name, f"{deploy_state.RETAINED_BUILDS}-{kind}")
    held = held_tags(repository_name, parent) if deploy_state.read_parameter(param, invoke) == "true" else {}
    image = None
    if tag in held:
        ref = url.apply(lambda u: f"{u}@{held[tag]}")
    else:
        image = docker_build.Image(
            name,
            context={"location": context},
            dockerfile={"location": dockerfile},
            platforms=[docker_build.Platform(PLATFORM)],
            build_args=dict(build_args),
            tags=[url.apply(lambda u: f"{u}:{tag}")],
            push=True,
            pull=False,
            build_on_preview=False,
            registries=[_registry_login(repository, parent)],
            opts=pulumi.ResourceOptions(parent=parent, retain_on_delete=True),
        )
        ref = pulumi.Output.all(url, image.digest).apply(lambda a: f"{a[0]}@{a[1]}")
    aws.ssm.Parameter(
        f"{name}-retained-builds", name=param, type="String", value="true", tags=tags,
        description="The stack's image builds are retain_on_delete in its state (infra/registry.py pushed_image)",
        opts=pulumi.ResourceOptions(parent=parent, depends_on=[image] if image else []),
    )
    return ref


def _registry_login(repository: aws.ecr.Repository, parent: pulumi.Resource) -> docker_build.RegistryArgs:
    """pulumi-docker-build's registry credentials for the stack's ECR (``GetAuthorizationToken``)."""
    token = aws.ecr.get_authorization_token_output(registry_id=repository.registry_id, opts=pulumi.InvokeOutputOptions(parent=parent))
    return docker_build.RegistryArgs(address=repository.repository_url.apply(lambda u: u.split("/", 1)[0]), username=token.user_name, password=pulumi.Output.secret(token.password))


class TrainingImage(pulumi.ComponentResource):
    """The ECR repository and the training image built into it; ``ref`` is ``<repo url>@<digest>``."""

    repository: aws.ecr.Repository
    tag: str
    ref: pulumi.Output[str]

    def __init__(self, name: str, *, cluster_name: str, tags: dict[str, str], opts: pulumi.ResourceOptions | None = None):
        super().__init__("training-platform:infra:TrainingImage", name, None, opts)
        # removing the repository (every job brings its own image) removes the images too
        repo_name = repository_name(cluster_name)
        if problem := context_problem(PROJECT_DIR / CONTEXT):
            raise pulumi.RunError(problem)
        self.tag = image_tag()
        self.repository = _repository(name, repo_name, tags, KEEP_TAGGED_IMAGES, self, current=self.tag)
        self.ref = pushed_image(name, repository=self.repository, repository_name=repo_name, tag=self.tag, context=CONTEXT, dockerfile=f"{CONTEXT}/{DOCKERFILE}",
                                build_args=versions.WORKLOAD_BUILD_ARGS, cluster_name=cluster_name, kind="workloads", tags=tags, parent=self)
        self.register_outputs({"repositoryUrl": self.repository.repository_url, "tag": self.tag, "ref": self.ref})


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


class ImageMirror(pulumi.ComponentResource):
    """The stack's copies of the Docker Hub images its objects name by default (the runtimes'
    and the smoke check's, the TensorFlow job's default): :meth:`resolve` gives an object back
    with each Docker Hub image replaced by its copy, made on first use: one ECR repository per
    upstream repository, each pinned tag copied into it at deploy. ``refs``: upstream reference ->
    ``<repo url>:<tag>@<digest>`` of its copy.

    The copy is pulumi-docker-build's ``Index`` (``docker buildx imagetools create --tag <copy>
    <upstream>``, provider/internal/client.go ``ManifestCreate``): with one source it copies the
    image and its platforms from registry to registry (Docker docs, "Copy image between
    registries"), on the machine running ``pulumi up``, which pulls from Docker Hub once per
    pinned tag; the nodes pull the copy from the stack's ECR, which has no anonymous per-address
    limit. A preview copies nothing (``Index.Update`` returns on a dry run). The copy's tag is the
    upstream's; a tag the copy's repository holds already (asked at deploy, :func:`held_tags`) is
    used by its digest and not copied again, whatever the state remembers (a pin going A -> B -> A);
    a new pin is a new resource, and the old copy is kept (``retain_on_delete``) for pods that still
    run it until the lifecycle policy expires it. Why not an ECR pull-through cache rule: for Docker Hub
    it needs Docker Hub credentials in a Secrets Manager secret (ECR User Guide, "Sync an upstream
    registry with an Amazon ECR private registry"), which a stack cannot make; and the images are
    not on ECR Public (its ``docker/library`` namespace holds Docker's official images only)."""

    refs: dict[str, pulumi.Output[str]]

    def __init__(self, name: str, *, cluster_name: str, tags: dict[str, str], opts: pulumi.ResourceOptions | None = None):
        super().__init__("training-platform:infra:ImageMirror", name, None, opts)
        self._name, self._cluster_name, self._tags = name, cluster_name, tags
        self._repositories: dict[str, aws.ecr.Repository] = {}
        self.refs = {}
        self.register_outputs({})

    def copy(self, ref: str) -> pulumi.Output[str]:
        """The copy of upstream ``ref`` (a tagged reference), made once."""
        if ref not in self.refs:
            repo, tag = images.repository_and_tag(ref)
            if repo not in self._repositories:
                self._repositories[repo] = _repository(f"{self._name}-{_slug(repo)}", mirror_repository_name(self._cluster_name, ref), self._tags, KEEP_MIRRORED_IMAGES, self)
            repository = self._repositories[repo]
            held = held_tags(mirror_repository_name(self._cluster_name, ref), self)
            if tag in held:  # copied by an earlier deploy (a pin going A -> B -> A): copied again, ECR would refuse the tag
                self.refs[ref] = repository.repository_url.apply(lambda u, tag=tag, digest=held[tag]: f"{u}:{tag}@{digest}")
                return self.refs[ref]
            self.refs[ref] = docker_build.Index(
                f"{self._name}-{_slug(repo)}-{_slug(tag)}",
                sources=[f"{repo}:{tag}"],
                tag=repository.repository_url.apply(lambda u, tag=tag: f"{u}:{tag}"),
                push=True,
                registry=_registry_login(repository, self),
                opts=pulumi.ResourceOptions(parent=self, retain_on_delete=True),
            ).ref
        return self.refs[ref]

    def resolve(self, obj: dict[str, Any]) -> dict[str, Any]:
        """``obj`` naming the copies of the Docker Hub images it names."""
        found = {ref for _path, ref in images.image_fields(obj) if images.from_docker_hub(ref)}
        return images.with_images(obj, {ref: self.copy(ref) for ref in sorted(found)})
