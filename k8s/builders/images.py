"""Image references: which registry one names, and the stack's copies in place of the upstream.

Docker Hub limits anonymous pulls per IPv4 address, and every node of a cluster behind one NAT
address shares that limit: a scale-out of GPU nodes pulling a CUDA image from there ends in
``toomanyrequests`` and ImagePullBackOff. So no object the platform deploys names a Docker Hub
image by default: the stack copies each one it needs into its own ECR at deploy
(infra/registry.py ``ImageMirror``) and :func:`with_images` puts the copy in place of the
upstream reference in the objects built with it.

Which host a reference names is Docker's own rule (github.com/distribution/reference,
normalize.go ``splitDockerDomain``, the normalisation containerd and the kubelet apply): the part
before the first ``/`` is a registry host only if it contains ``.`` or ``:``, is ``localhost``,
or is not lowercase; anything else (``pytorch/pytorch``, ``busybox``) is on ``docker.io``, and a
single-element name is in its ``library/`` namespace. ``index.docker.io`` is the legacy name of
``docker.io``; ``registry-1.docker.io`` is the host its API is served from.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

DOCKER_HUB = "docker.io"
DOCKER_HUB_HOSTS = frozenset({DOCKER_HUB, "index.docker.io", "registry-1.docker.io"})
_LIBRARY = "library/"


def split_domain(ref: str) -> tuple[str, str]:
    """(registry host, the rest: repository path with its tag or digest), as ``splitDockerDomain``."""
    first, sep, rest = ref.partition("/")
    if not sep:
        return DOCKER_HUB, _LIBRARY + ref
    if first == "localhost" or any(c in first for c in ".:") or first.lower() != first:
        domain, remainder = ("docker.io" if first == "index.docker.io" else first), rest
    else:
        domain, remainder = DOCKER_HUB, ref
    if domain == DOCKER_HUB and "/" not in remainder:
        remainder = _LIBRARY + remainder
    return domain, remainder


def from_docker_hub(ref: str) -> bool:
    return split_domain(ref)[0] in DOCKER_HUB_HOSTS


def repository_and_tag(ref: str) -> tuple[str, str]:
    """(``host/path`` fully qualified, tag) of a tagged reference; refused without a tag."""
    domain, remainder = split_domain(ref)
    path, at, _digest = remainder.partition("@")
    name, colon, tag = path.rpartition(":")
    if not colon or "/" in tag or at:
        raise ValueError(f"{ref!r}: an image to copy is named by a tag (registry/org/name:tag)")
    return f"{domain}/{name}", tag


def with_images(obj: Any, images: Mapping[str, Any] | None) -> Any:
    """``obj`` with every ``image`` field that names a key of ``images`` set to its value (a
    string or an Output): the containers of a runtime, a Job or a CronJob built with the pinned
    upstream default. Other images (a job's own) are left as they are."""
    if not images:
        return obj
    if isinstance(obj, dict):
        return {k: images.get(v, v) if k == "image" and isinstance(v, str) else with_images(v, images) for k, v in obj.items()}
    if isinstance(obj, list):
        return [with_images(v, images) for v in obj]
    return obj


def image_fields(obj: Any, path: str = "") -> list[tuple[str, Any]]:
    """Every (path, value) of an ``image`` field in ``obj``."""
    found: list[tuple[str, Any]] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == "image" and isinstance(v, str):
                found.append((f"{path}.{k}", v))
            else:
                found += image_fields(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            found += image_fields(v, f"{path}[{i}]")
    return found
