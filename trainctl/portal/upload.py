"""Code uploaded to the portal (several files, or one archive: .zip, .tar, .tar.gz/.tgz) written
into a temporary directory, then read by :func:`trainctl.code.collect` with trainctl's own limits.

Nothing is ever extracted by the archive libraries: each member is checked, then its bytes are
read (at most the limit) and written by this module to a path built from checked parts under the
directory. Refused: absolute paths, ``..``, backslashes, NUL, symbolic and hard links, devices,
FIFOs and anything but a regular file; more than :data:`MAX_FILES` files; more bytes in all
(declared or actually decompressed: a zip bomb stops at the limit) than a ConfigMap holds;
scripts that are not UTF-8 text.
"""

from __future__ import annotations

import io
import pathlib
import stat
import tarfile
import zipfile
from dataclasses import dataclass

from trainctl.code import MAX_CONFIGMAP_BYTES

MAX_FILES = 1000
MAX_BYTES = MAX_CONFIGMAP_BYTES  # unpacked, in all: what one ConfigMap holds (trainctl/code.py)
MAX_UPLOAD_BYTES = 4 * MAX_CONFIGMAP_BYTES  # the request as sent (an archive, or the files together)
ARCHIVE_SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz")
TEXT_SUFFIXES = (".py", ".sh", ".txt", ".yaml", ".yml", ".json", ".toml", ".cfg", ".ini", ".md")


class UploadError(ValueError):
    """Bad upload: one line per problem."""


@dataclass(frozen=True)
class Part:
    name: str
    data: bytes


def safe_path(name: str) -> str | None:
    """The relative POSIX path of an upload's or archive member's name, or None when it is unsafe."""
    if not name or "\x00" in name or "\\" in name or name.startswith("/") or len(name) > 1024:
        return None
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts or any(p == ".." for p in parts):
        return None
    return "/".join(parts)


def _text_problem(rel: str, data: bytes) -> str | None:
    if rel.endswith(TEXT_SUFFIXES):
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as err:
            return f"file {rel!r}: not UTF-8 text (byte {err.start}); save it as UTF-8"
    return None


class _Writer:
    def __init__(self, dest: pathlib.Path):
        self.dest = dest.resolve()
        self.total = 0
        self.count = 0
        self.problems: list[str] = []

    def add(self, name: str, data: bytes) -> None:
        rel = safe_path(name)
        if rel is None:
            self.problems.append(f"file {name[:200]!r}: not a relative path inside the upload (absolute, '..', backslash or empty)")
            return
        self.count += 1
        self.total += len(data)
        if self.count > MAX_FILES:
            raise UploadError(f"more than {MAX_FILES} files in the upload")
        if self.total > MAX_BYTES:
            raise UploadError(f"the upload unpacks to more than {MAX_BYTES} bytes, the 1 MiB a ConfigMap holds: ship large files in an image")
        if (why := _text_problem(rel, data)) is not None:
            self.problems.append(why)
            return
        target = (self.dest / rel).resolve()
        if not target.is_relative_to(self.dest) or target == self.dest:
            self.problems.append(f"file {rel!r}: outside the upload")
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(target, "xb") as f:  # never through a link, never over another file
                f.write(data)
        except (FileExistsError, IsADirectoryError, NotADirectoryError):
            self.problems.append(f"file {rel!r}: given twice (or as a file and a directory)")


def _read_limited(f: io.BufferedIOBase | None, room: int) -> bytes:
    """At most ``room + 1`` bytes: more than the room is refused by the caller."""
    return f.read(room + 1) if f is not None else b""


def _zip(data: bytes, w: _Writer) -> None:
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile:
        raise UploadError("the archive is not a valid zip file") from None
    with zf:
        infos = zf.infolist()
        if len(infos) > MAX_FILES:
            raise UploadError(f"the archive has {len(infos)} entries, more than {MAX_FILES}")
        if sum(i.file_size for i in infos) > MAX_BYTES:
            raise UploadError(f"the archive declares more than {MAX_BYTES} bytes unpacked, the 1 MiB a ConfigMap holds")
        for info in infos:
            mode = info.external_attr >> 16
            if info.is_dir():
                continue
            if stat.S_IFMT(mode) and not stat.S_ISREG(mode):  # a type is given (zip writers may give only permissions)
                w.problems.append(f"entry {info.filename[:200]!r}: not a regular file (a link or a device); only files are accepted")
                continue
            room = MAX_BYTES - w.total
            try:
                with zf.open(info) as f:
                    content = f.read(room + 1)  # a member that inflates past its declared size stops here
            except (zipfile.BadZipFile, RuntimeError, NotImplementedError, EOFError) as err:
                raise UploadError(f"entry {info.filename[:200]!r}: cannot be read ({type(err).__name__}: encrypted or damaged)") from None
            if len(content) > room:
                raise UploadError(f"the archive unpacks to more than {MAX_BYTES} bytes, the 1 MiB a ConfigMap holds")
            w.add(info.filename, content)


def _tar(data: bytes, w: _Writer) -> None:
    try:
        tf = tarfile.open(fileobj=io.BytesIO(data), mode="r:*")
    except (tarfile.TarError, EOFError, OSError):
        raise UploadError("the archive is not a valid tar file") from None
    declared = 0
    entries = 0
    with tf:
        try:
            for m in tf:
                entries += 1
                if entries > MAX_FILES:
                    raise UploadError(f"the archive has more than {MAX_FILES} entries")
                if m.isdir():
                    continue
                if not m.isreg():
                    w.problems.append(f"entry {m.name[:200]!r}: not a regular file (a link, a device or a FIFO); only files are accepted")
                    continue
                declared += m.size
                if declared > MAX_BYTES:
                    raise UploadError(f"the archive unpacks to more than {MAX_BYTES} bytes, the 1 MiB a ConfigMap holds")
                content = _read_limited(tf.extractfile(m), MAX_BYTES - w.total)  # type: ignore[arg-type]
                w.add(m.name, content)
        except (tarfile.TarError, EOFError, OSError, ValueError) as err:
            if isinstance(err, UploadError):
                raise
            raise UploadError(f"the archive is damaged ({type(err).__name__})") from None


def is_archive(name: str) -> bool:
    return name.lower().endswith(ARCHIVE_SUFFIXES)


def unpack(parts: list[Part], dest: pathlib.Path) -> None:
    """Write the upload into ``dest`` (an empty temporary directory); :class:`UploadError` with a
    line per problem when anything is refused."""
    if not parts:
        raise UploadError("no files uploaded")
    if sum(len(p.data) for p in parts) > MAX_UPLOAD_BYTES:
        raise UploadError(f"the upload is larger than {MAX_UPLOAD_BYTES} bytes")
    w = _Writer(dest)
    archives = [p for p in parts if is_archive(p.name)]
    if archives and len(parts) > 1:
        raise UploadError("upload either one archive or several files, not both")
    if archives:
        (_zip if archives[0].name.lower().endswith(".zip") else _tar)(archives[0].data, w)
    else:
        for p in parts:
            w.add(p.name, p.data)
    if w.problems:
        raise UploadError("\n".join(w.problems))
    if w.count == 0:
        raise UploadError("the upload holds no files")
