"""trainctl against a real API server with the real Trainer and JobSet: submit, list, status, logs,
delete. (tests/test_trainctl.py keeps the recorded-answer tests for what a local cluster cannot
show: another Trainer release's schema, API errors of a managed cluster.)"""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import trainctl, wait_for
from tools.cluster.components import SIMULATED_POD_LOG
from trainctl import cli

STACK = "dev"
NS = "training"


@pytest.fixture(scope="module")
def dev(clusters):
    return clusters.get(STACK)


def test_submit_list_status_logs_delete(dev, capsys, tmp_path):
    (tmp_path / "train.py").write_text("import torch.distributed as dist\nprint('rank up')\n")
    rc, out, err = trainctl(capsys, dev, "submit", "-n", NS, "--nodes", "2", "--name", "e2e-trainctl", str(tmp_path), "--", "python", "train.py")
    assert rc == 0, err
    assert "trainjob/e2e-trainctl created" in out
    client = dev.client()
    # the real Trainer made its JobSet; the real JobSet controller its Jobs; pods run on Karpenter's nodes
    wait_for("the JobSet of e2e-trainctl", lambda: client.get_or_none("jobset.x-k8s.io/v1alpha2", "JobSet", "e2e-trainctl", NS), dev)
    def placed():
        pods = [p for p in client.list("v1", "Pod", NS, label_selector="jobset.sigs.k8s.io/jobset-name=e2e-trainctl") if p["spec"].get("nodeName") and p["status"].get("phase") in ("Running", "Succeeded")]
        # logs are fetched from the node's address, which kwok writes when it initializes the node
        return pods if len(pods) == 2 and all(client.get("v1", "Node", p["spec"]["nodeName"])["status"].get("addresses") for p in pods) else None

    wait_for("the 2 pods of e2e-trainctl started on nodes", placed, dev, timeout=180)

    rc, out, err = trainctl(capsys, dev, "list", "-n", NS, "-o", "json")
    assert rc == 0, err
    assert "e2e-trainctl" in {j["name"] for j in json.loads(out)}

    rc, out, err = trainctl(capsys, dev, "status", "-n", NS, "e2e-trainctl", "-o", "json")
    assert rc == 0, err
    status = json.loads(out)
    assert status["name"] == "e2e-trainctl"

    # logs come through the API server from the node's kubelet API (kwok's, for a simulated node)
    rc, out, err = trainctl(capsys, dev, "logs", "-n", NS, "e2e-trainctl", "--node", "1")
    assert rc == 0, err
    assert SIMULATED_POD_LOG.split(" F ", 1)[1].strip() in out

    rc, out, err = trainctl(capsys, dev, "delete", "-n", NS, "e2e-trainctl")
    assert rc == 0, err
    wait_for("e2e-trainctl and its JobSet gone", lambda: client.get_or_none("trainer.kubeflow.org/v1alpha1", "TrainJob", "e2e-trainctl", NS) is None
             and client.get_or_none("jobset.x-k8s.io/v1alpha2", "JobSet", "e2e-trainctl", NS) is None, dev)
    rc, out, err = trainctl(capsys, dev, "status", "-n", NS, "e2e-trainctl")
    assert rc != 0 and "not found" in err and len(err.strip().splitlines()) == 1


def test_the_namespace_comes_from_the_kubeconfig_context(dev, capsys, tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    import yaml

    cfg = yaml.safe_load(dev.kubeconfig.read_text())
    cfg["contexts"][0]["context"]["namespace"] = NS
    kubeconfig.write_text(yaml.safe_dump(cfg))
    capsys.readouterr()
    rc = cli.main(["list", "--kubeconfig", str(kubeconfig), "-o", "json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert {"ddp-mnist", "fsdp-t5"} <= {j["name"] for j in json.loads(out.out)}


def test_an_unreachable_cluster_is_one_line(dev, capsys, tmp_path):
    import yaml

    cfg = yaml.safe_load(dev.kubeconfig.read_text())
    cfg["clusters"][0]["cluster"]["server"] = "https://127.0.0.1:1"
    bad = tmp_path / "kubeconfig"
    bad.write_text(yaml.safe_dump(cfg))
    capsys.readouterr()
    rc = cli.main(["list", "-n", NS, "--kubeconfig", str(bad)])
    err = capsys.readouterr().err
    assert rc != 0
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err


def test_a_secret_in_the_command_creates_nothing_and_is_not_printed(dev, capsys, tmp_path):
    from workloads.builders import trainjobs as tj

    (tmp_path / "train.py").write_text("print('hi')\n")
    token = "hf_" + "Q7w8E9r0T1y2U3i4O5p6A7s8"
    client = dev.client()
    def made() -> set[tuple[str, str]]:  # what a submit creates: a code ConfigMap and a TrainJob (controllers make other objects meanwhile)
        cms = {("ConfigMap", o["metadata"]["name"]) for o in client.list("v1", "ConfigMap", NS) if o["metadata"]["name"].startswith(tj.CODE_PREFIX + "-")}
        return cms | {("TrainJob", o["metadata"]["name"]) for o in client.list("trainer.kubeflow.org/v1alpha1", "TrainJob", NS)}

    before = made()
    rc, out, err = trainctl(capsys, dev, "submit", "-n", NS, "--nodes", "1", "--name", "e2e-secret", str(tmp_path), "--", "python", "train.py", "--hf-token", token)
    assert rc == 2 and out == "" and err.count("\n") == 1 and "looks like a secret" in err, err
    assert token not in err
    assert made() == before


def test_the_api_server_stores_what_trainctl_counts_as_storable_and_refuses_the_rest(dev):
    """A code ConfigMap of 52,000 one-byte files: trainctl counts it over etcd's 1.5 MiB and the
    real API server (its etcd at the default request limit) refuses it; 45,000 fit both."""
    from tools.cluster.client import ApiError
    from trainctl import code
    from workloads.builders import trainjobs as tj

    client = dev.client()
    many = tj.code_configmap(NS, {f"samples__sample_{i:06d}.txt": "x" for i in range(52_000)})
    assert code.stored_size(many) > code.MAX_OBJECT_BYTES
    with pytest.raises(ApiError) as refused:
        client.create(many)
    assert "request is too large" in str(refused.value), refused.value
    assert client.get_or_none("v1", "ConfigMap", many["metadata"]["name"], NS) is None
    fewer = tj.code_configmap(NS, {f"samples__sample_{i:06d}.txt": "x" for i in range(45_000)})
    assert code.stored_size(fewer) <= code.MAX_OBJECT_BYTES
    client.create(fewer)
    client.request("DELETE", client.path("v1", "ConfigMap", fewer["metadata"]["name"], NS))
