"""What the emulated pods print, read and kept within bounds.

- :func:`read_lines`: a pod's output as lines, read in chunks of at most ``CHUNK`` bytes, decoded
  as UTF-8 with replacement characters for bytes that are not (a program may print anything: a
  reader that dies on a byte leaves the pod blocked on a full pipe), and a line with no newline
  cut every ``MAX_LINE_BYTES`` bytes (output that never ends a line holds no more than that).
- :class:`CappedLog`: the emulator's own output in a file that is rotated once it holds
  ``max_bytes``: the file moves to ``<file>.1`` (replacing an older one) and the new file starts
  with a line that says so, so the two together never hold more than twice the cap.
"""

from __future__ import annotations

import io
import os
import threading
from collections.abc import Iterator

CHUNK = 64 * 1024
MAX_LINE_BYTES = 64 * 1024
DEFAULT_LOG_MAX_BYTES = 64 * 1024 * 1024


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace").rstrip("\r")


def read_lines(fd: int, max_line: int = MAX_LINE_BYTES) -> Iterator[str]:
    """The lines of the output on ``fd`` until its end (every writer gone), without newlines."""
    cut = f" [line cut at {max_line} bytes: it goes on in the next line]"
    buf = bytearray()
    while True:
        try:
            chunk = os.read(fd, CHUNK)
        except OSError:  # closed under us: the end
            chunk = b""
        if not chunk:
            break
        buf += chunk
        start = 0
        while (end := buf.find(b"\n", start)) >= 0:
            line = bytes(buf[start:end])
            start = end + 1
            while len(line) > max_line:
                yield _text(line[:max_line]) + cut
                line = line[max_line:]
            yield _text(line)
        del buf[:start]
        while len(buf) > max_line:  # no newline in sight: what has come so far goes out as lines
            yield _text(bytes(buf[:max_line])) + cut
            del buf[:max_line]
    if buf:
        yield _text(bytes(buf))


class CappedLog(io.TextIOBase):
    """A text stream appending to ``path``, rotated to ``path.1`` when it would exceed ``max_bytes``."""

    def __init__(self, path: str | os.PathLike, max_bytes: int = DEFAULT_LOG_MAX_BYTES):
        super().__init__()
        self.path, self.max_bytes = os.fspath(path), max_bytes
        self._lock = threading.Lock()
        self._fh = open(self.path, "ab")  # noqa: SIM115 - held for the emulator's life
        self._size = os.fstat(self._fh.fileno()).st_size  # what it holds, buffered writes included

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        data = s.encode("utf-8", errors="replace")
        with self._lock:
            if self._size and self._size + len(data) > self.max_bytes:
                self._rotate()
            self._fh.write(data)
            self._size += len(data)
        return len(s)

    def flush(self) -> None:
        with self._lock:
            self._fh.flush()

    def _rotate(self) -> None:
        self._fh.close()
        os.replace(self.path, self.path + ".1")
        self._fh = open(self.path, "ab")  # noqa: SIM115
        name = os.path.basename(self.path)
        marker = (
            f"emulate: {name} reached its cap of {self.max_bytes} bytes ({self.max_bytes / 2**20:g} MiB): "
            f"the output before this line is in {name}.1, anything older was dropped\n"
        ).encode()
        self._fh.write(marker)
        self._size = len(marker)

    def close(self) -> None:
        super().close()  # flushes first
        with self._lock:
            self._fh.close()
