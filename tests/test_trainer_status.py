"""TrainJob progress through the Trainer's status server: what the programs send
(workloads/programs/trainer_status.py), what the platform turns on for it (the chart's feature
gate, the egress to the server) and how trainctl shows it. The real server takes the reports in
tests/e2e/test_trainer_status.py."""

from __future__ import annotations

import datetime
import http.server
import json
import ssl
import threading

import pytest
import trainer_status  # the programs directory is on sys.path (tests/conftest.py), as in the image

from config.settings import ConfigError, TrainerSettings, load_settings
from k8s.builders import tenants, trainer_api
from k8s.builders.runtimes import trainer_chart_values
from tools.cluster import pki
from trainctl import progress

NOW = datetime.datetime(2026, 11, 25, 3, 0, 0, tzinfo=datetime.UTC)


def test_the_body_keeps_within_the_crds_bounds():
    b = trainer_status.body(step=7, total_steps=30, eta_s=12.6, metrics={"loss": 1.234567891, "epoch": 1, "nan": float("nan"), "": 3, "x" * 80: "y" * 80}, now=NOW)
    ts = b["trainerStatus"]
    assert ts["progressPercentage"] == 23 and ts["estimatedRemainingSeconds"] == 13
    assert ts["lastUpdatedTime"] == "2026-11-25T03:00:00Z"  # required by the CRD's rule
    names = {m["name"]: m["value"] for m in ts["metrics"]}
    assert names["loss"] == "1.23457" and names["epoch"] == "1"
    assert "nan" not in names and "" not in names  # NaN is no value; a name needs a character
    assert all(1 <= len(m["name"]) <= 64 and 1 <= len(m["value"]) <= 64 for m in ts["metrics"])
    over = trainer_status.body(step=40, total_steps=30, eta_s=-5, metrics={f"m{i}": i for i in range(300)}, now=NOW)["trainerStatus"]
    assert over["progressPercentage"] == 100 and over["estimatedRemainingSeconds"] == 0 and len(over["metrics"]) == 256
    unknown = trainer_status.body(step=3, total_steps=None, eta_s=None, now=NOW)["trainerStatus"]
    assert set(unknown) == {"lastUpdatedTime"}  # unknown stays empty, as the CRD says


def test_without_the_trainers_variables_nothing_is_sent():
    r = trainer_status.Reporter({})
    assert not r.enabled
    r.update(step=1, total_steps=2, eta_s=1.0)
    assert r.final(step=2, total_steps=2, eta_s=0) is False
    assert r._thread is None


@pytest.fixture
def server(tmp_path):
    """An HTTPS server with the platform's local CA, recording what it is sent; ``status`` sets its answer."""
    pki.make(tmp_path / "pki")
    seen: list[dict] = []
    answer = {"status": 200}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            length = int(self.headers["Content-Length"])
            seen.append({"path": self.path, "auth": self.headers["Authorization"], "type": self.headers["Content-Type"], "body": json.loads(self.rfile.read(length))})
            self.send_response(answer["status"])
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(json.dumps({"message": "Forbidden"} if answer["status"] == 403 else {}).encode())

        def log_message(self, *args):
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tmp_path / "pki" / "webhook.crt", tmp_path / "pki" / "webhook.key")
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    token = tmp_path / "token"
    token.write_text("first-token\n")
    env = {
        trainer_status.URL_ENV: f"https://127.0.0.1:{httpd.server_address[1]}/apis/trainer.kubeflow.org/v1alpha1/namespaces/vision/trainjobs/j/status",
        trainer_status.CA_ENV: str(tmp_path / "pki" / "ca.crt"),
        trainer_status.TOKEN_ENV: str(token),
    }
    yield env, seen, answer, token
    httpd.shutdown()


def test_a_report_is_posted_with_the_projected_token_over_verified_tls(server):
    env, seen, _, token = server
    r = trainer_status.Reporter(env, interval=0.05)
    assert r.final(step=30, total_steps=30, eta_s=0, metrics={"loss": 0.5})
    token.write_text("rotated-token")  # the kubelet rotates the projected token: read at every send
    assert r.send(trainer_status.body(step=1, total_steps=2, eta_s=3))
    assert [s["auth"] for s in seen] == ["Bearer first-token", "Bearer rotated-token"]
    assert seen[0]["path"] == "/apis/trainer.kubeflow.org/v1alpha1/namespaces/vision/trainjobs/j/status"
    assert seen[0]["type"] == "application/json"
    assert seen[0]["body"]["trainerStatus"]["progressPercentage"] == 100
    assert seen[0]["body"]["trainerStatus"]["metrics"] == [{"name": "loss", "value": "0.5"}]


def test_steps_are_sent_from_a_thread_at_most_every_interval_newest_first(server):
    env, seen, _, _ = server
    r = trainer_status.Reporter(env, interval=0.3)
    for step in range(1, 51):
        r.update(step=step, total_steps=50, eta_s=50 - step)
    deadline = datetime.datetime.now() + datetime.timedelta(seconds=5)
    while not seen and datetime.datetime.now() < deadline:
        threading.Event().wait(0.05)
    threading.Event().wait(0.5)
    # 50 updates in a burst: a first report, then at most one more with the newest step
    assert 1 <= len(seen) <= 2, seen
    assert seen[-1]["body"]["trainerStatus"]["progressPercentage"] == 100


