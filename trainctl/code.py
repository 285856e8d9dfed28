"""A code directory as the data of one ConfigMap.

What is shipped: every regular file under the directory, except hidden files and directories
(any name starting with ``.``: ``.git``, ``.venv``, ``.env``, editor files), ``__pycache__``
directories and ``*.pyc`` files. Symbolic links to directories are not followed; a symbolic link
to a file outside the directory is refused (it would ship, say, ``~/.aws/credentials``). UTF-8 files
go into ``data``, other files into ``binaryData``. Sizes are summed before any file is read.

ConfigMap keys may hold only letters, digits, ``-``, ``_`` and ``.`` (the API server's
``IsConfigMapKey``, k8s.io/apimachinery ``pkg/util/validation/validation.go``), so a file in a
sub-directory is stored under its path with ``/`` written ``__`` and mounted back at its path
through the volume's ``items``.

A top-level ``requirements.txt`` (what the launcher installs) is judged by
``config/job_requirements.py``: credentials, index settings and what exists only on this machine
are refused, a line each, before anything is sent. It and the files it includes are decoded as pip
decodes them (a byte-order mark: UTF-8, UTF-16, UTF-32; else UTF-8), whatever ``data`` or ``binaryData``
holds them; one pip could not decode is refused. A file or directory that cannot be read is
named with the reason (a :class:`CodeError`), never taken for a network failure.

Size: the API server refuses a ConfigMap whose values add up to more than 1 MiB (1048576 bytes):
``ValidateConfigMap`` sums ``len(value)`` over ``data`` (the UTF-8 bytes) and ``binaryData`` (the
decoded bytes) and compares it with ``MaxSecretSize`` = 1 MiB (kubernetes ``pkg/apis/core/
validation/validation.go``, ``k8s.io/api/core/v1`` ``MaxSecretSize``; Kubernetes docs, Concepts >
Configuration > ConfigMaps: "The data stored in a ConfigMap cannot exceed 1 MiB"). Keys are not
counted. The same sum is made here, before anything is sent.

The whole object counts too: etcd refuses a request larger than 1.5 MiB (``--max-request-bytes``,
default ``DefaultMaxRequestBytes = 1.5 * 1024 * 1024``, etcd v3.6.4 ``server/embed/config.go``; etcd
docs, dev-guide "System limits"), and the API server writes each object in one etcd request
(k8s.io/apiserver v0.34.4 ``pkg/server/config.go``, on ``MaxRequestBodyBytes``: "1.5MB is the
recommended client request size in byte the etcd server should accept ... A request body might be
encoded in json, and is converted to proto when persisted in etcd"). Many small files add little
data but a key each in the ConfigMap and, with files in sub-directories, a ``{key, path}`` entry
each in the TrainJob's volume ``items``. :func:`stored_size` counts an object as compact JSON
(``binaryData`` in base64, as sent; a custom resource such as the TrainJob is stored as JSON, a
ConfigMap as protobuf, which is no larger) plus a margin for what the server adds (uid,
timestamps, managedFields), and :func:`object_problems` refuses one over ``MAX_OBJECT_BYTES``.
Measured on the local control plane (kube-apiserver v1.34.4, etcd v3.6.4 at its default limit):
a code ConfigMap of 45,000 one-byte files (1.49 MB as compact JSON) is stored, one of 52,000
(1.72 MB) is refused with "etcdserver: request is too large"; a TrainJob carrying the items of
30,000 files in a sub-directory is over the limit (tests/e2e/test_trainctl.py).
"""

from __future__ import annotations

import os
import pathlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from config import job_requirements

# the limits and the size measure are the stack's too (config/object_size.py): one check everywhere
from config.object_size import MAX_CONFIGMAP_BYTES, MAX_OBJECT_BYTES, SERVER_ADDED_BYTES, env_blame, size_problem, stored_size  # noqa: F401  (part of this module's interface)

KEY_MAX_LENGTH = 253  # IsConfigMapKey: at most 253 characters
_KEY_RE = re.compile(r"^[-._a-zA-Z0-9]+$", re.ASCII)
SUBDIR_SEPARATOR = "__"


class CodeError(ValueError):
    """A code directory that cannot be shipped (one line, for the user)."""


@dataclass(frozen=True)
class CodeBundle:
    root: pathlib.Path
    files: dict[str, str | bytes]  # ConfigMap key -> content (str: UTF-8 text, bytes: binary)
    paths: dict[str, str] = field(default_factory=dict)  # relative path (with /) -> key
    size: int = 0  # what the API server counts

    @property
    def items(self) -> list[dict] | None:
        """The configMap volume's ``items`` (key -> path) when some file lives in a sub-directory;
        None when every key is the file's own name (the whole ConfigMap is projected as is)."""
        if all(rel == key for rel, key in self.paths.items()):
            return None
        return [{"key": key, "path": rel} for rel, key in sorted(self.paths.items())]


def _mib(n: int) -> str:
    return f"{n / (1024 * 1024):.1f} MiB"


def _key(rel: str) -> str:
    key = rel.replace("/", SUBDIR_SEPARATOR)
    if not _KEY_RE.fullmatch(key) or len(key) > KEY_MAX_LENGTH or key in (".", "..") or key.startswith(".."):
        raise CodeError(f"file {rel!r}: a ConfigMap can only hold file names of letters, digits, '-', '_' and '.' (at most {KEY_MAX_LENGTH} characters with the path); rename it")
    return key


