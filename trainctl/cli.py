"""trainctl: submit a code directory as a TrainJob on the platform and follow it.

    trainctl submit [--dry-run] --namespace NS --nodes N [--gpus-per-node G] [--instance-type T]
                    [--image IMG] [--name NAME] [--runtime torch|tensorflow] CODE_DIR -- COMMAND...
    trainctl submit --local [--nodes N] [--name NAME] CODE_DIR -- COMMAND...   (on this machine)
    trainctl list | status NAME | logs NAME [--node K] [--follow] | delete NAME | diagnose NAME  (each with --local)
    trainctl runtimes | usage [--since 7d] [--team T] [-A] [--csv]

The kubeconfig comes from ``--kubeconfig``, else ``$KUBECONFIG``, else ``~/.kube/config``; the
namespace from ``--namespace``, else the kubeconfig context's. Tables for people; ``--output
json|yaml`` for scripts. Bad input is one ``trainctl: error: ...`` line per problem on stderr and exit code 2,
with nothing created; a failed cluster call is one line and exit code 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import yaml
from urllib3.exceptions import HTTPError

import versions
from manifests.tenants import QUEUE_LABEL
from trainctl import diagnose, local, objects, progress, usage
from trainctl.code import CodeError, collect
from trainctl.kube import ClusterError, KubeApi, default_namespace, unreachable
from trainctl.reports import _print_findings, _table, cmd_local, cmd_submit_local, emit, print_usage

RESTART_LABEL = "jobset.sigs.k8s.io/restart-attempt"
"""The JobSet restart attempt a pod belongs to (kubernetes-sigs/jobset pkg/constants RestartsKey)."""
KUEUE_STARTED = "Started"
"""Kueue's event on a job it admitted, "Admitted by clusterQueue <name>" (kubernetes-sigs/kueue
v0.19.2 pkg/controller/jobframework/reconciler.go startJob)."""
KUEUE_PENDING = "Pending"
"""Kueue's event on a Workload it could not admit, with the reason (kueue v0.19.2
pkg/scheduler/scheduler.go requeueAndUpdate). A TrainJob's Workload is named
``trainjob-<job name>-<hash>`` (kueue pkg/controller/jobframework/workload_names.go)."""


class UsageError(Exception):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not argparse's usage block
        raise UsageError(message)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--namespace", help="namespace (default: the kubeconfig context's)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context (default: the current one)")
    p.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table", help="table (default), json or yaml")


def parser() -> Parser:
    ap = Parser(prog="trainctl", description="Submit and follow TrainJobs on the training platform.")
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=Parser)
    s = sub.add_parser(
        "submit", help="ship CODE_DIR as a ConfigMap and create a TrainJob that runs COMMAND (after --)",
        usage="trainctl submit [options] --nodes N CODE_DIR -- COMMAND [ARG ...]",
        epilog="example: trainctl submit --nodes 2 ./proj -- python train.py --epochs 3",
    )
    _common(s)
    s.add_argument("--dry-run", action="store_true", help="print the objects as YAML and create nothing (needs no cluster)")
    s.add_argument("--nodes", type=int, required=True, help="nodes (pods)")
    s.add_argument("--gpus-per-node", type=int, help="GPUs (processes) per node (default: all GPUs of the instance type)")
    s.add_argument("--instance-type", help=f"GPU instance type of each node (default: the smallest the cluster's GPU pool launches, from its published facts; else {objects.DEFAULT_INSTANCE_TYPE})")
    s.add_argument("--image", help="training image (default: the image of the cluster's runtime)")
    s.add_argument("--name", help="TrainJob name (default: <code dir>-<hash of code and command>)")
    s.add_argument("--runtime", default="torch", help="torch (default) or tensorflow")
    s.add_argument("--runtime-name", help="the runtime's object name (default: found by label in the cluster; with --dry-run, computed from the platform's defaults)")
    s.add_argument("--trainer-version", help=f"Trainer release whose TrainJob shape to write (default: what the cluster serves; with --dry-run {versions.DEFAULT_TRAINER_VERSION})")
    s.add_argument("--priority", help="Kueue priority: low, normal or high (default: your team's, from the cluster's published facts; else normal); low jobs are preempted first")
    s.add_argument("--grace-seconds", type=int, help="seconds your code has from SIGTERM (preemption, a drain, a spot interruption) to SIGKILL to save: one the platform offers, each a runtime of its own (default: the runtime's, trainer.terminationGraceSeconds)")
    s.add_argument("--efa-zone", help="run in the cluster's EFA pool in this zone (the instance type must be one of the pool's): EFA devices and their environment")
    s.add_argument("--local", action="store_true", help=f"run it on this machine through the emulator, in the background (state in ${local.HOME_ENV}, default {local.home()})")
    s.add_argument("code_dir", metavar="CODE_DIR")
    for name, text in (("list", "TrainJobs in the namespace"), ("runtimes", "the training runtimes the cluster offers")):
        p = sub.add_parser(name, help=text)
        _common(p)
        if name == "list":
            p.add_argument("--local", action="store_true", help="the jobs run on this machine")
    for name, text in (("status", "phase, queueing, restarts, times, last failure of a TrainJob"), ("delete", "delete a TrainJob and its code ConfigMap (unless another job uses it)")):
        p = sub.add_parser(name, help=text)
        _common(p)
        p.add_argument("--local", action="store_true", help="a job run on this machine")
        p.add_argument("name", metavar="NAME")
    p = sub.add_parser("usage", help="GPU-hours per team and per job over a period, from Kueue's Workloads")
    _common(p)
    p.add_argument("--since", default="30d", help="start of the period: a duration such as 7d, 12h, 30m, or a date (default 30d)")
    p.add_argument("--team", help="only this team")
    p.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace (platform admins); default: the namespace")
    p.add_argument("--csv", action="store_true", help="one CSV row per job")
    p = sub.add_parser("diagnose", help="why a TrainJob failed or does not start, with the evidence")
    _common(p)
    p.add_argument("--local", action="store_true", help="a job run on this machine")
    p.add_argument("name", metavar="NAME")
    p = sub.add_parser("logs", help="logs of one node of a TrainJob")
    _common(p)
    p.add_argument("--local", action="store_true", help="a job run on this machine (default: every node)")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--node", type=int, help="node index (default 0; --local: every node)")
    p.add_argument("-f", "--follow", action="store_true", help="stream until the pod ends")
    return ap


# --- output ----------------------------------------------------------------------------------


# --- status ----------------------------------------------------------------------------------


def _conditions(tj: dict) -> dict[str, dict]:
    return {c["type"]: c for c in (tj.get("status") or {}).get("conditions") or []}


def phase(tj: dict) -> str:
    """Complete, Failed, Queued (suspended with a Kueue queue label), Suspended, Running (a node
    Job has active pods) or Created."""
    conds = _conditions(tj)
    for final in ("Complete", "Failed"):
        if conds.get(final, {}).get("status") == "True":
            return final
    if conds.get("Suspended", {}).get("status") == "True":
        return "Queued" if QUEUE_LABEL in (tj["metadata"].get("labels") or {}) else "Suspended"
    jobs = (tj.get("status") or {}).get("jobsStatus") or []
    if any(j.get("active", 0) or j.get("ready", 0) for j in jobs):
        return "Running"
    return "Created"


def _latest(events: list[dict], reason: str | None = None) -> dict | None:
    picked = [e for e in events if reason is None or e.get("reason") == reason]
    return max(picked, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or e.get("firstTimestamp") or "", default=None)


def admission(tj: dict, job_events: list[dict], workload_events: list[dict]) -> str:
    """Admitted or queued and why, from Kueue's events (the job's "Started", its Workload's "Pending")."""
    queue = (tj["metadata"].get("labels") or {}).get(QUEUE_LABEL)
    if not queue:
        return "not queued (no Kueue queue label)"
    started = _latest(job_events, KUEUE_STARTED)
    if phase(tj) != "Queued" and started:
        return f"admitted: {started.get('message')}"
    pending = _latest(workload_events, KUEUE_PENDING)
    if phase(tj) == "Queued":
        return f"queued in {queue}: {pending.get('message')}" if pending else f"queued in {queue}: waiting for Kueue to consider it"
    return f"queue {queue}"


