"""The teams' portal against a local control plane (the teams stack with portal.enabled), in one
run: listing 1,000 TrainJobs through the portal's API vs the same list straight from the API
server as the same identity (overhead ratio; goal <= 1.5x), the first log line of a running job to
a client of the log stream (goal < 1 s), and the portal's memory at rest and under 20 concurrent
log streams. Not a test: it prints its figures.

    python -m bench.portal [--jobs 1000] [--runs 7] [--no-kueue]

The portal runs as its own process (uvicorn on 127.0.0.1), with the test signing key standing in
for the ALB's (as tests/e2e do), calling the API server with its service account's token.
``--no-kueue`` is for a machine that cannot build Kueue (the list and logs do not need it).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import httpx

from bench.common import ROOT

SERVE = r"""
import faulthandler, json, signal, sys
sys.path.insert(0, {root!r})
faulthandler.register(signal.SIGUSR1)  # the bench asks for the threads' stacks when the portal does not answer
import uvicorn
from kubernetes import client
from trainctl.portal.__main__ import settings_of
from trainctl.portal.app import create_app
conf = json.load(open({conf!r}))
cfg = client.Configuration()
cfg.host, cfg.ssl_ca_cert, cfg.api_key = conf["host"], conf["ca"], {{"authorization": "Bearer " + conf["token"]}}
app = create_app(cfg, settings_of(conf["settings"]), alb_keys=lambda kid: conf["public"])
uvicorn.run(app, host="127.0.0.1", port=conf["port"], log_level="warning")
"""


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return kb / 1024


def _median_s(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.portal")
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--no-kueue", action="store_true")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from kubernetes import client

    from k8s.builders.tenants import team_group
    from tests.e2e import portal_helpers as ph
    from tools.cluster import up as cluster
    from trainctl import objects
    from trainctl.code import collect
    from trainctl.kube import KubeApi

    stack = ph.portal_stack()
    if args.no_kueue:
        stack["config"]["training-platform:kueue"] = {"enabled": False}
    out = tempfile.mkdtemp(prefix="bench-portal-")
    up = cluster.up(ph.STACK, out=out, stack_config=stack, pod_run_seconds=120, echo=lambda *_: None)
    proc = None
    try:
        admin = ph.admin_api(up)
        portal_cfg = ph.portal_configuration(up)
        settings_doc = json.loads(client.CoreV1Api(admin).read_namespaced_config_map("portal", "platform-portal").data["portal.json"])
        port = _port()
        conf = {"host": portal_cfg.host, "ca": portal_cfg.ssl_ca_cert, "token": portal_cfg.api_key["authorization"].split(" ", 1)[1], "settings": settings_doc, "public": ph.PUBLIC, "port": port}
        conf_path = os.path.join(out, "portal.json")
        with open(conf_path, "w") as f:
            json.dump(conf, f)
        proc = subprocess.Popen([sys.executable, "-c", SERVE.format(root=str(ROOT), conf=conf_path)])
        base = f"http://127.0.0.1:{port}"
        _wait(base)
        headers = ph.alb_header(up, "bench", "vision", exp_in=3600)
        web = httpx.Client(base_url=base, headers=headers, timeout=120)

        # a running job (its simulated pods run 120 s) and the first line of its log stream
        web.get("/api/trainjobs", params={"namespace": "vision"}).raise_for_status()
        rss_rest = rss_mib(proc.pid)
        r = web.post("/api/trainjob/create", json={"namespace": "vision", "framework": "pytorch", "training_code": "print(1)\n", "name": "bench-logs", "config": {"num_nodes": 1, "gpu_per_node": 1}})
        r.raise_for_status()
        deadline = time.monotonic() + 600
        while not _worker_running(web.get("/api/trainjob/bench-logs/status", params={"namespace": "vision"}).json()):
            if time.monotonic() > deadline:
                raise SystemExit("bench-logs never ran")
            time.sleep(0.5)
        firsts = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            try:
                with web.stream("GET", "/api/trainjob/bench-logs/logs/stream", params={"namespace": "vision", "worker": 0}, timeout=30) as s:
                    for line in s.iter_lines():
                        if line.startswith("event: line"):
                            firsts.append(time.perf_counter() - t0)
                            break
            except httpx.TimeoutException:
                os.kill(proc.pid, signal.SIGUSR1)  # its threads' stacks, on its stderr
                time.sleep(2)
                raise
        # 20 concurrent streams held open
        stop = threading.Event()
        opened = []

        def hold():
            with httpx.Client(base_url=base, headers=headers, timeout=None) as c, c.stream("GET", "/api/trainjob/bench-logs/logs/stream", params={"namespace": "vision", "worker": 0}) as s:
                for line in s.iter_lines():
                    if line.startswith("event: line"):
                        opened.append(1)
                        break
                stop.wait(30)

        threads = [threading.Thread(target=hold, daemon=True) for _ in range(20)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while len(opened) < 20 and time.monotonic() < deadline:
            time.sleep(0.2)
        rss_streams = rss_mib(proc.pid)
        print(json.dumps({"first_log_line_s": [round(f, 3) for f in firsts], "rss_mib_at_rest": round(rss_rest, 1), "rss_mib_20_streams": round(rss_streams, 1), "streams_open": len(opened)}), flush=True)
        stop.set()
        for t in threads:
            t.join(timeout=10)

        # 1,000 TrainJobs in vision as trainctl builds them, suspended (no pods), sharing one code ConfigMap
        custom = client.CustomObjectsApi(admin)
        runtime = next(o["metadata"]["name"] for o in up.plan.objects if o["kind"] == "ClusterTrainingRuntime" and o["metadata"]["labels"].get("training-platform/runtime") == "torch-distributed-gpu")
        code_dir = os.path.join(out, "code")
        os.makedirs(code_dir)
        with open(os.path.join(code_dir, "train.py"), "w") as f:
            f.write("print(1)\n")
        t0 = time.perf_counter()
        for i in range(args.jobs):
            req = objects.Request(namespace="vision", nodes=1, command=["python", "train.py"], name=f"bench-{i:04d}", runtime_name=runtime, queue=None if args.no_kueue else objects.LOCAL_QUEUE)
            cm, tj = objects.build(req, collect(code_dir))
            if i == 0:  # (the same code as bench-logs': its ConfigMap may be there)
                try:
                    client.CoreV1Api(admin).create_namespaced_config_map("vision", cm)
                except client.ApiException as err:
                    if err.status != 409:
                        raise
            tj["spec"]["suspend"] = True
            custom.create_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", "vision", "trainjobs", tj)
        created_s = time.perf_counter() - t0
        direct = KubeApi(namespace="vision", configuration=admin.configuration, headers={"Impersonate-User": ["portal:vision"], "Impersonate-Group": [team_group("vision")]})
        assert len(direct.list_trainjobs()) >= args.jobs
        listed = web.get("/api/trainjobs", params={"namespace": "vision"}).json()["items"]
        assert len(listed) >= args.jobs, len(listed)
        direct_s = _median_s(direct.list_trainjobs, args.runs)
        portal_s = _median_s(lambda: web.get("/api/trainjobs", params={"namespace": "vision"}).raise_for_status(), args.runs)

        figures = {
            "trainjobs": args.jobs, "create_all_s": round(created_s, 1),
            "list_direct_s": round(direct_s, 4), "list_portal_s": round(portal_s, 4), "list_overhead_ratio": round(portal_s / direct_s, 2), "list_goal_ratio": 1.5,
            "first_log_line_s_median": round(statistics.median(firsts), 3), "first_log_line_s_max": round(max(firsts), 3), "first_log_line_goal_s": 1.0,
            "rss_mib_at_rest": round(rss_rest, 1), "rss_mib_20_streams": round(rss_streams, 1), "streams_open": len(opened), "runs": args.runs,
        }
        print(json.dumps(figures, indent=2))
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        cluster.down(ph.STACK, out=out)
    return 0


def _worker_running(status: dict) -> bool:
    return status.get("status") == "Running" and any(w.get("phase") == "Running" for w in status.get("workers") or [])


def _port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(base: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit("the portal did not start")


if __name__ == "__main__":
    sys.exit(main())
