"""trainctl: the dry run checked against the Trainer CRD schema and CEL rules, bad input refused
with one line and nothing created, and every cluster command run against a fake API server that
answers the Kubernetes REST paths with recorded responses (tests/fixtures/trainctl)."""

from __future__ import annotations

import base64
import http.server
import json
import pathlib
import sys
import threading
import urllib.parse

import pytest
import yaml

from k8s.builders import trainer_api
from tools import emulate
from tools import validate as schema_validation
from trainctl import cli, code, objects
from workloads.builders import trainjobs as tj

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "trainctl"
NS = "vision"
TRAINER = "/apis/trainer.kubeflow.org/v1alpha1"


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def _status(code_: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code_}


class FakeApi:
    """Serves (method, path) -> (status, body) and records every request (method, path, query, body)."""

    def __init__(self):
        self.routes: dict[tuple[str, str], tuple[int, object]] = {}
        self.requests: list[tuple[str, str, dict, object]] = []
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _serve(self):
                url = urllib.parse.urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                query = dict(urllib.parse.parse_qsl(url.query))
                api.requests.append((self.command, url.path, query, body))
                status, payload = api.routes.get((self.command, url.path), (404, _status(404, "NotFound", f"the server could not find the requested resource ({url.path})")))
                data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain" if isinstance(payload, str) else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = _serve

            def log_message(self, format, *args):  # noqa: A002 (the base class names it so)
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def on(self, method: str, path: str, body: object, status: int = 200) -> None:
        self.routes[(method, path)] = (status, body)

    def calls(self, method: str | None = None) -> list[tuple[str, str, dict, object]]:
        return [r for r in self.requests if method is None or r[0] == method]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def api(tmp_path, monkeypatch):
    fake = FakeApi()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "team",
        "clusters": [{"name": "c", "cluster": {"server": fake.url}}],
        "users": [{"name": "u", "user": {"token": "test-token"}}],
        "contexts": [{"name": "team", "context": {"cluster": "c", "user": "u", "namespace": NS}}],
    }))
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.setenv("COLUMNS", "240")
    yield fake
    fake.close()


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def proj(tmp_path) -> pathlib.Path:
    d = tmp_path / "proj"
    (d / "conf").mkdir(parents=True)
    (d / "train.py").write_text("import sys\nprint('training', sys.argv[1:])\n")
    (d / "conf" / "base.yaml").write_text("lr: 0.1\n")
    (d / "weights.bin").write_bytes(bytes(range(256)))
    (d / ".git").mkdir()
    (d / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (d / "__pycache__").mkdir()
    (d / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"\0" * 10)
    (d / ".env").write_text("TOKEN=secret\n")
    return d


MUST_SHOW = ["submit", "--dry-run", "--namespace", NS, "--nodes", "3", "--gpus-per-node", "1", "--instance-type", "g5.xlarge"]


# --- dry run -----------------------------------------------------------------------------------


def test_dry_run_prints_code_configmap_and_valid_trainjob(need_schemas, proj, capsys, monkeypatch):
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(proj.parent))  # no kubeconfig anywhere: the dry run needs none
    rc, out, err = run(capsys, *MUST_SHOW, str(proj), "--", "python", "train.py", "--epochs", "1", "--config", "./conf/base.yaml")
    assert rc == 0, err
    cm, job = list(yaml.safe_load_all(out))
    assert cm["kind"] == "ConfigMap" and cm["metadata"]["namespace"] == NS and cm["immutable"] is True
    # the code is in it, hidden files, .git and __pycache__ are not; binary files as base64 binaryData
    launcher = (tj.PROGRAMS_DIR / "launch.py").read_text()  # the platform's launcher rides along (one failure policy)
    status = (tj.PROGRAMS_DIR / "trainer_status.py").read_text()  # and its progress reporter (import _platform_status)
    assert cm["data"] == {"train.py": (proj / "train.py").read_text(), "conf__base.yaml": "lr: 0.1\n", objects.LAUNCHER: launcher, objects.STATUS_MODULE: status}
    assert base64.b64decode(cm["binaryData"]["weights.bin"]) == bytes(range(256))
    assert cm["metadata"]["name"] == tj.code_configmap_name({"train.py": (proj / "train.py").read_text(), "conf__base.yaml": "lr: 0.1\n", "weights.bin": bytes(range(256)), objects.LAUNCHER: launcher, objects.STATUS_MODULE: status})
    assert job["kind"] == "TrainJob" and job["metadata"]["namespace"] == NS
    assert job["metadata"]["labels"] == {tj.JOB_LABEL: objects.TRAINCTL_KIND, "kueue.x-k8s.io/queue-name": "default", "kueue.x-k8s.io/priority-class": "normal"}
    trainer = job["spec"]["trainer"]
    assert trainer["numNodes"] == 3 and trainer["numProcPerNode"] == 1
    launch = f"{tj.CODE_MOUNT}/{objects.LAUNCHER}"
    assert trainer["command"] == ["python3", launch, "torchrun", "--no-python", "python3", launch, "--worker", "python3", "-u", f"{tj.CODE_MOUNT}/train.py", "--epochs", "1", "--config", f"{tj.CODE_MOUNT}/conf/base.yaml"]
    assert trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == 1
    assert job["spec"]["runtimeRef"]["name"].startswith("torch-distributed-gpu-")
    pod = trainer_api.read_pod_customization(job["spec"])
    code_volume = next(v for v in pod["volumes"] if v["name"] == tj.CODE_VOLUME)
    assert code_volume["configMap"] == {"name": cm["metadata"]["name"], "items": [
        {"key": objects.LAUNCHER, "path": objects.LAUNCHER}, {"key": objects.STATUS_MODULE, "path": objects.STATUS_MODULE}, {"key": "conf__base.yaml", "path": "conf/base.yaml"},
        {"key": "train.py", "path": "train.py"}, {"key": "weights.bin", "path": "weights.bin"}]}
    assert {"name": tj.CHECKPOINT_VOLUME, "persistentVolumeClaim": {"claimName": "checkpoints"}} in pod["volumes"]
    assert pod["nodeSelector"]["node.kubernetes.io/instance-type"] == "g5.xlarge"
    # what the API server would accept: the Trainer CRD's schema and CEL rules, the ConfigMap's schema
    assert schema_validation.validate(job) == []
    assert schema_validation.validate(cm) == []


