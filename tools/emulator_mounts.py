"""Each emulated node in a mount namespace of its own, with the job's volumes at their container
paths: code that writes /mnt/checkpoints writes the job's local volume, as in the pod."""

from __future__ import annotations

import os
import pathlib
import shlex
import shutil
import subprocess


def _unshare_prefix() -> list[str] | None:
    """How to start a process in a mount namespace of its own here (unshare(1): as root, or in a
    user namespace mapped to root), or None when this machine allows neither."""
    if shutil.which("unshare") is None:
        return None
    for prefix in (["unshare", "--mount", "--propagation", "private"], ["unshare", "--user", "--map-root-user", "--mount", "--propagation", "private"]):
        try:
            ok = subprocess.run([*prefix, "true"], capture_output=True, timeout=10).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        if ok:
            return prefix
    return None


def _mount_steps(mounts: dict[str, str]) -> list[str]:
    """Shell steps that put each local volume at its container path inside the namespace. A path
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
            steps.append("T=$(mktemp -d); mount -t tmpfs -o mode=0755 platform-emulator $T")
            for entry in entries:
                name = q(entry.name)
                if entry.is_symlink():
                    steps.append(f"ln -s {q(os.readlink(entry))} $T/{name}")
                elif entry.is_dir():
                    steps.append(f"mkdir $T/{name}; mount --rbind {q(str(entry))} $T/{name}")
                else:
                    steps.append(f"touch $T/{name}; mount --bind {q(str(entry))} $T/{name}")
            steps.append(f"mkdir -p $T/{q(str(path.relative_to(ancestor)))}; mount --move $T {q(str(ancestor))}; rmdir $T")
        steps.append(f"mount --bind {shlex.quote(local)} {shlex.quote(target)}")
    return steps


def in_mount_namespace(command: list[str], mounts: dict[str, str]) -> list[str] | None:
    """``command`` run in a mount namespace of its own with the job's volumes at their container
    paths (code that writes /mnt/checkpoints writes the job's local volume, not the host's), or
    None where the machine cannot (then only the paths in the command and env are mapped)."""
    prefix, steps = _unshare_prefix(), _mount_steps(mounts)
    if prefix is None:
        return None
    return [*prefix, "sh", "-c", "set -e; " + "; ".join(steps) + '; exec "$@"', "sh", *command]
