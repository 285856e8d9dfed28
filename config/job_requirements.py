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
  every node. Allowed instead: the platform's index (the one the launcher names), wheels
  shipped in the code directory (``--no-index`` and ``--find-links DIR``: pip resolves a relative
  ``--find-links`` against the requirements file's directory when it exists there), or an image
  (``--image``: a job that needs another index, such as CUDA builds of torch, brings one);
* what exists only on the submitting machine is refused: editable installs (``-e .``: the code
  mount is read-only and pip builds from the node's working directory), local paths and archive
  files (pip resolves them against its working directory, not the code directory), ``file:``
  URLs, ``name @ <a path>``, and ``-r``/``-c``/``--find-links`` naming what the code directory
  does not ship; ``-r``/``-c`` with a URL (fetched on the node, unseen here). A shipped
  ``-r``/``-c`` file is judged by the same rules; an SSH URL (``git+ssh://git@host/...``) is refused
  because the node has no SSH key (its user is no credential).

Each line is read as pip reads it: the file decoded as pip decodes it (:func:`decode`), the
options by pip's option table (:func:`pip_options`: unique prefixes of long options, short options
with their values glued on). A hash fragment (``#sha256=<hex>``) and a VCS URL's commit
(``git+https://host/o/r.git@<sha>``) are no credential.
"""

from __future__ import annotations

import codecs
import posixpath
import re
import shlex
from collections.abc import Callable

from config.secrets import secret_shape

REQUIREMENTS_FILE = "requirements.txt"
# pip's options in a requirements file (pip ``req/req_file.py`` SUPPORTED_OPTIONS and the per-requirement
# SUPPORTED_OPTIONS_REQ, read by optparse; the union of pip 23 to 26: --global-option until 24, --no-require-hashes,
# --all-releases, --only-final since): long option -> (its short option, whether it takes a value).
# optparse takes a unique prefix of a long option (``--extra-index`` is ``--extra-index-url``) and a short
# option's value glued to it (``-fhttps://...``, ``-e.``, ``-rmore.txt``).
PIP_OPTIONS: dict[str, tuple[str | None, bool]] = {
    "--index-url": ("-i", True), "--extra-index-url": (None, True), "--no-index": (None, False), "--constraint": ("-c", True), "--requirement": ("-r", True),
    "--editable": ("-e", True), "--find-links": ("-f", True), "--no-binary": (None, True), "--only-binary": (None, True), "--prefer-binary": (None, False),
    "--require-hashes": (None, False), "--pre": (None, False), "--trusted-host": (None, True), "--use-feature": (None, True), "--global-option": (None, True),
    "--config-settings": ("-C", True), "--hash": (None, True), "--no-require-hashes": (None, False), "--all-releases": (None, True), "--only-final": (None, True),
}
_SHORT = {short: long for long, (short, _) in PIP_OPTIONS.items() if short}
_INDEX_OPTIONS = ("--index-url", "--extra-index-url", "--trusted-host")
_FILE_OPTIONS = ("--requirement", "--constraint")
_USERINFO = re.compile(r"://[^/\s@]+@")
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
# an SSH URL (git+ssh://git@host/...): its user is no credential, but pip on the node has no SSH key to use
_SSH_URL = re.compile(r"\b[A-Za-z]+\+ssh://([^/\s@:]+@)?|\bssh://([^/\s@:]+@)?", re.IGNORECASE)
# what is no credential in a URL: a hash fragment (#sha256=<hex>, pip's check of the download) and a VCS
# URL's revision after its path (git+https://host/o/r.git@<commit>)
_HASH_FRAGMENT = re.compile(r"#(md5|sha1|sha224|sha256|sha384|sha512)=[0-9a-fA-F]+", re.IGNORECASE)
_VCS_REVISION = re.compile(r"((?:git|hg|svn|bzr)\+[A-Za-z]+://[^\s@]*?/[^\s@#]*)@[0-9a-fA-F]{7,64}(?=$|[#\s])", re.IGNORECASE)
_NAME_AT_URL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\s*(\[[^\]]*\])?\s*@\s*(\S+)")
_ARCHIVE = re.compile(r"\.(whl|tar\.gz|tgz|tar\.bz2|tar\.xz|zip)$", re.IGNORECASE)
_LOCAL_START = re.compile(r"^(\.|/|~|[A-Za-z]:[\\/])")
_COMMENT = re.compile(r"(^|\s)#.*$")
# pip's decoding of a requirements file (pip ``req/req_file.py`` ``_decode_req_file``, ``utils/encoding.py``
# BOMS, in pip's order: a UTF-32-LE file starts with the UTF-16-LE mark and pip reads it as UTF-16), then a
# PEP 263 coding line among the first two, then UTF-8; what none of them reads pip reads in the node's locale,
# which this machine cannot know: refused
_BOMS = ((codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16-be"), (codecs.BOM_UTF16_LE, "utf-16-le"),
         (codecs.BOM_UTF32, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32-be"), (codecs.BOM_UTF32_LE, "utf-32-le"))
_PEP263 = re.compile(rb"coding[:=]\s*([-\w.]+)")
UNDECODABLE = (
    "cannot be read as pip reads it (pip takes a byte-order mark's UTF-8 or UTF-16, a coding line's encoding, else UTF-8, else the node's locale; "
    "it reads UTF-32 as UTF-16); save it as UTF-8"
)
CREDENTIAL = (
    "holds a credential (a URL with a user or password, a token parameter or a token's shape; not shown): the code dir is stored in a ConfigMap "
    "that anyone who can read the namespace reads; allowed: the platform's index (it needs none), or the package's wheel in the code dir (--find-links DIR), or an image (--image)"
)
INDEX = (
    "an index setting, which would replace or add to the platform's package index on every node (the launcher's pip uses the platform's index and no other); "
    "a job that needs another index (CUDA builds of torch, a private index) brings an image with its packages (--image); "
    "allowed: packages of the platform's index, wheels shipped in the code dir (--no-index, --find-links DIR), or an image with them (--image)"
)
LOCAL = "exists only on this machine: pip on the node reads a path from its own working directory, not the code dir; allowed: the package's wheel in a directory of the code dir (--find-links DIR, then its name), or an image (--image)"
EDITABLE = "an editable install (-e) cannot be built on the node: the code dir is mounted read-only and pip builds from its own working directory; allowed: the package's modules beside your script (they are importable), its wheel in the code dir (--find-links DIR), or an image (--image)"
SSH = "an SSH URL, which only a machine with an SSH key can fetch: the node has none, so pip fails there; allowed: an https URL of a public repository or archive, the package's wheel in the code dir (--find-links DIR), or an image (--image)"
REMOTE_FILE = "names a URL: pip would fetch that file on the node, unseen here and free to change after the submit; allowed: the file in the code dir"
MAX_DEPTH = 5  # -r inside -r


def decode(data: bytes) -> str | None:
    """A requirements file's text as pip decodes it, or None when pip would fall back to the node's locale."""
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            try:
                text = data[len(bom):].decode(encoding)
            except UnicodeDecodeError:
                return None
            return None if "\x00" in text else text
    for line in data.split(b"\n")[:2]:
        if line[:1] == b"#" and (m := _PEP263.search(line)):
            try:
                return data.decode(m.group(1).decode("ascii"))
            except (LookupError, UnicodeDecodeError):
                return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def pip_options(tokens: list[str]) -> list[tuple[str, str | None]]:
    """``tokens`` (a line's options, split as pip splits them) as (long option, value) pairs by pip's
    option table: a unique prefix of a long option, a short option's value glued on; an option pip
    does not know (or an ambiguous prefix) as (the token, None)."""
    out: list[tuple[str, str | None]] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        i += 1
        if tok.startswith("--"):
            given, eq, value = tok.partition("=")
            matches = [given] if given in PIP_OPTIONS else [o for o in PIP_OPTIONS if o.startswith(given) and given != "--"]
            if len(matches) != 1:
                out.append((tok, None))
                continue
            option = matches[0]
        elif tok.startswith("-") and tok[:2] in _SHORT:
            option, eq, value = _SHORT[tok[:2]], "", tok[2:]
        elif tok.startswith("-"):
            out.append((tok, None))
            continue
        else:
            continue  # a word among the options: pip's parser leaves it aside
        if not PIP_OPTIONS[option][1]:
            out.append((option, ""))
            continue
        if not eq and not value:
            value = tokens[i] if i < len(tokens) else ""
            i += 1
        out.append((option, value))
    return out


def _split(line: str) -> tuple[str, list[str]]:
    """A line as pip breaks it (``break_args_options``): the requirement before the first word that
    starts with ``-``, and the options after it, split as a shell does."""
    words = line.split(" ")
    at = next((i for i, w in enumerate(words) if w.startswith("-")), len(words))
    rest = " ".join(words[at:])
    try:
        options = shlex.split(rest)
    except ValueError:
        options = rest.split()
    return " ".join(words[:at]).strip(), options


def _credential_text(line: str) -> str:
    """The line without what has a credential's shape but is none: hash fragments, VCS revisions, an SSH URL's user."""
    line = _HASH_FRAGMENT.sub("#", line)
    line = _VCS_REVISION.sub(r"\1", line)
    return _SSH_URL.sub("ssh://", line)


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


def problems(read: Callable[[str], str | bytes | None], shipped: set[str], path: str = REQUIREMENTS_FILE, depth: int = 0) -> list[str]:
    """A line per problem of the requirements file ``path`` (relative to the code dir; ``read``
    gives a shipped file's text or bytes, or None), and of the shipped files it includes with
    ``-r``/``-c``."""
    content = read(path)
    if content is None:
        return []
    text = decode(content) if isinstance(content, bytes) else content.removeprefix("\ufeff")
    if text is None:
        return [f"{path}: {UNDECODABLE}"]
    found: list[str] = []
    base = posixpath.dirname(path)
    for n, line in _logical_lines(text):
        where = f"{path} line {n}"
        judged = _credential_text(line)
        if _USERINFO.search(judged) or secret_shape(judged) is not None:
            found.append(f"{where}: {CREDENTIAL}")
            continue
        if _SSH_URL.search(line):
            found.append(f"{where}: {SSH}")
            continue
        requirement, options = _split(line)
        for option, arg in pip_options(options):
            found += _option_problems(where, option, arg, base, read, shipped, depth)
        if requirement:
            found += _requirement_problems(where, requirement)
    return found


def _option_problems(where: str, option: str, arg: str | None, base: str, read: Callable[[str], str | bytes | None], shipped: set[str], depth: int) -> list[str]:
    if arg is None:
        return [f"{where}: an option pip does not read in a requirements file (unknown, or an ambiguous abbreviation): pip fails on it on every node; allowed: {', '.join(PIP_OPTIONS)}"]
    if option in _INDEX_OPTIONS:
        return [f"{where}: {option}: {INDEX}"]
    if option == "--find-links":
        if _URL.match(arg) and not arg.lower().startswith("file:"):
            return [f"{where}: --find-links with a URL: {INDEX}"]
        if arg.lower().startswith("file:") or not _shipped_dir(posixpath.join(base, arg), shipped):
            return [f"{where}: --find-links names a directory the code dir does not ship; it {LOCAL}"]
    elif option == "--editable":
        return [f"{where}: {EDITABLE}"]
    elif option in _FILE_OPTIONS:
        if _URL.match(arg) and not arg.lower().startswith("file:"):
            return [f"{where}: {option} {REMOTE_FILE}"]
        rel = posixpath.normpath(posixpath.join(base, arg))
        if arg.lower().startswith("file:") or rel not in shipped:
            return [f"{where}: {option} names a file the code dir does not ship; it {LOCAL}"]
        if depth < MAX_DEPTH:
            return problems(read, shipped, rel, depth + 1)
    return []  # --no-index, --pre, --prefer-binary, --only-binary, --hash, ...: nothing of another index or machine


def _requirement_problems(where: str, requirement: str) -> list[str]:
    if re.search(r"(^|[\s@])file:", requirement, re.IGNORECASE):
        return [f"{where}: a file: URL {LOCAL}"]
    first = requirement.split()[0]
    named = _NAME_AT_URL.match(requirement)
    if named is not None and not _URL.match(named.group(2)):  # name @ ./libs/pkg: a path, not a URL
        return [f"{where}: a local path or archive {LOCAL}"]
    if _LOCAL_START.match(requirement) or (not _URL.match(requirement) and "@" not in requirement and (_ARCHIVE.search(first) or "/" in first or "\\" in first)):
        return [f"{where}: a local path or archive {LOCAL}"]
    return []