def test_dry_run_v2_1_shape_and_json_output(need_schemas, proj, capsys):
    rc, out, err = run(capsys, *MUST_SHOW, "--trainer-version", "v2.1.0", "-o", "json", str(proj), "--", "python", "train.py")
    assert rc == 0, err
    doc = json.loads(out)
    job = doc["items"][1]
    assert "podTemplateOverrides" in job["spec"] and "runtimePatches" not in job["spec"]
    assert "kueue.x-k8s.io/queue-name" not in job["metadata"]["labels"]  # Kueue cannot run jobs on v2.1.0
    assert schema_validation.validate(job, "v2.1.0") == []


def test_tensorflow_runtime_keeps_the_wrapper_command(proj):
    bundle = code.collect(proj)
    _, job = objects.build(objects.Request(namespace=NS, nodes=2, runtime="tensorflow", command=["python", "train.py"]), bundle)
    trainer = job["spec"]["trainer"]
    launch = f"{tj.CODE_MOUNT}/{objects.LAUNCHER}"  # after the runtime's TF_CONFIG wrapper: the launcher, then the worker
    assert "command" not in trainer and trainer["args"] == ["python3", launch, "python3", launch, "--worker", "python", f"{tj.CODE_MOUNT}/train.py"] and trainer["numProcPerNode"] == 1
    assert job["spec"]["runtimeRef"]["name"].startswith("tensorflow-distributed-")


def test_three_mib_code_dir_refused(tmp_path, capsys):
    big = tmp_path / "big"
    big.mkdir()
    (big / "train.py").write_text("print(1)\n")
    (big / "data.bin").write_bytes(b"\x00\xff" * (3 * 1024 * 1024 // 2))
    rc, out, err = run(capsys, *MUST_SHOW, str(big), "--", "python", "train.py")
    assert rc != 0 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert "3.0 MiB" in err and "1 MiB (1048576 bytes)" in err and "--image" in err


def test_size_limit_counts_values_as_the_api_server(tmp_path):
    """Exactly 1 MiB of values passes (the API server refuses only more); keys are not counted."""
    d = tmp_path / "d"
    d.mkdir()
    (d / "a.txt").write_text("x" * (code.MAX_CONFIGMAP_BYTES - 1))
    (d / "b.txt").write_text("y")  # 1 byte
    assert code.collect(d).size == code.MAX_CONFIGMAP_BYTES
    (d / "c.txt").write_text("é")  # 2 UTF-8 bytes
    with pytest.raises(code.CodeError):
        code.collect(d)


# --- bad input: one line, non-zero, nothing created ----------------------------------------------


@pytest.mark.parametrize(("args", "expect"), [
    (["--runtime", "jax"], "unknown runtime 'jax'"),
    (["--nodes", "0"], "--nodes 0"),
    (["--instance-type", "m5.large"], "not in the GPU instance catalog"),
    (["--gpus-per-node", "2"], "g5.xlarge has 1 GPUs"),
    (["--grace-seconds", "5"], "--grace-seconds 5: allowed: an integer from 30 to 3600"),
])
def test_bad_input_refused_before_any_request(api, proj, capsys, args, expect):
    argv = ["submit", "--namespace", NS, "--nodes", "2", *args, str(proj), "--", "python", "train.py"]
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and expect in err
    assert api.requests == []


@pytest.mark.parametrize(("ns", "expect"), [
    ("kube-system", "not a team's namespace (Kubernetes system components"),
    ("kubeflow-system", "not a team's namespace (the Kubeflow Trainer controller)"),
    ("kube-anything", "not a team's namespace (the kube- prefix is Kubernetes' own)"),
    ("default", "not a team's namespace (the namespace of everything unplaced)"),
])
@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]])
def test_a_system_namespace_is_refused_dry_run_too(api, proj, capsys, ns, expect, dry_run):
    """The namespaces the stack's config refuses for jobs (config.job_models.system_namespaces)
    are refused by trainctl before anything is printed or sent, as the one line of the refusal."""
    rc, out, err = run(capsys, "submit", *dry_run, "--namespace", ns, "--nodes", "1", str(proj), "--", "python", "train.py")
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert f"--namespace {ns}: {expect}" in err and "allowed: your team's namespace" in err
    assert api.requests == []


