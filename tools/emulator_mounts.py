"""Each emulated node in a mount namespace of its own, with the job's volumes at their container
paths: code that writes /mnt/checkpoints writes the job's local volume, as in the pod."""

from __future__ import annotations

import functools
import os
import pathlib
import shlex
import shutil
import subprocess

MOUNT_NS = ["--mount", "--propagation", "private"]
# a PID namespace of its own, as a container's: the command is its PID 1 (its own /proc), and when
# that ends the kernel kills every other process in it; unshare's --kill-child ends it with unshare
POD_NS = [*MOUNT_NS, "--pid", "--fork", "--kill-child", "--mount-proc"]


@functools.cache
def _unshare_prefix(flags: tuple[str, ...] = tuple(MOUNT_NS)) -> list[str] | None:
    """How to start a process in the namespaces ``flags`` ask for here (unshare(1): as root, or in
    a user namespace mapped to root), or None when this machine allows neither."""
    if shutil.which("unshare") is None:
        return None
    for prefix in (["unshare", *flags], ["unshare", "--user", "--map-root-user", *flags]):
        try:
            ok = subprocess.run([*prefix, "true"], capture_output=True, timeout=10).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        if ok:
            return prefix
    return None


def _mount_steps(mounts: dict[str, str]) -> list[str]:
    """Shell steps that put each local volume at its container path inside the namespace (``mount
    -n``: no userspace mount table to update, which a user namespace mapped to root may not write,
    and mount(8) then fails a move with exit 16 though the kernel made it). A path
    whose parent does not exist gets a tmpfs over its deepest existing ancestor that mirrors the
    ancestor's entries (bind mounts, so nothing of the host's is hidden or changed); a top-level
    directory the host lacks is made, empty, as the mountpoint."""
    steps = []
    for target, local in sorted(mounts.items(), key=lambda kv: kv[0].count("/")):
        path = pathlib.Path(target)
        ancestor = path
        while not ancestor.exists():
            ancestor = ancestor.parent
        if ancestor != path:
            q = shlex.quote
            entries = sorted(ancestor.iterdir()) if ancestor != pathlib.Path("/") else []
            if ancestor == pathlib.Path("/"):  # e.g. no /mnt on this machine: an empty mountpoint for it (the root is never mirrored)
                ancestor = pathlib.Path("/", path.parts[1])
                steps.append(f"mkdir -p {q(str(ancestor))}")
            steps.append("T=$(mktemp -d); mount -n -t tmpfs -o mode=0755 platform-emulator $T")
            for entry in entries:
                name = q(entry.name)
                if entry.is_symlink():
                    steps.append(f"ln -s {q(os.readlink(entry))} $T/{name}")
                elif entry.is_dir():
                    steps.append(f"mkdir $T/{name}; mount -n --rbind {q(str(entry))} $T/{name}")
                else:
                    steps.append(f"touch $T/{name}; mount -n --bind {q(str(entry))} $T/{name}")
            steps.append(f"mkdir -p $T/{q(str(path.relative_to(ancestor)))}; mount -n --move $T {q(str(ancestor))}; rmdir $T")
        steps.append(f"mount -n --bind {shlex.quote(local)} {shlex.quote(target)}")
    return steps


def in_mount_namespace(command: list[str], mounts: dict[str, str]) -> list[str] | None:
    """``command`` run in a mount namespace of its own with the job's volumes at their container
    paths (code that writes /mnt/checkpoints writes the job's local volume, not the host's), or
    None where the machine cannot (then only the paths in the command and env are mapped)."""
    prefix, steps = _unshare_prefix(), _mount_steps(mounts)
    if prefix is None:
        return None
    return [*prefix, "sh", "-c", "set -e; " + "; ".join(steps) + '; exec "$@"', "sh", *command]


def in_pod_namespaces(command: list[str], mounts: dict[str, str]) -> list[str] | None:
    """``command`` as :func:`in_mount_namespace` runs it, and as PID 1 of a PID namespace of its
    own, as in a pod's container: a process it leaves behind (a background child, a ``setsid``
    one, torchrun's workers in their own sessions) ends with it. None where the machine cannot."""
    prefix = _unshare_prefix(tuple(POD_NS))
    if prefix is None:
        return None
    return [*prefix, "sh", "-c", "set -e; " + "".join(f"{step}; " for step in _mount_steps(mounts)) + 'exec "$@"', "sh", *command]