def restarts(pods: list[dict]) -> int:
    return max((int((p["metadata"].get("labels") or {}).get(RESTART_LABEL, 0)) for p in pods), default=0)


def times(tj: dict, pods: list[dict]) -> tuple[str | None, str | None]:
    """(started: the first pod start, finished: when Complete or Failed became true)."""
    starts = sorted(s for p in pods if (s := (p.get("status") or {}).get("startTime")))
    conds = _conditions(tj)
    finished = next((conds[t].get("lastTransitionTime") for t in ("Complete", "Failed") if conds.get(t, {}).get("status") == "True"), None)
    return (starts[0] if starts else None), finished


def last_failure(tj: dict, pods: list[dict], job_events: list[dict]) -> str | None:
    """The Failed condition's reason and message, else the latest container that ended with a
    non-zero exit code, else the latest Warning event on the job."""
    failed = _conditions(tj).get("Failed")
    if failed and failed.get("status") == "True":
        return f"{failed.get('reason')}: {failed.get('message')}"
    ended = []
    for p in pods:
        for cs in (p.get("status") or {}).get("containerStatuses") or []:
            for state in (cs.get("state") or {}, cs.get("lastState") or {}):
                term = state.get("terminated")
                if term and term.get("exitCode", 0) != 0:
                    ended.append((term.get("finishedAt") or "", f"pod {p['metadata']['name']} container {cs['name']} exited {term['exitCode']} ({term.get('reason') or 'Error'})"))
    if ended:
        return max(ended)[1]
    warning = _latest([e for e in job_events if e.get("type") == "Warning"])
    return f"{warning.get('reason')}: {warning.get('message')}" if warning else None