def test_missing_code_dir_refused(api, tmp_path, capsys):
    rc, out, err = run(capsys, "submit", "--namespace", NS, "--nodes", "2", str(tmp_path / "nope"), "--", "python", "train.py")
    assert rc == 2 and out == "" and err.count("\n") == 1 and "does not exist" in err
    assert api.requests == []


def test_forbidden_namespace_refused_nothing_created(api, proj, capsys):
    api.on("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", fixture("ssar-denied.json"), 201)
    rc, out, err = run(capsys, "submit", "--namespace", NS, "--nodes", "2", str(proj), "--", "python", "train.py")
    assert rc == 1 and out == "" and err.count("\n") == 1
    assert f"you may not create trainjobs in namespace {NS}" in err
    assert [(m, p) for m, p, _, _ in api.requests] == [("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews")]
    assert api.requests[0][3]["spec"] == {"resourceAttributes": {"namespace": NS, "verb": "create", "group": "trainer.kubeflow.org", "resource": "trainjobs"}}


# --- against the (fake) cluster ------------------------------------------------------------------


def test_submit_creates_configmap_then_trainjob(api, proj, capsys):
    api.on("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", fixture("ssar-allowed.json"), 201)
    api.on("GET", "/openapi/v3/apis/trainer.kubeflow.org/v1alpha1", fixture("openapi-trainer-v1alpha1.json"))
    api.on("GET", f"{TRAINER}/clustertrainingruntimes", fixture("clustertrainingruntimes.json"))
    api.on("POST", f"/api/v1/namespaces/{NS}/configmaps", {}, 201)
    api.on("POST", f"{TRAINER}/namespaces/{NS}/trainjobs", {}, 201)
    argv = ["submit", "--namespace", NS, "--nodes", "3", "--gpus-per-node", "1", "--name", "resnet-try", str(proj), "--", "python", "train.py"]
    rc, out, err = run(capsys, *argv)
    assert rc == 0, err
    expected_cm, expected_job = objects.build(
        objects.Request(namespace=NS, nodes=3, gpus_per_node=1, name="resnet-try", command=["python", "train.py"], runtime_name="torch-distributed-gpu-777f43c4"), code.collect(proj),
    )
    assert [(m, p, q) for m, p, q, _ in api.requests] == [
        ("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", {}),
        ("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", {}),
        ("GET", "/openapi/v3/apis/trainer.kubeflow.org/v1alpha1", {}),
        # the current runtime by the platform's label; the old one (being deleted) is passed over
        ("GET", f"{TRAINER}/clustertrainingruntimes", {"labelSelector": "training-platform/runtime=torch-distributed-gpu"}),
        # the platform's published facts (none on this cluster: the request stands as given)
        ("GET", f"/api/v1/namespaces/{NS}/configmaps/platform-facts", {}),
        ("POST", f"/api/v1/namespaces/{NS}/configmaps", {}),
        ("POST", f"{TRAINER}/namespaces/{NS}/trainjobs", {}),
    ]
    assert api.requests[1][3]["spec"]["resourceAttributes"] == {"namespace": NS, "verb": "create", "group": "", "resource": "configmaps"}
    assert api.requests[5][3] == expected_cm
    assert api.requests[6][3] == expected_job
    assert out.strip() == f"trainjob/resnet-try created in {NS}: 3 nodes on torch-distributed-gpu-777f43c4, code in configmap/{expected_cm['metadata']['name']}"


