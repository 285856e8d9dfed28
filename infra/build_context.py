"""The build context as pulumi-docker-build hashes it, and the ``.dockerignore`` that narrows it.

pulumi-docker-build 0.0.22 decides whether an ``Image`` must be rebuilt (and pushed) by a hash of
its build context (``provider/internal/context.go`` ``hashBuildContext``, compared in
``provider/internal/image.go`` ``Diff`` as ``contextHash``): the Dockerfile's content, then every
regular file and symlink of the context directory that the ignore file does not exclude, each
as its content, its slash path relative to the context and its mode (Go ``FileMode.String()``,
e.g. ``-rw-r--r--``). Only the ignore file narrows it. This module reproduces which files that
hash reads, from the sources at the versions 0.0.22 pins (its go.mod):

- ignore file lookup (``context.go`` ``getIgnorePatterns``): ``<dockerfile>.dockerignore``
  first, else ``<context>/.dockerignore``; parsed as ``moby/patternmatcher`` v0.6.1
  ``ignorefile.ReadAll``;
- the walk (``tonistiigi/fsutil`` 0257b3308df4 ``filter.go`` ``filterFS.Walk``): each path
  matched with ``patternmatcher.MatchesUsingParentResults`` given its parent directory's
  results, directories that match skipped when no exception pattern reaches into them;
- pattern semantics (``patternmatcher.go`` v0.6.1 ``Pattern.compile`` / ``match``).

Pure Python, no Pulumi: the training image component checks the context against it before it
registers a build, and the tests use it to prove the tag and the provider read the same files.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import posixpath
import re
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

IGNORE_FILE = ".dockerignore"
_ESCAPE = set(".+()|{}$")  # patternmatcher.go shouldEscape: regexp specials that are not filepath.Match syntax
_BOM = "\ufeff"


def go_clean(path: str) -> str:
    """Go's ``path.Clean`` (slash paths): ``posixpath.normpath`` but one leading slash at most."""
    cleaned = posixpath.normpath(path) if path else "."
    return "/" + cleaned.lstrip("/") if cleaned.startswith("//") else cleaned


def read_ignore_file(text: str) -> list[str]:
    """``ignorefile.ReadAll``: BOM dropped, ``#`` lines skipped (before trimming), each pattern
    trimmed and cleaned, a leading ``/`` removed, ``!`` kept in front."""
    patterns = []
    for i, line in enumerate(text.splitlines()):
        if i == 0:
            line = line.removeprefix(_BOM)
        if line.startswith("#"):
            continue
        pattern = line.strip()
        if not pattern:
            continue
        invert = pattern.startswith("!")
        if invert:
            pattern = pattern[1:].strip()
        if pattern:
            pattern = go_clean(pattern)
            if len(pattern) > 1 and pattern.startswith("/"):
                pattern = pattern[1:]
        patterns.append("!" + pattern if invert else pattern)
    return patterns


@dataclass
class Pattern:
    """One ``patternmatcher.Pattern``: its cleaned text, whether it is an exception (``!``), and
    how ``compile`` decided to match it (exact, prefix, suffix or a regular expression)."""

    text: str
    exclusion: bool
    kind: str = ""
    regex: re.Pattern[str] | None = None

    def __post_init__(self) -> None:
        self._compile()

    def _compile(self) -> None:
        reg, kind, chars, i = "^", "exact", self.text, 0
        pos = 0
        while pos < len(chars):
            ch = chars[pos]
            pos += 1
            if ch == "*":
                if pos < len(chars) and chars[pos] == "*":
                    pos += 1
                    if pos < len(chars) and chars[pos] == "/":  # "**/" is "**"
                        pos += 1
                    if pos == len(chars):  # "**" at the end: everything below
                        if kind == "exact":
                            kind = "prefix"
                        else:
                            reg += ".*"
                            kind = "regexp"
                    else:
                        reg += "(.*/)?"
                        kind = "regexp"
                    if i == 0:
                        kind = "suffix"
                else:
                    reg += "[^/]*"
                    kind = "regexp"
            elif ch == "?":
                reg += "[^/]"
                kind = "regexp"
            elif ch in _ESCAPE:
                reg += "\\" + ch
            elif ch == "\\":
                if pos < len(chars):
                    reg += "\\" + chars[pos]
                    pos += 1
                    kind = "regexp"
                else:  # Go appends one backslash (which then escapes the closing "$")
                    reg += "\\"
            elif ch in "[]":
                reg += ch
                kind = "regexp"
            else:
                reg += ch
            i += 1
        self.kind = kind
        if kind == "regexp":
            self.regex = re.compile(reg + "$")

    def match(self, path: str) -> bool:
        if self.kind == "exact":
            return path == self.text
        if self.kind == "prefix":
            return path.startswith(self.text[:-2])
        if self.kind == "suffix":
            suffix = self.text[2:]
            return path.endswith(suffix) or (suffix[:1] == "/" and path == suffix[1:])
        assert self.regex is not None
        return self.regex.match(path) is not None

    def without_trailing_glob(self) -> str:
        """fsutil ``patternWithoutTrailingGlob``."""
        return self.text.removesuffix("/**").removesuffix("/*")


