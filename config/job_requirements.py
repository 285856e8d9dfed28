"""A code directory's ``requirements.txt`` (trainctl submit in both modes, the portal's uploads in
both modes: all through ``trainctl/code.py collect``), judged before anything is created, each
problem one line naming the file and line, never the line's text (it may hold a credential).

The platform's launcher (workloads/programs/launch.py ``pip_command``) installs the file with
``pip install --isolated --index-url <the platform's index> [--extra-index-url ...] --requirement
<code>/requirements.txt`` on every node, from the read-only code mount. So:

* a credential is refused: a URL with user information (``https://user:token@host``), a token
  parameter, or a value of a known token's shape (config/secrets.py ``secret_shape``). The code
  directory becomes a ConfigMap that anyone who can read the namespace's ConfigMaps reads;
* an index option (``-i``/``--index-url``, ``--extra-index-url``, ``--trusted-host``, a
  ``--find-links`` URL) is refused: pip takes a requirements file's ``--index-url`` over the
  command line's (pip ``req/req_file.py`` ``handle_option_line``: the file's index replaces the
  finder's), so the line would replace the platform's index (a mirror, an allow-listed proxy) on
  every node. Allowed instead: the platform's index (the stack's ``dependencies`` settings), wheels
  shipped in the code directory (``--no-index`` and ``--find-links DIR``: pip resolves a relative
  ``--find-links`` against the requirements file's directory when it exists there), or an image;
* what exists only on the submitting machine is refused: editable installs (``-e .``: the code
  mount is read-only and pip builds from the node's working directory), local paths and archive
  files (pip resolves them against its working directory, not the code directory), ``file:``
  URLs, and ``-r``/``-c``/``--find-links`` naming what the code directory does not ship. A
  shipped ``-r``/``-c`` file is judged by the same rules.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Callable

from config.secrets import secret_shape

REQUIREMENTS_FILE = "requirements.txt"
_INDEX_OPTIONS = {"-i": "--index-url", "--index-url": "--index-url", "--extra-index-url": "--extra-index-url", "--trusted-host": "--trusted-host"}
_FILE_OPTIONS = {"-r": "--requirement", "--requirement": "--requirement", "-c": "--constraint", "--constraint": "--constraint"}
_USERINFO = re.compile(r"://[^/\s@]+@")
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_ARCHIVE = re.compile(r"\.(whl|tar\.gz|tgz|tar\.bz2|tar\.xz|zip)$", re.IGNORECASE)
_COMMENT = re.compile(r"(^|\s)#.*$")
CREDENTIAL = (
    "holds a credential (a URL with a user or password, a token parameter or a token's shape; not shown): the code dir is stored in a ConfigMap "
    "that anyone who can read the namespace reads; allowed: the platform's index (it needs none), or the package's wheel in the code dir (--find-links DIR), or an image (--image)"
)
INDEX = (
    "an index setting, which would replace or add to the platform's package index (the launcher's pip takes it from the platform: the stack's dependencies settings), on every node; "
    "allowed: packages of the platform's index, wheels shipped in the code dir (--no-index, --find-links DIR), or an image with them (--image)"
)
LOCAL = "exists only on this machine: pip on the node reads a path from its own working directory, not the code dir; allowed: the package's wheel in a directory of the code dir (--find-links DIR, then its name), or an image (--image)"
EDITABLE = "an editable install (-e) cannot be built on the node: the code dir is mounted read-only and pip builds from its own working directory; allowed: the package's modules beside your script (they are importable), its wheel in the code dir (--find-links DIR), or an image (--image)"
MAX_DEPTH = 5  # -r inside -r


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, line) with ``\\`` continuations joined and comments dropped, as pip reads them."""
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for n, raw in enumerate(text.splitlines(), 1):
        if not pending:
            start = n
        if raw.endswith("\\"):
            pending += raw[:-1] + " "
            continue
        line = _COMMENT.sub("", pending + raw).strip()
        pending = ""
        if line:
            out.append((start, line))
    if pending.strip():
        out.append((start, _COMMENT.sub("", pending).strip()))
    return out


def _shipped_dir(rel: str, shipped: set[str]) -> bool:
    rel = posixpath.normpath(rel)
    return not rel.startswith("..") and not posixpath.isabs(rel) and any(p.startswith(rel.rstrip("/") + "/") for p in shipped)


def problems(read: Callable[[str], str | None], shipped: set[str], path: str = REQUIREMENTS_FILE, depth: int = 0) -> list[str]:
    """A line per problem of the requirements file ``path`` (relative to the code dir; ``read``
    gives a shipped file's text, or None), and of the shipped files it includes with ``-r``/``-c``."""
    text = read(path)
    if text is None:
        return []
    found: list[str] = []
    base = posixpath.dirname(path)
    for n, line in _logical_lines(text):
        where = f"{path} line {n}"
        if _USERINFO.search(line) or secret_shape(line) is not None:
            found.append(f"{where}: {CREDENTIAL}")
            continue
        try:
            words = shlex.split(line)
        except ValueError:
            words = line.split()
        first, _, glued = words[0].partition("=")
        arg = glued or (words[1] if len(words) > 1 else "")
        if first.startswith("-i") and first != "-i" and not glued:  # -ihttps://...
            first, arg = "-i", first[2:]
        if first in _INDEX_OPTIONS:
            found.append(f"{where}: {_INDEX_OPTIONS[first]}: {INDEX}")
        elif first in ("-f", "--find-links"):
            if _URL.match(arg) and not arg.lower().startswith("file:"):
                found.append(f"{where}: --find-links with a URL: {INDEX}")
            elif arg.lower().startswith("file:") or not _shipped_dir(posixpath.join(base, arg), shipped):
                found.append(f"{where}: --find-links names a directory the code dir does not ship; it {LOCAL}")
        elif first in ("-e", "--editable"):
            found.append(f"{where}: {EDITABLE}")
        elif first in _FILE_OPTIONS:
            rel = posixpath.normpath(posixpath.join(base, arg))
            if arg.lower().startswith("file:") or (not _URL.match(arg) and rel not in shipped):
                found.append(f"{where}: {_FILE_OPTIONS[first]} names a file the code dir does not ship; it {LOCAL}")
            elif not _URL.match(arg) and depth < MAX_DEPTH:
                found += problems(read, shipped, rel, depth + 1)
        elif first.startswith("-"):
            continue  # --no-index, --pre, --prefer-binary, --only-binary, --hash, ...: nothing of another index or machine
        elif re.search(r"(^|[\s@])file:", line, re.IGNORECASE):
            found.append(f"{where}: a file: URL {LOCAL}")
        elif re.match(r"^(\.|/|~|[A-Za-z]:[\\/])", line) or (not _URL.match(line) and "@" not in line and (_ARCHIVE.search(words[0]) or "/" in words[0] or "\\" in words[0])):
            found.append(f"{where}: a local path or archive {LOCAL}")
    return found