def test_an_efa_submit_to_a_cluster_without_facts_warns_that_it_runs_the_stock_image(api, proj, capsys):
    """No platform-facts ConfigMap: the request stands as given, with no image, so the runtime's
    stock image (no EFA software) runs it; said as a warning, the job is still created."""
    api.on("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", fixture("ssar-allowed.json"), 201)
    api.on("GET", "/openapi/v3/apis/trainer.kubeflow.org/v1alpha1", fixture("openapi-trainer-v1alpha1.json"))
    api.on("GET", f"{TRAINER}/clustertrainingruntimes", fixture("clustertrainingruntimes.json"))
    api.on("POST", f"/api/v1/namespaces/{NS}/configmaps", {}, 201)
    api.on("POST", f"{TRAINER}/namespaces/{NS}/trainjobs", {}, 201)
    rc, out, err = run(capsys, "submit", "--namespace", NS, "--nodes", "2", "--instance-type", "p4d.24xlarge", "--efa-zone", "us-west-2a", "--name", "efa-try", str(proj), "--", "python", "train.py")
    assert rc == 0, err
    assert err.startswith("trainctl: warning: --efa-zone: the job names no image") and err.count("\n") == 1
    assert "image" not in api.requests[-1][3]["spec"]["trainer"]


def test_submit_cleans_up_configmap_when_trainjob_refused(api, proj, capsys):
    api.on("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", fixture("ssar-allowed.json"), 201)
    api.on("POST", f"/api/v1/namespaces/{NS}/configmaps", {}, 201)
    api.on("POST", f"{TRAINER}/namespaces/{NS}/trainjobs", _status(409, "AlreadyExists", 'trainjobs.trainer.kubeflow.org "x" already exists'), 409)
    cm_name = tj.code_configmap_name(objects.with_launcher(code.collect(proj)).files)
    api.on("DELETE", f"/api/v1/namespaces/{NS}/configmaps/{cm_name}", {}, 200)
    rc, _, err = run(capsys, "submit", "--namespace", NS, "--nodes", "1", "--name", "x", "--trainer-version", "v2.3.0", "--runtime-name", "torch-distributed-gpu-777f43c4", str(proj), "--", "python", "train.py")
    assert rc == 1 and "already exists" in err and err.count("\n") == 1
    assert api.calls("DELETE") == [("DELETE", f"/api/v1/namespaces/{NS}/configmaps/{cm_name}", {}, None)]


