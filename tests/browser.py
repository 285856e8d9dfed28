"""What the portal's browser tests share: Debian's chromium driven by Playwright, and an app served
by uvicorn on 127.0.0.1 in a thread of the test's process."""

from __future__ import annotations

import contextlib
import pathlib
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn

CHROMIUM = "/usr/bin/chromium"  # .ci/run installs Debian's chromium
SHOTS = pathlib.Path(__file__).resolve().parents[1] / "out" / "portal-screenshots"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(app: Any, port: int | None = None) -> Iterator[str]:
    """``app`` at http://127.0.0.1:PORT (a free port unless given) until the block ends."""
    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A Playwright browser on Debian's chromium; without it the test fails, saying how to get it."""
    assert shutil.which(CHROMIUM) or pathlib.Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: apt-get install -y chromium (.ci/run does)"
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()
