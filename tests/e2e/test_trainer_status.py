"""TrainJob progress on the real Trainer (v2.3.0, its TrainJobStatus gate on as the stack's chart
values turn it on with ``trainer.progressInStatus``): the controller gives each job's pods the status server's URL, CA and a token
for that job; the programs' reporter (workloads/programs/trainer_status.py) posts to the real
server with them; the TrainJob's status carries the progress; trainctl shows it. A token for
another job, or from another namespace, is refused by the server.

The simulated pods run no program, so this test does what a pod would: it takes the env, the CA
(the ConfigMap the Trainer made) and a token with the projected volume's audience (TokenRequest,
as the kubelet does), and sends from this machine to the server's loopback address."""

from __future__ import annotations

import json
import urllib.parse

import pytest
import trainer_status  # the programs directory is on sys.path (tests/conftest.py), as in the image

from tests.e2e.conftest import stack_file, wait_for
from trainctl import cli

STACK = "dev"
NS = "training"
TRAINJOB = ("trainer.kubeflow.org/v1alpha1", "TrainJob")
JOBSET = ("jobset.x-k8s.io/v1alpha2", "JobSet")


@pytest.fixture(scope="module")
def dev(clusters):
    """The dev stack with trainer.progressInStatus on (off by default: see trainer_api.status_server_on)."""
    stack = stack_file(STACK)
    stack["config"]["training-platform:trainer"]["progressInStatus"] = True
    yield clusters.get(STACK, instance="trainer-status", stack_config=stack)
    clusters.release(STACK, "trainer-status")


def _trainer_pod(up, job: str, namespace: str = NS) -> dict:
    """The trainer ("node") pod template of the job's JobSet, as the Trainer built it."""
    client = up.client()
    js = wait_for(f"the JobSet of {job}", lambda: client.get_or_none(*JOBSET, job, namespace), up)
    return next(rj for rj in js["spec"]["replicatedJobs"] if rj["name"] == "node")["template"]["spec"]["template"]["spec"]


def _as_the_pod(up, tmp_path, job: str, namespace: str = NS, *, token_for: tuple[str, str] | None = None) -> dict:
    """The reporter's environment as the job's pod has it, pointed at the server's loopback address.
    ``token_for``: (namespace, audience) of the token instead of the pod's own."""
    pod = _trainer_pod(up, job, namespace)
    env = {e["name"]: e.get("value") for e in pod["containers"][0].get("env", [])}
    url = urllib.parse.urlsplit(env[trainer_status.URL_ENV])
    volume = next(v for v in pod["volumes"] if v["name"] == "kubeflow-trainer-token")
    audience = next(s["serviceAccountToken"]["audience"] for s in volume["projected"]["sources"] if "serviceAccountToken" in s)
    ca_configmap = next(s["configMap"]["name"] for s in volume["projected"]["sources"] if "configMap" in s)
    client = up.client()
    ca = client.get("v1", "ConfigMap", ca_configmap, namespace)["data"]["ca.crt"]
    token_ns, token_audience = token_for or (namespace, audience)
    token = client.request("POST", client.path("v1", "ServiceAccount", "default", token_ns) + "/token",
                           body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"audiences": [token_audience], "expirationSeconds": 600}})["status"]["token"]
    (tmp_path / "ca.crt").write_text(ca)
    (tmp_path / "token").write_text(token)
    return {
        trainer_status.URL_ENV: urllib.parse.urlunsplit((url.scheme, f"127.0.0.1:{url.port}", url.path, "", "")),
        trainer_status.CA_ENV: str(tmp_path / "ca.crt"),
        trainer_status.TOKEN_ENV: str(tmp_path / "token"),
    }


def test_the_trainer_gives_each_jobs_pods_its_status_server(dev):
    pod = _trainer_pod(dev, "ddp-mnist")
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env[trainer_status.URL_ENV].endswith("/apis/trainer.kubeflow.org/v1alpha1/namespaces/training/trainjobs/ddp-mnist/status")
    assert env[trainer_status.CA_ENV] and env[trainer_status.TOKEN_ENV]
    volume = next(v for v in pod["volumes"] if v["name"] == "kubeflow-trainer-token")
    sources = volume["projected"]["sources"]
    assert any(s.get("serviceAccountToken", {}).get("audience") == "trainer.kubeflow.org/v1alpha1/namespaces/training/trainjobs/ddp-mnist/status" for s in sources)


def test_the_programs_reports_become_the_trainjobs_status_and_trainctl_shows_them(dev, tmp_path, capsys):
    env = _as_the_pod(dev, tmp_path, "ddp-mnist")
    reporter = trainer_status.Reporter(env)
    assert reporter.send(trainer_status.body(step=7, total_steps=30, eta_s=42.4, metrics={"loss": 1.9375, "epoch": 0})), capsys.readouterr().err
    client = dev.client()
    ts = wait_for("the TrainJob's trainerStatus", lambda: (client.get(*TRAINJOB, "ddp-mnist", NS).get("status") or {}).get("trainerStatus"), dev, timeout=30)
    assert ts["progressPercentage"] == 23 and ts["estimatedRemainingSeconds"] == 42
    assert {m["name"]: m["value"] for m in ts["metrics"]} == {"loss": "1.9375", "epoch": "0"}
    assert ts["lastUpdatedTime"]

    capsys.readouterr()
    rc = cli.main(["status", "--kubeconfig", str(dev.kubeconfig), "-n", NS, "ddp-mnist", "-o", "json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    shown = json.loads(out.out)["progress"]
    assert shown["source"] == "trainer" and shown["percent"] == 23 and shown["eta_s"] == 42

    # the last report of a finished run
    assert reporter.final(step=30, total_steps=30, eta_s=0, metrics={"loss": 0.25})
    wait_for("100 % in the TrainJob's status", lambda: client.get(*TRAINJOB, "ddp-mnist", NS)["status"]["trainerStatus"].get("progressPercentage") == 100, dev, timeout=30)


@pytest.mark.parametrize("whose", ["another job's audience", "another namespace"])
def test_the_server_refuses_a_token_not_for_this_job(dev, tmp_path, capsys, whose):
    other = (NS, "trainer.kubeflow.org/v1alpha1/namespaces/training/trainjobs/fsdp-t5/status") if whose == "another job's audience" else \
        ("kube-system", "trainer.kubeflow.org/v1alpha1/namespaces/training/trainjobs/ddp-mnist/status")
    env = _as_the_pod(dev, tmp_path, "ddp-mnist", token_for=other)
    capsys.readouterr()
    assert trainer_status.Reporter(env).send(trainer_status.body(step=1, total_steps=30, eta_s=1)) is False
    assert "403" in capsys.readouterr().err