def _serve_jobs(api: FakeApi) -> dict:
    jobs = fixture("trainjobs.json")
    api.on("GET", f"{TRAINER}/namespaces/{NS}/trainjobs", jobs)
    for item in jobs["items"]:
        api.on("GET", f"{TRAINER}/namespaces/{NS}/trainjobs/{item['metadata']['name']}", item)
    runtimes = fixture("clustertrainingruntimes.json")
    for rt in runtimes["items"]:
        api.on("GET", f"{TRAINER}/clustertrainingruntimes/{rt['metadata']['name']}", {**rt, "apiVersion": runtimes["apiVersion"], "kind": "ClusterTrainingRuntime"})
    api.on("GET", f"{TRAINER}/clustertrainingruntimes", runtimes)
    api.on("GET", f"{TRAINER}/namespaces/{NS}/trainingruntimes", {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainingRuntimeList", "metadata": {"resourceVersion": "1"}, "items": []})
    return jobs


def test_list_table_json_yaml(api, capsys):
    _serve_jobs(api)
    rc, out, err = run(capsys, "list")
    assert rc == 0, err
    lines = {line.split("│")[1].strip(): line for line in out.splitlines() if line.startswith("│") and "NAME" not in line}
    assert set(lines) == {"bert-9f8e7d", "gpt-000111", "resnet-a1b2c3"}
    assert "Queued" in lines["bert-9f8e7d"] and "Failed" in lines["gpt-000111"] and "Running" in lines["resnet-a1b2c3"]
    rc, out, _ = run(capsys, "list", "-o", "json")
    assert json.loads(out) == [
        {"name": "bert-9f8e7d", "phase": "Queued", "nodes": 4, "runtime": "torch-distributed-gpu-777f43c4", "queue": "default", "created": "2026-11-23T09:30:00Z", "progress": "-"},
        {"name": "gpt-000111", "phase": "Failed", "nodes": 2, "runtime": "torch-distributed-gpu-777f43c4", "queue": "default", "created": "2026-11-22T21:00:00Z", "progress": "-"},
        {"name": "resnet-a1b2c3", "phase": "Running", "nodes": 2, "runtime": "torch-distributed-gpu-777f43c4", "queue": "default", "created": "2026-11-23T08:00:00Z", "progress": "-"},
    ]
    rc, out, _ = run(capsys, "list", "-o", "yaml")
    assert yaml.safe_load(out)[0]["name"] == "bert-9f8e7d"
    # the namespace came from the kubeconfig context; one list call, and the running job's pods for its progress
    assert {(m, p) for m, p, _, _ in api.requests} == {("GET", f"{TRAINER}/namespaces/{NS}/trainjobs"), ("GET", f"/api/v1/namespaces/{NS}/pods")}


def test_status_running_job(api, capsys):
    _serve_jobs(api)
    api.on("GET", f"/api/v1/namespaces/{NS}/pods", fixture("pods-resnet.json"))
    events = fixture("events-trainjob-resnet.json")
    api.on("GET", f"/api/v1/namespaces/{NS}/events", events)
    rc, out, err = run(capsys, "status", "resnet-a1b2c3", "-o", "json")
    assert rc == 0, err
    report = json.loads(out)
    assert {k: v for k, v in report.items() if k != "steps"} == {
        "name": "resnet-a1b2c3", "namespace": NS, "phase": "Running", "admission": "admitted: Admitted by clusterQueue team-vision",
        "runtime": "torch-distributed-gpu-777f43c4", "nodes": 2, "restarts": 1, "created": "2026-11-23T08:00:00Z",
        "started": "2026-11-23T08:01:12Z", "finished": None,
        "lastFailure": "pod resnet-a1b2c3-node-0-1-m3n8v container node exited 137 (OOMKilled)",
    }
    # per-node steps from the Kubeflow SDK (the newest pod of each node)
    assert sorted((s["name"], s["status"], s["pod"]) for s in report["steps"]) == [
        ("node-0", "Running", "resnet-a1b2c3-node-0-0-x7k2p"), ("node-1", "Pending", "resnet-a1b2c3-node-0-1-q9w4e")]
    pod_queries = [q for m, p, q, _ in api.requests if p == f"/api/v1/namespaces/{NS}/pods"]
    assert pod_queries[0] == {"labelSelector": "jobset.sigs.k8s.io/jobset-name=resnet-a1b2c3"}
    event_queries = [q["fieldSelector"] for m, p, q, _ in api.requests if p == f"/api/v1/namespaces/{NS}/events"]
    assert event_queries == ["involvedObject.kind=TrainJob,involvedObject.name=resnet-a1b2c3", "involvedObject.kind=Workload"]
    assert not api.calls("POST") and not api.calls("DELETE")


def test_status_queued_says_why_and_failed_says_reason(api, capsys):
    _serve_jobs(api)
    api.on("GET", f"/api/v1/namespaces/{NS}/pods", {"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": []})
    api.on("GET", f"/api/v1/namespaces/{NS}/events", fixture("events-workload.json"))
    rc, out, err = run(capsys, "status", "bert-9f8e7d", "-o", "yaml")
    assert rc == 0, err
    report = yaml.safe_load(out)
    assert report["phase"] == "Queued"
    assert report["admission"] == "queued in default: couldn't assign flavors to pod set node: insufficient unused quota for nvidia.com/gpu in flavor gpu-pool, 2 more needed"
    assert report["restarts"] == 0 and report["started"] is None and report["steps"] == []
    rc, out, _ = run(capsys, "status", "gpt-000111", "-o", "json")
    report = json.loads(out)
    assert report["phase"] == "Failed" and report["finished"] == "2026-11-22T23:41:17Z"
    assert report["lastFailure"] == "ReachedMaxRestarts: jobset failed due to reaching max number of restarts"
    rc, out, _ = run(capsys, "status", "bert-9f8e7d")
    assert "Queued" in out and "insufficient unused quota" in out


def test_status_unknown_job_one_line(api, capsys):
    api.on("GET", f"{TRAINER}/namespaces/{NS}/trainjobs/nope", fixture("status-404-trainjob.json"), 404)
    rc, out, err = run(capsys, "status", "nope")
    assert rc == 1 and out == "" and err == f"trainctl: error: trainjob nope not found in namespace {NS}\n"


def test_logs_of_a_node(api, capsys):
    _serve_jobs(api)
    api.on("GET", f"/api/v1/namespaces/{NS}/pods", fixture("pods-resnet.json"))
    api.on("GET", f"/api/v1/namespaces/{NS}/pods/resnet-a1b2c3-node-0-0-x7k2p/log", "step 1 loss 2.31\nstep 2 loss 2.05\n")
    rc, out, err = run(capsys, "logs", "resnet-a1b2c3", "--node", "0")
    assert rc == 0, err
    assert out == "step 1 loss 2.31\nstep 2 loss 2.05\n"
    log_calls = [q for m, p, q, _ in api.requests if p.endswith("/log")]
    assert log_calls == [{"container": "node"}]
    rc, out, _ = run(capsys, "logs", "resnet-a1b2c3", "--node", "0", "--follow")
    assert out == "step 1 loss 2.31\nstep 2 loss 2.05\n"
    assert [q for m, p, q, _ in api.requests if p.endswith("/log")][-1] == {"container": "node", "follow": "True"}  # the client writes Python booleans; the API server parses them with strconv.ParseBool
    rc, _, err = run(capsys, "logs", "resnet-a1b2c3", "--node", "5")
    assert rc == 2 and "has 2 nodes" in err


def test_delete_keeps_a_configmap_another_job_uses(api, capsys):
    _serve_jobs(api)
    api.on("DELETE", f"{TRAINER}/namespaces/{NS}/trainjobs/resnet-a1b2c3", {"kind": "Status", "status": "Success"})
    api.on("DELETE", f"{TRAINER}/namespaces/{NS}/trainjobs/bert-9f8e7d", {"kind": "Status", "status": "Success"})
    api.on("DELETE", f"/api/v1/namespaces/{NS}/configmaps/training-code-77aa88bb99", {"kind": "Status", "status": "Success"})
    rc, out, err = run(capsys, "delete", "resnet-a1b2c3")
    assert rc == 0, err
    assert out.strip() == "trainjob/resnet-a1b2c3 deleted; configmap/training-code-5f0c1d2e3a kept (used by gpt-000111)"
    assert [p for m, p, _, _ in api.calls("DELETE")] == [f"{TRAINER}/namespaces/{NS}/trainjobs/resnet-a1b2c3"]
    rc, out, _ = run(capsys, "delete", "bert-9f8e7d", "-o", "json")
    assert json.loads(out) == {"trainjob": "bert-9f8e7d", "deleted": True, "configmap": "training-code-77aa88bb99", "configmapDeleted": True}
    assert [p for m, p, _, _ in api.calls("DELETE")][1:] == [f"{TRAINER}/namespaces/{NS}/trainjobs/bert-9f8e7d", f"/api/v1/namespaces/{NS}/configmaps/training-code-77aa88bb99"]


def test_runtimes(api, capsys):
    _serve_jobs(api)
    rc, out, err = run(capsys, "runtimes", "-o", "json")
    assert rc == 0, err
    rows = json.loads(out)
    assert [(r["name"], r["framework"], r["kind"]) for r in rows] == [
        ("tensorflow-distributed-777f43c4", "tensorflow", "ClusterTrainingRuntime"),
        ("torch-distributed-gpu-0a1b2c3d", "torch", "ClusterTrainingRuntime"),
        ("torch-distributed-gpu-777f43c4", "torch", "ClusterTrainingRuntime"),
    ]
    rc, out, _ = run(capsys, "runtimes")
    assert "torch-distributed-gpu-777f43c4" in out and "FRAMEWORK" in out


def test_no_kubeconfig_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.setenv("HOME", str(tmp_path))
    rc, out, err = run(capsys, "list")
    assert rc == 1 and out == "" and err.count("\n") == 1 and "kubeconfig" in err


# --- dry run, then run locally -------------------------------------------------------------------

DDP_SCRIPT = """\
import argparse
import torch
import torch.distributed as dist

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=3)
args = ap.parse_args()
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(args.steps):
    loss = model(torch.full((8, 4), float(dist.get_rank() + step))).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
total = torch.tensor([1.0])
dist.all_reduce(total)
assert total.item() == dist.get_world_size(), total
print(f"rank {dist.get_rank()} of {dist.get_world_size()} done", flush=True)
dist.barrier()  # gloo: a rank that tears down while its peer still talks can make the peer exit 1
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_dry_run_job_emulates_to_complete(tmp_path, capsys):
    proj = tmp_path / "ddp"
    (proj / "lib").mkdir(parents=True)
    (proj / "train.py").write_text(DDP_SCRIPT)
    (proj / "lib" / "note.txt").write_text("sub-directories are mounted at their paths\n")
    rc, out, err = run(capsys, "submit", "--dry-run", "--namespace", NS, "--nodes", "2", "--gpus-per-node", "1", str(proj), "--", "python", "train.py", "--steps", "3")
    assert rc == 0, err
    job_file = tmp_path / "job.yaml"
    job_file.write_text(out)
    job = emulate.load_trainjob_file(str(job_file), "dev", str(tmp_path / "work"))
    assert job.num_nodes == 2 and job.nproc_per_node == 1
    code_dir = job.mounts[tj.CODE_MOUNT]
    launch = f"{code_dir}/{objects.LAUNCHER}"
    py = job.python  # the image's interpreter, wherever the command names python
    assert job.command == [py, launch, "torchrun", "--no-python", py, launch, "--worker", py, "-u", f"{code_dir}/train.py", "--steps", "3"]  # nothing appended
    assert (pathlib.Path(job.mounts[tj.CODE_MOUNT]) / "lib" / "note.txt").read_text().startswith("sub-directories")
    result = emulate.emulate(job, fail_node=None, fail_at_step=None, timeout_s=300, quiet=True)
    # gloo on 2 shared cores: a rank can still drop its peer's connection at teardown under load; the
    # runtime's failure policy restarts the job (as on the cluster), so a restart is allowed, not a failure
    assert result["status"] == "Complete" and result["nodes"] == 2 and result["world_size"] == 2 and result["restarts"] <= 1


def test_emulate_main_refuses_a_file_without_trainjob(tmp_path, capsys):
    f = tmp_path / "x.yaml"
    f.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n")
    assert emulate.main(["--trainjob", str(f)]) == 2
    assert "expected one TrainJob, found 0" in capsys.readouterr().err


def test_console_script_declared():
    import tomllib

    project = tomllib.loads((pathlib.Path(__file__).parent.parent / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["trainctl"] == "trainctl.cli:main"
    assert sys.modules["trainctl.cli"].main is cli.main


def _facts(cfg_sections: dict, *, stack_jobs: bool = True) -> dict:
    import json as _json

    from tests.conftest import dev_config, run_config
    from tests.conftest import objects as rendered

    cfg = dev_config(**cfg_sections)
    for job in () if stack_jobs else ("ddp", "fsdp", "tf", "ncclCheck"):  # no stack jobs (nor their image)
        cfg["training-platform:trainjobs"][job] = {"enabled": False}
    found = [o for o in rendered(run_config(cfg)).values() if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "platform-facts"]
    return _json.loads(found[0]["data"]["facts.json"])


TWO_TEAM_TENANTS = {"vision": {"gpuQuota": 8, "principalArns": ["arn:aws:iam::123456789012:role/VisionTeam"]}}


def test_the_clusters_facts_default_and_check_a_request(proj):
    facts = _facts({"tenants": TWO_TEAM_TENANTS, "gpuPool": {"instanceFamilies": ["g6e"], "instanceCategories": ["g"]}, "smokeChecks": {"enabled": False}}, stack_jobs=False)
    req = objects.Request(namespace=NS, nodes=2, command=["python", "train.py"])
    shaped = objects.with_facts(req, facts, instance_type_given=False)
    assert shaped.instance_type == facts["defaultInstanceType"] and shaped.instance_type.startswith("g6e.")
    with pytest.raises(objects.SubmitError, match="no GPU pool of this cluster launches it; pools: gpu-pool: g6e"):
        objects.with_facts(req, facts, instance_type_given=True)  # g5.xlarge: not in this pool
    assert objects.with_facts(req, None, instance_type_given=False) == req  # no facts: as given


def test_an_efa_job_lands_in_its_own_efa_pool_with_the_platforms_image(proj):
    facts = _facts({"tenants": TWO_TEAM_TENANTS, "efa": {"enabled": True, "availabilityZone": "us-west-2a", "instanceTypes": ["p5.48xlarge", "p5en.48xlarge"]}})
    assert facts["image"] and "@sha256:" in facts["image"]
    req = objects.Request(namespace=NS, nodes=2, command=["python", "train.py"], instance_type="p5.48xlarge", efa_zone="us-west-2a", runtime_name="torch-distributed-gpu-777f43c4")
    shaped = objects.with_facts(req, facts, instance_type_given=True)
    assert shaped.image == facts["image"]
    _, job = objects.build(shaped, code.collect(proj))
    selector = trainer_api.read_pod_customization(job["spec"])["nodeSelector"]
    assert selector["training-platform/pool"] == "gpu-efa-32nc"  # p5's layout, not p5en's (gpu-efa-16nc)
    with pytest.raises(objects.SubmitError, match="EFA pool is in us-west-2a"):
        objects.with_facts(objects.Request(**{**req.__dict__, "efa_zone": "us-west-2b"}), facts, instance_type_given=True)


def test_code_dir_edges_are_one_line_each(tmp_path, capsys):
    """A link out of the directory is refused (never read), a large file is refused by its size
    before it is read, a script not in the directory is refused, and the usage names -- COMMAND."""
    secret = tmp_path / "credentials"
    secret.write_text("aws_secret_access_key = not-for-a-configmap\n")
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text("print(1)\n")
    (proj / "creds").symlink_to(secret)
    with pytest.raises(code.CodeError, match="symbolic link to a file outside the code dir"):
        code.collect(proj)
    (proj / "creds").unlink()
    (proj / "inside.py").symlink_to(proj / "train.py")  # a link within the directory is fine
    assert "inside.py" in code.collect(proj).paths
    big = proj / "weights.bin"
    with open(big, "wb") as fh:
        fh.truncate(4 * 1024**3)  # 4 GiB, sparse: refused by its size, never read
    with pytest.raises(code.CodeError, match="more than the 1 MiB"):
        code.collect(proj)
    big.unlink()
    req = objects.Request(namespace=NS, nodes=1, command=["python", "tain.py"], runtime_name="torch-distributed-gpu-777f43c4")
    with pytest.raises(objects.SubmitError, match="'tain.py', which is not in the code dir"):
        objects.build(req, code.collect(proj))
    capsys.readouterr()
    with pytest.raises(SystemExit):
        cli.main(["submit", "--help"])
    assert "-- COMMAND" in capsys.readouterr().out


def test_trainctl_and_the_stack_judge_a_job_shape_alike(capsys):
    """One TrainJob model: trainctl's flags are checked by the stack's JobBase, every problem at once."""
    from trainctl import objects

    req = objects.Request(namespace="vision", nodes=0, command=["python", "t.py"], instance_type="g5.xlarge", gpus_per_node=4, image="repo/org/img:latest")
    with pytest.raises(objects.SubmitError) as err:
        objects.check(req)
    lines = str(err.value).splitlines()
    assert [line.split(" ", 1)[0] for line in lines] == ["--nodes", "--gpus-per-node", "--image"]
    from config.schema import ConfigError
    from config.settings import load_settings

    with pytest.raises(ConfigError) as stack_err:
        load_settings({"trainjobs": {"ddp": {"enabled": True, "numNodes": 0, "gpusPerNode": 4, "image": "repo/org/img:latest"}}}, stack="dev", region="us-west-2")
    assert sorted(stack_err.value.keys) == ["trainjobs.ddp.gpusPerNode", "trainjobs.ddp.image", "trainjobs.ddp.numNodes"]


def test_a_job_may_ask_for_its_own_grace_period(proj, capsys):
    """On the runtime's variant with that grace period (a TrainJob cannot carry one past Kueue), on
    either Trainer release; the dry run names the variant the platform gives it by default."""
    for version in ("v2.3.0", "v2.1.0"):
        rc, out, err = run(capsys, *MUST_SHOW, "--grace-seconds", "600", "--trainer-version", version, str(proj), "--", "python", "train.py")
        assert rc == 0, err
        _, job = list(yaml.safe_load_all(out))
        assert job["spec"]["runtimeRef"]["name"].startswith("torch-distributed-gpu-grace600-")
        assert "terminationGracePeriodSeconds" not in json.dumps(job) and "TRAINING_TERMINATION_GRACE_S" not in json.dumps(job)
        assert schema_validation.validate(job, version) == []


def test_grace_seconds_pick_a_published_variant_or_are_refused_naming_them(api, proj, capsys):
    from config.infra_models import TrainerSettings
    from k8s.builders import runtimes as rt

    published = [rt.torch_runtime(TrainerSettings(), grace) for grace in (None, 600)]
    api.on("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", fixture("ssar-allowed.json"), 201)
    api.on("GET", "/openapi/v3/apis/trainer.kubeflow.org/v1alpha1", fixture("openapi-trainer-v1alpha1.json"))
    api.on("GET", f"{TRAINER}/clustertrainingruntimes", {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntimeList", "items": published})
    api.on("POST", f"/api/v1/namespaces/{NS}/configmaps", {}, 201)
    api.on("POST", f"{TRAINER}/namespaces/{NS}/trainjobs", {}, 201)
    argv = ["submit", "--namespace", NS, "--nodes", "2", "--name", "long-save", "--grace-seconds", "600", str(proj), "--", "python", "train.py"]
    rc, out, err = run(capsys, *argv)
    assert rc == 0, err
    assert ("GET", f"{TRAINER}/clustertrainingruntimes", {"labelSelector": "training-platform/runtime-family=torch-distributed-gpu"}) in [(m, p, q) for m, p, q, _ in api.requests]
    assert api.requests[-1][3]["spec"]["runtimeRef"]["name"] == published[1]["metadata"]["name"]
    api.requests.clear()
    rc, out, err = run(capsys, *[a if a != "600" else "450" for a in argv])
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert "--grace-seconds 450: this cluster's torch-distributed-gpu runtimes offer 120 (the default), 600; allowed: one of them" in err
    assert not any(m == "POST" and "trainjobs" in p for m, p, _, _ in api.requests)
