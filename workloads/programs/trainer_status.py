"""Progress, ETA and metrics reported to the Trainer, so they show in the TrainJob's own status.

Kubeflow Trainer v2.3.0 (feature gate ``TrainJobStatus``, alpha, which the platform turns on)
serves ``POST /apis/trainer.kubeflow.org/v1alpha1/namespaces/<ns>/trainjobs/<name>/status`` over
TLS and writes the body's ``trainerStatus`` into ``TrainJob.status.trainerStatus``. Its
TrainJobStatus plugin gives every trainer container three environment variables: the URL, and the
paths of the server's CA certificate and of a projected service-account token whose audience is
that TrainJob (pkg/runtime/framework/plugins/trainjobstatus, pkg/statusserver in kubeflow/trainer).
The server checks the token's audience and namespace; the body follows the CRD: a percentage
0..100, remaining seconds >= 0, at most 256 metrics of name and value strings of 1..64
characters, and ``lastUpdatedTime`` (required).

Without those variables (Trainer v2.1.0, the local emulator) nothing is sent: progress stays in
the step lines of the log, which ``trainctl`` reads as well. A report never stops or slows
training: it is sent from a thread, at most every ``interval`` seconds, and a failure is said
once and otherwise ignored. Standard library only (the training image needs nothing more).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import ssl
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping

URL_ENV = "KUBEFLOW_TRAINER_SERVER_URL"
CA_ENV = "KUBEFLOW_TRAINER_SERVER_CA_CERT"
TOKEN_ENV = "KUBEFLOW_TRAINER_SERVER_TOKEN"
MAX_METRICS = 256
MAX_TEXT = 64
INTERVAL_S = 30.0
TIMEOUT_S = 5.0


def _text(value) -> str | None:
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        value = f"{value:.6g}"
    s = str(value)
    return s[:MAX_TEXT] if s else None


def body(*, step: int, total_steps: int | None, eta_s: float | None, metrics: dict | None = None, now: datetime.datetime | None = None) -> dict:
    """The UpdateTrainJobStatusRequest for one step, within the CRD's bounds."""
    when = now or datetime.datetime.now(datetime.timezone.utc)  # noqa: UP017 (datetime.UTC needs Python 3.11; images may have older)
    status: dict = {"lastUpdatedTime": when.strftime("%Y-%m-%dT%H:%M:%SZ")}
    if total_steps:
        status["progressPercentage"] = max(0, min(100, int(100 * step / total_steps)))
    if eta_s is not None and math.isfinite(eta_s):
        status["estimatedRemainingSeconds"] = max(0, min(2**31 - 1, int(round(eta_s))))
    items = []
    for name, value in (metrics or {}).items():
        text = _text(value)
        if text is not None and name:
            items.append({"name": str(name)[:MAX_TEXT], "value": text})
    if items:
        status["metrics"] = items[:MAX_METRICS]
    return {"trainerStatus": status}


class Reporter:
    """Sends the latest step's status to the Trainer (rank 0 of the job only)."""

    def __init__(self, env: Mapping[str, str] | None = None, *, interval: float = INTERVAL_S, timeout: float = TIMEOUT_S):
        source: Mapping[str, str] = os.environ if env is None else env
        self.url, self.ca, self.token = source.get(URL_ENV), source.get(CA_ENV), source.get(TOKEN_ENV)
        self.interval, self.timeout = interval, timeout
        self._last_sent = -math.inf
        self._pending: dict | None = None
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()  # one report at a time: the final one is never overtaken
        self._finished = False
        self._wake = threading.Event()
        self._said: set[str] = set()
        self._thread: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.url and self.ca and self.token)

    def update(self, **fields) -> None:
        """Queue this step's status; the thread sends the newest once ``interval`` has passed."""
        if not self.enabled or self._finished:
            return
        with self._lock:
            self._pending = body(**fields)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True, name="trainer-status")
            self._thread.start()
        self._wake.set()

    def final(self, **fields) -> bool:
        """Send the last status now (the job is done: 100 %, nothing remaining)."""
        if not self.enabled:
            return False
        with self._lock:
            self._pending, self._finished = None, True
        with self._send_lock:
            return self.send(body(**fields))

    def _run(self) -> None:
        while True:
            self._wake.wait()
            wait = self._last_sent + self.interval - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            with self._lock:
                pending, self._pending = self._pending, None
                self._wake.clear()
            if pending is not None:
                with self._send_lock:
                    if not self._finished:  # a step report never lands after the final one
                        self.send(pending)

    def send(self, payload: dict) -> bool:
        self._last_sent = time.monotonic()
        if not (self.url and self.ca and self.token):
            return False
        try:
            with open(self.token, encoding="utf-8") as fh:  # re-read: the kubelet rotates it
                token = fh.read().strip()
            ctx = ssl.create_default_context(cafile=self.ca)
            req = urllib.request.Request(self.url, data=json.dumps(payload).encode(), method="POST",
                                         headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=self.timeout, context=ctx) as resp:
                resp.read()
            return True
        except urllib.error.HTTPError as err:
            self._say(f"HTTP {err.code}", f"the Trainer refused the status ({err.code} {_reason(err)})")
        except (OSError, ssl.SSLError, ValueError) as err:
            self._say(type(err).__name__, f"the Trainer's status server is not reachable ({type(err).__name__}: {err})")
        return False

    def _say(self, key: str, what: str) -> None:
        if key not in self._said:
            self._said.add(key)
            print(f"trainer status: {what}; progress stays in the log's step lines", file=sys.stderr, flush=True)


def _reason(err: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(err.read() or b"{}").get("message", "")).strip() or err.reason
    except (ValueError, OSError):
        return str(err.reason)