def status_report(tj: dict, pods: list[dict], job_events: list[dict], workload_events: list[dict], steps: list[Any]) -> dict:
    started, finished = times(tj, pods)
    trainer = tj["spec"].get("trainer") or {}
    return {
        "name": tj["metadata"]["name"],
        "namespace": tj["metadata"].get("namespace"),
        "phase": phase(tj),
        "admission": admission(tj, job_events, workload_events),
        "runtime": tj["spec"]["runtimeRef"]["name"],
        "nodes": trainer.get("numNodes"),
        "restarts": restarts(pods),
        "created": tj["metadata"].get("creationTimestamp"),
        "started": started,
        "finished": finished,
        "lastFailure": last_failure(tj, pods, job_events),
        "steps": [{"name": s.name, "status": s.status, "pod": s.pod_name} for s in steps],
    }


# --- commands --------------------------------------------------------------------------------


def _cluster(args: argparse.Namespace) -> KubeApi:
    ns = args.namespace or default_namespace(args.kubeconfig, args.context)
    return KubeApi(namespace=ns, kubeconfig=args.kubeconfig, context=args.context)


def cmd_submit(args: argparse.Namespace, command: list[str]) -> int:
    if args.local:
        return cmd_submit_local(args, command)
    if not args.namespace:
        if args.dry_run:
            raise UsageError("--namespace is required with --dry-run (no kubeconfig is read)")
        args.namespace = default_namespace(args.kubeconfig, args.context)  # the kubeconfig context's
    req = objects.Request(
        namespace=args.namespace, nodes=args.nodes, command=command, runtime=args.runtime, gpus_per_node=args.gpus_per_node, instance_type=args.instance_type or objects.DEFAULT_INSTANCE_TYPE,
        image=args.image, name=args.name, trainer_version=args.trainer_version or versions.DEFAULT_TRAINER_VERSION, runtime_name=args.runtime_name, efa_zone=args.efa_zone,
        priority=args.priority, grace_seconds=args.grace_seconds,
    )
    objects.check(req)  # before reading the code dir or calling the cluster
    bundle = collect(args.code_dir)
    if args.dry_run:
        cm, tj = objects.build(req, bundle)
        if args.output == "json":
            print(json.dumps({"apiVersion": "v1", "kind": "List", "items": [cm, tj]}, indent=2))
        else:
            print(yaml.safe_dump_all([cm, tj], sort_keys=False), end="")
        return 0
    cluster = KubeApi(namespace=args.namespace, kubeconfig=args.kubeconfig, context=args.context)
    for group, resource in (("trainer.kubeflow.org", "trainjobs"), ("", "configmaps")):
        allowed, reason = cluster.can("create", group, resource)
        if not allowed:
            raise ClusterError(f"you may not create {resource} in namespace {args.namespace}" + (f" ({reason})" if reason else "") + ": ask the platform team for access to it")
    version = args.trainer_version or cluster.served_trainer_version()
    if args.runtime_name or req.grace_seconds is None:
        runtime_name = args.runtime_name or cluster.current_runtime(objects.RUNTIMES[req.runtime])
    else:  # the runtime's variant with that grace period, if the platform offers one
        runtime_name = objects.runtime_for(req, cluster.runtimes_of(objects.RUNTIMES[req.runtime]))
    req = objects.Request(**{**req.__dict__, "trainer_version": version, "runtime_name": runtime_name})
    req = objects.with_facts(req, cluster.platform_facts(), instance_type_given=args.instance_type is not None)
    objects.check(req)
    cm, tj = objects.build(req, bundle)
    created_cm = cluster.create_configmap(cm)
    try:
        cluster.create_trainjob(tj)
    except ClusterError:
        if created_cm:  # leave nothing behind
            cluster.delete_configmap(cm["metadata"]["name"])
        raise
    result = {"trainjob": tj["metadata"]["name"], "namespace": args.namespace, "configmap": cm["metadata"]["name"], "configmapCreated": created_cm, "runtime": runtime_name, "trainerVersion": version}
    if args.output == "table":
        reused = "" if created_cm else " (already there: same code)"
        print(f"trainjob/{result['trainjob']} created in {args.namespace}: {req.nodes} nodes on {runtime_name}, code in configmap/{result['configmap']}{reused}")
    else:
        emit(result, args.output)
    return 0