def compile_patterns(patterns: Iterable[str]) -> list[Pattern]:
    """``patternmatcher.New``: trimmed, cleaned, ``!`` makes an exception."""
    out = []
    for raw in patterns:
        p = raw.strip()
        if not p:
            continue
        p = go_clean(p)
        exclusion = p.startswith("!")
        if exclusion:
            if len(p) == 1:
                raise ValueError('illegal exclusion pattern: "!"')
            p = p[1:]
        out.append(Pattern(p, exclusion))
    return out


def matches(patterns: Sequence[Pattern], path: str, parent: Sequence[bool] | None) -> tuple[bool, list[bool]]:
    """``MatchesUsingParentResults``: whether ``path`` is excluded, and per pattern whether it (or,
    through ``parent``, a directory above it) matched."""
    matched = False
    info = [False] * len(patterns)
    for i, pattern in enumerate(patterns):
        match = bool(parent) and parent[i]  # type: ignore[index]
        if not match:
            if pattern.exclusion != matched:
                continue
            match = pattern.match(path)
            if not match and not parent:
                dirs = posixpath.dirname(path).split("/") if posixpath.dirname(path) else []
                match = any(pattern.match("/".join(dirs[: n + 1])) for n in range(len(dirs)))
        info[i] = match
        if match:
            matched = not pattern.exclusion
    return matched, info


def ignore_file(context: pathlib.Path, dockerfile: pathlib.Path) -> pathlib.Path | None:
    """The ignore file the provider reads (``getIgnorePatterns``): ``<Dockerfile>.dockerignore``,
    else the context's ``.dockerignore``; None when neither exists."""
    for candidate in (dockerfile.with_name(dockerfile.name + IGNORE_FILE), context / IGNORE_FILE):
        if candidate.is_file():
            return candidate
    return None


def go_mode(st_mode: int) -> str:
    """Go's ``FileMode.String()`` of an lstat mode, for the kinds the provider hashes (regular
    files and symlinks; Go puts ``L`` for a symlink, ``u``/``g``/``t`` for setuid/setgid/sticky)."""
    kind = "L" if stat.S_ISLNK(st_mode) else ""
    kind += "u" if st_mode & stat.S_ISUID else ""
    kind += "g" if st_mode & stat.S_ISGID else ""
    kind += "t" if st_mode & stat.S_ISVTX else ""
    perm = "".join(c if st_mode & (1 << (8 - i)) else "-" for i, c in enumerate("rwxrwxrwx"))
    return (kind or "-") + perm


def hashed_files(context: pathlib.Path, dockerfile: pathlib.Path) -> dict[str, str]:
    """Slash path (relative to ``context``) -> Go mode string of every file whose content the
    provider's context hash reads from the context walk. (It reads the Dockerfile's content too,
    whether the walk includes it or not.) Symlinks to directories are skipped, as ``hashFile``
    does (reading one fails with EISDIR, which it ignores)."""
    found = ignore_file(context, dockerfile)
    patterns = compile_patterns(read_ignore_file(found.read_text()) if found else [])
    exceptions = [p for p in patterns if p.exclusion]
    # fsutil NewFilterFS onlyPrefixExcludeExceptions: no exception has wildcards before a trailing glob
    prefix_only = not any(any(c in p.without_trailing_glob() for c in "*?[\\") for p in exceptions)
    out: dict[str, str] = {}

    def walk(directory: pathlib.Path, rel: str, parent: list[bool] | None) -> None:
        for entry in sorted(os.scandir(directory), key=lambda e: e.name):
            path = f"{rel}/{entry.name}" if rel else entry.name
            excluded, info = matches(patterns, path, parent) if patterns else (False, [])
            if entry.is_dir(follow_symlinks=False):
                if excluded and prefix_only and not any((p.without_trailing_glob() + "/").startswith(path + "/") for p in exceptions):
                    continue  # fsutil: SkipDir, nothing below can be re-included
                walk(pathlib.Path(entry.path), path, info)
                continue
            if excluded:
                continue
            mode = entry.stat(follow_symlinks=False).st_mode
            if stat.S_ISLNK(mode) and pathlib.Path(entry.path).is_dir():
                continue
            if stat.S_ISREG(mode) or stat.S_ISLNK(mode):
                out[path] = go_mode(mode)

    walk(context, "", None)
    return out


def context_hash(context: pathlib.Path, dockerfile: pathlib.Path) -> str:
    """``hashBuildContext`` for an on-disk context without named contexts: SHA-256 over the
    Dockerfile's content, then per file of the walk (in its lexical order) its content, slash
    path and mode string."""
    h = hashlib.sha256(dockerfile.read_bytes())
    for path, mode in hashed_files(context, dockerfile).items():
        h.update((context / path).read_bytes())
        h.update(path.encode())
        h.update(mode.encode())
    return h.hexdigest()