def test_a_refusal_or_an_unreachable_server_is_said_once_and_training_goes_on(server, capsys):
    env, _, answer, _ = server
    answer["status"] = 403
    r = trainer_status.Reporter(env)
    assert r.send(trainer_status.body(step=1, total_steps=2, eta_s=1)) is False
    assert r.send(trainer_status.body(step=2, total_steps=2, eta_s=0)) is False
    err = capsys.readouterr().err
    assert err.count("trainer status:") == 1 and "403 Forbidden" in err
    gone = trainer_status.Reporter({**env, trainer_status.URL_ENV: "https://127.0.0.1:9/x"}, timeout=1)
    assert gone.send(trainer_status.body(step=1, total_steps=2, eta_s=1)) is False
    assert "not reachable" in capsys.readouterr().err
    bad_ca = trainer_status.Reporter({**env, trainer_status.CA_ENV: env[trainer_status.TOKEN_ENV]})
    assert bad_ca.send(trainer_status.body(step=1, total_steps=2, eta_s=1)) is False  # no exception


def test_the_status_server_is_on_only_where_the_stack_asks_and_the_trainer_has_it():
    on = TrainerSettings(version="v2.3.0", progress_in_status=True)
    assert trainer_chart_values(on)["manager"]["config"]["featureGates"] == {"TrainJobStatus": True}
    assert "manager" not in trainer_chart_values(TrainerSettings(version="v2.3.0"))  # off by default (trainer_api.status_server_on)
    assert "manager" not in trainer_chart_values(TrainerSettings(version="v2.1.0"))
    # the jobs' namespaces may reach the manager's status port, and nothing else of its namespace
    rule = tenants.egress_policy("vision", {}, trainer_status=True)["spec"]["egress"][-1]
    assert rule == {
        "to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kubeflow-system"}}, "podSelector": {"matchLabels": trainer_api.MANAGER_POD_LABELS}}],
        "ports": [{"protocol": "TCP", "port": 10443}],
    }
    off = tenants.egress_policy("vision", {})["spec"]["egress"]
    assert len(off) == 3 and not any("kubeflow-system" in str(r) for r in off)


def test_progress_in_status_on_a_trainer_without_it_is_refused():
    with pytest.raises(ConfigError) as err:
        load_settings({"trainer": {"version": "v2.1.0", "progressInStatus": True}}, stack="dev", region="us-west-2")
    assert "trainer.progressInStatus = True: Trainer v2.1.0 has no TrainJobStatus feature" in str(err.value)


def test_trainctl_shows_the_trainers_progress_before_the_logs():
    tj = {"status": {"trainerStatus": {"progressPercentage": 42, "estimatedRemainingSeconds": 120, "metrics": [{"name": "loss", "value": "1.93"}], "lastUpdatedTime": "2026-11-25T03:00:00Z"}}}
    p = progress.of_trainjob(tj)
    assert p == {"source": "trainer", "percent": 42, "eta_s": 120, "metrics": {"loss": "1.93"}, "updated": "2026-11-25T03:00:00Z"}
    assert progress.text(p) == "42% eta 120s loss 1.93"
    assert progress.of_trainjob({"status": {}}) is None
    assert progress.text(progress.of_lines(['TRAINING_EVENT {"event": "step", "step": 7, "total_steps": 30, "eta_s": 12.4}'])) == "7/30 eta 12s"
    assert progress.text(None) == "-"


def test_the_programs_step_and_result_events_feed_the_reporter(monkeypatch, capsys):
    import types

    import trainlib

    calls = []

    class Recorder:
        def update(self, **fields):
            calls.append(("update", fields))

        def final(self, **fields):
            calls.append(("final", fields))

    monkeypatch.setattr(trainlib, "_STATUS", Recorder())
    monkeypatch.setattr(trainlib, "_METRICS", {})
    rank0, other = types.SimpleNamespace(is_main=True), types.SimpleNamespace(is_main=False)
    trainlib.event(rank0, "step", step=7, epoch=0, loss=1.5, samples_per_s=900.0, total_steps=30, eta_s=12.0)
    trainlib.event(other, "step", step=7, epoch=0, loss=9.9, total_steps=30, eta_s=12.0)  # only rank 0 reports
    trainlib.event(rank0, "eval", step=10, epoch=0, val_loss=1.2, val_accuracy=0.9)
    trainlib.event(rank0, "result", final_step=30, final_loss=0.5, resumed_from_step=None)
    assert calls[0] == ("update", {"step": 7, "total_steps": 30, "eta_s": 12.0, "metrics": {"loss": 1.5, "epoch": 0, "samples_per_s": 900.0}})
    assert calls[1] == ("final", {"step": 30, "total_steps": 30, "eta_s": 0, "metrics": {"loss": 0.5, "epoch": 0, "samples_per_s": 900.0, "val_loss": 1.2, "val_accuracy": 0.9}})
    assert len(calls) == 2
    assert "TRAINING_EVENT" in capsys.readouterr().out  # the log lines stay


def test_the_final_report_is_never_overtaken_by_a_step_report(server):
    env, seen, _, _ = server
    r = trainer_status.Reporter(env, interval=0.0)
    for step in range(1, 200):
        r.update(step=step, total_steps=200, eta_s=1.0)
    assert r.final(step=200, total_steps=200, eta_s=0)
    r.update(step=5, total_steps=200, eta_s=1.0)  # after the end: ignored
    threading.Event().wait(0.3)
    assert seen[-1]["body"]["trainerStatus"]["progressPercentage"] == 100