def cmd_diagnose(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    tj = cluster.get_trainjob(args.name)
    pods = cluster.pods(args.name)
    events = cluster.events("TrainJob", args.name) + [e for e in cluster.events("Pod") if e["involvedObject"]["name"].startswith(f"{args.name}-")]
    events += [e for e in cluster.events("Workload") if e["involvedObject"]["name"].startswith(f"trainjob-{args.name}-")]
    nodes = cluster.nodes({p["spec"]["nodeName"] for p in pods if p.get("spec", {}).get("nodeName")})
    failed_pods = [p["metadata"]["name"] for p in pods if (p.get("status") or {}).get("phase") == "Failed" or any(_restarted(cs) for cs in (p.get("status") or {}).get("containerStatuses") or [])]
    ev = diagnose.Evidence(trainjob=tj, pods=pods, workloads=cluster.workloads(args.name), events=events, nodes=nodes, log_lines={p: cluster.log_tail(p) for p in failed_pods[:4]})
    return _print_findings(args.name, diagnose.diagnose(ev), args.output)


def cmd_usage(args: argparse.Namespace) -> int:
    from datetime import UTC, datetime

    now = datetime.now(UTC)
    try:
        since = usage.since_time(args.since, now)
    except ValueError as err:
        raise UsageError(str(err)) from None
    cluster = _cluster(args)
    rs = usage.rows(cluster.all_workloads(all_namespaces=args.all_namespaces), since=since, now=now, team=args.team)
    return print_usage(rs, since=since, now=now, csv_out=args.csv, output=args.output)


def _restarted(cs: dict) -> bool:
    return bool((cs.get("lastState") or {}).get("terminated"))


def cmd_list(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    jobs = sorted(cluster.list_trainjobs(), key=lambda t: t["metadata"]["name"])
    rows = [
        {
            "name": t["metadata"]["name"], "phase": phase(t), "nodes": (t["spec"].get("trainer") or {}).get("numNodes"), "runtime": t["spec"]["runtimeRef"]["name"],
            "queue": (t["metadata"].get("labels") or {}).get(QUEUE_LABEL), "created": t["metadata"].get("creationTimestamp"),
        }
        for t in jobs
    ]
    by_name = {t["metadata"]["name"]: t for t in jobs}
    for r in rows:  # running jobs: the Trainer's progress, else node 0's last step event (one short log read)
        r["progress"] = progress.text(_progress(cluster, by_name[r["name"]])) if r["phase"] == "Running" else "-"
    cols = ["name", "phase", "nodes", "progress", "runtime", "queue", "created"]
    emit(rows, args.output, _table(f"TrainJobs in {cluster.namespace}", [c.upper() for c in cols], [[r[c] for c in cols] for r in rows]))
    return 0


def _progress(cluster: KubeApi, trainjob: dict, pods: list[dict] | None = None) -> dict | None:
    """What the Trainer holds for the job (``status.trainerStatus``), else the newest step event in
    the log of its first node (JobSet names its pods ``<job>-node-0-0-<suffix>``)."""
    found = progress.of_trainjob(trainjob)
    if found:
        return found
    name = trainjob["metadata"]["name"]
    try:
        pods = cluster.pods(name) if pods is None else pods
    except ClusterError:  # progress is a nicety: a listing never fails for it
        return None
    node0 = next((p["metadata"]["name"] for p in pods if p["metadata"]["name"].startswith(f"{name}-node-0-0")), None)
    return progress.of_lines(cluster.log_tail(node0, lines=200)) if node0 else None


def cmd_status(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    tj = cluster.get_trainjob(args.name)
    pods = cluster.pods(args.name)
    job_events = cluster.events("TrainJob", args.name)
    prefix = f"trainjob-{args.name}-"
    workload_events = [e for e in cluster.events("Workload") if e["involvedObject"]["name"].startswith(prefix)]
    steps = cluster.job(args.name).steps
    report = status_report(tj, pods, job_events, workload_events, steps)
    found = _progress(cluster, tj, pods)
    if found:
        report["progress"] = found
    fields = [(k, report.get(k)) for k in ("name", "namespace", "phase", "admission", "runtime", "nodes", "restarts", "progress", "created", "started", "finished", "lastFailure")]
    if args.output == "table":
        from rich.console import Console

        console = Console(soft_wrap=True)
        console.print(_table(f"TrainJob {report['name']}", ["FIELD", "VALUE"], [list(f) for f in fields]))
        console.print(_table("nodes", ["STEP", "STATUS", "POD"], [[s["name"], s["status"], s["pod"]] for s in report["steps"]]))
    else:
        emit(report, args.output)
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    if args.node < 0:
        raise UsageError(f"--node {args.node}: allowed: a node index from 0")
    cluster = _cluster(args)
    tj = cluster.get_trainjob(args.name)
    nodes = int((tj["spec"].get("trainer") or {}).get("numNodes") or 1)
    if args.node >= nodes:
        raise UsageError(f"--node {args.node}: {args.name} has {nodes} nodes (0..{nodes - 1})")
    printed = False
    for line in cluster.logs(args.name, node=args.node, follow=args.follow):
        print(line, flush=args.follow)
        printed = True
    if not printed:
        print(f"trainctl: no logs yet: node {args.node} of {args.name} has no started pod ({phase(tj)})", file=sys.stderr)
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    tj = cluster.get_trainjob(args.name)
    cm = objects.code_configmap_of(tj)
    cluster.delete_trainjob(args.name)
    result: dict[str, Any] = {"trainjob": args.name, "deleted": True, "configmap": cm, "configmapDeleted": False}
    if cm:
        users = sorted(t["metadata"]["name"] for t in cluster.list_trainjobs() if t["metadata"]["name"] != args.name and objects.code_configmap_of(t) == cm)
        if users:
            result["configmapKeptFor"] = users
        else:
            result["configmapDeleted"] = cluster.delete_configmap(cm)
    if args.output == "table":
        line = f"trainjob/{args.name} deleted"
        if result.get("configmapKeptFor"):
            line += f"; configmap/{cm} kept (used by {', '.join(result['configmapKeptFor'])})"
        elif result["configmapDeleted"]:
            line += f"; configmap/{cm} deleted"
        print(line)
    else:
        emit(result, args.output)
    return 0


def cmd_runtimes(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    rows = [
        {"name": r.name, "kind": str(getattr(r.kind, "value", r.kind)), "framework": r.trainer.framework, "image": r.trainer.image, "numNodes": r.trainer.num_nodes}
        for r in sorted(cluster.runtimes(), key=lambda r: r.name)
    ]
    cols = ["name", "framework", "kind", "numNodes", "image"]
    emit(rows, args.output, _table("training runtimes", [c.upper() for c in cols], [[r[c] for c in cols] for r in rows]))
    return 0


COMMANDS = {"list": cmd_list, "status": cmd_status, "logs": cmd_logs, "delete": cmd_delete, "runtimes": cmd_runtimes, "diagnose": cmd_diagnose, "usage": cmd_usage}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, command = argv[:i], argv[i + 1 :]
    try:
        args = parser().parse_args(argv)
        if args.cmd == "submit":
            return cmd_submit(args, command)
        if command:
            raise UsageError(f"{args.cmd} takes no command after --")
        if getattr(args, "local", False):
            return cmd_local(args)
        if args.cmd == "logs" and args.node is None:
            args.node = 0
        return COMMANDS[args.cmd](args)
    except (UsageError, objects.SubmitError, CodeError) as err:
        for line in str(err).splitlines():  # one line per problem, all of them
            print(f"trainctl: error: {line}", file=sys.stderr)
        return 2
    except (ClusterError, local.LocalError) as err:
        print(f"trainctl: error: {err}", file=sys.stderr)
        return 1
    except (OSError, HTTPError) as err:  # a connection that failed outside a wrapped call (the SDK's own retries)
        print(f"trainctl: error: {unreachable(err)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