def collect(code_dir: str | os.PathLike) -> CodeBundle:
    """The directory's files, refused with one :class:`CodeError` line when they cannot be shipped."""
    root = pathlib.Path(code_dir)
    if not root.exists():
        raise CodeError(f"code dir {str(code_dir)!r} does not exist")
    if not root.is_dir():
        raise CodeError(f"code dir {str(code_dir)!r} is not a directory")
    files: dict[str, str | bytes] = {}
    paths: dict[str, str] = {}
    sizes: dict[str, int] = {}
    keys_bytes = 0
    real_root = root.resolve()

    def unreadable(err: OSError) -> None:  # os.walk's: a directory it cannot list
        where = pathlib.Path(err.filename) if err.filename else root
        rel = where.relative_to(root).as_posix() if where.is_relative_to(root) else str(where)
        raise CodeError(f"directory {rel!r} of the code dir cannot be read ({err.strerror or err}); make it readable or move it out of the code dir")

    for dirpath, dirnames, filenames in os.walk(root, onerror=unreadable):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "__pycache__")
        for name in sorted(filenames):
            if name.startswith(".") or name.endswith(".pyc"):
                continue
            path = pathlib.Path(dirpath, name)
            if not path.is_file():
                continue
            rel = path.relative_to(root).as_posix()
            if path.is_symlink() and not path.resolve().is_relative_to(real_root):
                # never ship what a link points at outside the directory (~/.aws/credentials, keys)
                raise CodeError(f"file {rel!r} is a symbolic link to a file outside the code dir; copy what the job needs into the code dir instead")
            key = _key(rel)
            if key in files:
                other = next(r for r, k in paths.items() if k == key)
                raise CodeError(f"files {other!r} and {rel!r} map to the same ConfigMap key {key!r}; rename one")
            # sizes before contents: a large file is refused without being read
            try:
                sizes[rel] = path.stat().st_size
            except OSError as err:
                raise CodeError(f"file {rel!r} of the code dir cannot be read ({err.strerror or err}); make it readable or move it out of the code dir") from None
            keys_bytes += len(key) + 6  # its key in data ("key":"...",), at least
            if sum(sizes.values()) > MAX_CONFIGMAP_BYTES:
                _too_big(code_dir, sizes)
            if sum(sizes.values()) + keys_bytes > MAX_OBJECT_BYTES:  # before reading thousands more
                raise CodeError(_too_many(code_dir, len(sizes), sum(sizes.values()) + keys_bytes, "ConfigMap", so_far=True))
            try:
                raw = path.read_bytes()
            except OSError as err:
                raise CodeError(f"file {rel!r} of the code dir cannot be read ({err.strerror or err}); make it readable or move it out of the code dir") from None
            try:
                content: str | bytes = raw.decode("utf-8")
            except UnicodeDecodeError:
                content = raw
            files[key] = content
            paths[rel] = key
            sizes[rel] = len(raw)
    size = sum(sizes.values())
    if not files:
        raise CodeError(f"code dir {str(code_dir)!r} holds no files to ship (hidden files, __pycache__ and *.pyc are left out)")
    if size > MAX_CONFIGMAP_BYTES:
        _too_big(code_dir, sizes)
    found = requirements_problems(files, paths)
    if found:
        raise CodeError("\n".join(found))
    return CodeBundle(root=root, files=files, paths=paths, size=size)


def requirements_problems(files: dict[str, str | bytes], paths: dict[str, str]) -> list[str]:
    """The code's top-level requirements.txt (and the shipped files it includes) by
    ``config/job_requirements.py``: a line per problem, never a line's text."""

    def read(rel: str) -> bytes | None:  # the file's bytes: decoded as pip decodes them (a byte-order mark, UTF-16), or refused
        content = files.get(paths.get(rel, ""))
        return content.encode("utf-8") if isinstance(content, str) else content

    return job_requirements.problems(read, set(paths))


def _too_big(code_dir: str | os.PathLike, sizes: dict[str, int]) -> None:
    size = sum(sizes.values())
    biggest = sorted(sizes, key=lambda r: (-sizes[r], r))[:3]
    raise CodeError(
        f"code dir {str(code_dir)!r} holds more than {_mib(size)} ({size} bytes in {len(sizes)} files so far; largest: {', '.join(biggest)}), "
        f"more than the 1 MiB ({MAX_CONFIGMAP_BYTES} bytes) a ConfigMap holds: build an image with the large files "
        "(dependencies, data, weights) and pass it with --image, keeping only your scripts in the code dir"
    )


def _too_many(code_dir: str | os.PathLike, files: int, size: int, kind: str, so_far: bool = False) -> str:
    which = f"{files} of its files already make" if so_far else f"its {files} files make"
    return (
        f"code dir {str(code_dir)!r}: {which} a {kind} of about {_mib(size)} ({size} bytes with a key per file), "
        f"more than the {_mib(MAX_OBJECT_BYTES)} ({MAX_OBJECT_BYTES} bytes) the API server can store in one object (etcd's request limit): "
        "ship fewer files (an archive your code unpacks, or an image with them, passed with --image)"
    )


def object_problems(code_dir: str | os.PathLike, files: int, objects: list[dict], env: Mapping[str, str] | None = None) -> list[str]:
    """A line for each object (the code ConfigMap, the TrainJob with its per-file volume items and
    its environment ``env``) larger than the API server stores: named by the variable whose value
    alone makes the difference (as the render names it: config/object_size.py env_blame), else
    by the code dir's files, with the largest environment values beside them."""
    lines = []
    for obj in objects:
        if (why := size_problem(obj)) is None:
            continue
        culprit, largest = env_blame(obj, env or {})
        if culprit:
            lines.append(f"--env {culprit}: {why}{largest}; allowed: values that fit (a large value belongs in a file the job reads: the code dir, its image, the checkpoint volume, S3)")
        else:
            lines.append(_too_many(code_dir, files, stored_size(obj), obj["kind"]) + largest)
    return lines
