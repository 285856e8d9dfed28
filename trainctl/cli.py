"""trainctl: submit a code directory as a TrainJob on the platform and follow it.

    trainctl submit [--dry-run] --namespace NS --nodes N [--gpus-per-node G] [--instance-type T]
                    [--image IMG] [--name NAME] [--runtime torch|tensorflow] CODE_DIR -- COMMAND...
    trainctl submit --local [--nodes N] [--name NAME] CODE_DIR -- COMMAND...   (on this machine)
    trainctl list | status NAME | logs NAME [--node K] [--follow] | delete NAME | diagnose NAME  (each with --local)
    trainctl runtimes | usage [--since 7d] [--team T] [-A] [--csv]
    trainctl submit ... [--env NAME=VALUE ...] [--secret-env NAME=SECRET/KEY ...]   (docs/env-and-secrets.md)
    trainctl secret set NAME KEY=VALUE|KEY=@FILE|KEY=@- ... | secret delete NAME   (write-only: never read back)
    trainctl ui [--kubeconfig K] [--context C] [--namespace NS] [--port P]   (the teams' portal on 127.0.0.1)
    trainctl ui --local [--port P]   (the same portal over the jobs run on this machine)

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
from typing import NoReturn

import yaml
from urllib3.exceptions import HTTPError

import versions
from k8s.builders.tenants import QUEUE_LABEL
from trainctl import diagnose, jobstate, local, objects, progress, usage
from trainctl.code import CodeError, collect
from trainctl.jobstate import KUEUE_PENDING, KUEUE_STARTED, RESTART_LABEL, admission, last_failure, phase, restarts, status_report, times  # noqa: F401  (trainctl.cli's interface)
from trainctl.kube import ClusterError, KubeApi, default_namespace, unreachable
from trainctl.reports import _print_findings, _table, cmd_local, cmd_submit_local, emit, print_usage
from trainctl.secret_cmd import SecretInputError
from workloads.builders import trainjobs as tj_builders


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
    s.add_argument("--name", help="TrainJob name (default: the code dir's name as a DNS label); a resubmit of a finished job's name replaces it and resumes from its checkpoints (/mnt/checkpoints/<name>)")
    s.add_argument("--resume-from", metavar="JOB", help="start from another job's checkpoints: its directory /mnt/checkpoints/<JOB> in $TRAINING_RESUME_FROM (read it; write yours to $TRAINING_CHECKPOINT_DIR)")
    s.add_argument("--deps-timeout", type=int, metavar="SECONDS", help=f"time limit for installing the code dir's requirements.txt on each node (default {tj_builders.DEFAULT_DEPS_TIMEOUT_S}; {objects.DEPS_TIMEOUT_MIN}-{objects.DEPS_TIMEOUT_MAX})")
    s.add_argument("--runtime", default="torch", help="torch (default) or tensorflow")
    s.add_argument("--runtime-name", help="the runtime's object name (default: found by label in the cluster; with --dry-run, computed from the platform's defaults)")
    s.add_argument("--trainer-version", help=f"Trainer release whose TrainJob shape to write (default: what the cluster serves; with --dry-run {versions.DEFAULT_TRAINER_VERSION})")
    s.add_argument("--priority", help="Kueue priority: low, normal or high (default: your team's, from the cluster's published facts; else normal); low jobs are preempted first")
    s.add_argument("--grace-seconds", type=int, help="seconds your code has from SIGTERM (preemption, a drain, a spot interruption) to SIGKILL to save: one the platform offers, each a runtime of its own (default: the runtime's, trainer.terminationGraceSeconds)")
    s.add_argument("--efa-zone", help="run in the cluster's EFA pool in this zone (the instance type must be one of the pool's): EFA devices and their environment")
    s.add_argument("--env", action="append", metavar="NAME=VALUE", help="a variable of the training container (repeatable), such as NCCL_DEBUG=INFO; not the platform's own, no credentials (use --secret-env)")
    s.add_argument("--secret-env", action="append", metavar="NAME=SECRET/KEY", help="a variable read from key KEY of Secret SECRET in the namespace (repeatable; trainctl secret set writes the Secret); not with --local")
    s.add_argument("--ttl", metavar="DURATION", help="delete the job this long after it finishes, such as 2h (default: the platform's trainjobs.finishedJobRetention; at most its finishedJobRetentionMax); its checkpoints stay; not with --local")
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
    from trainctl import ui

    ui.add_parser(sub)
    from trainctl import secret_cmd

    secret_cmd.add_parser(sub, _common)
    p = sub.add_parser("logs", help="logs of one node of a TrainJob")
    _common(p)
    p.add_argument("--local", action="store_true", help="a job run on this machine (default: every node)")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--node", type=int, help="node index (default 0; --local: every node)")
    p.add_argument("-f", "--follow", action="store_true", help="stream until the pod ends")
    return ap


# --- output ----------------------------------------------------------------------------------


# --- status ----------------------------------------------------------------------------------


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
        priority=args.priority, grace_seconds=args.grace_seconds, resume_from=args.resume_from, deps_timeout=args.deps_timeout,
    )
    from dataclasses import replace

    env, secret_env, env_lines = objects.env_flags(args.env, args.secret_env)
    ttl, ttl_lines = objects.ttl_flag(args.ttl)
    req = replace(req, env=env, secret_env=secret_env, ttl_seconds=ttl)
    found = env_lines + ttl_lines + objects.problems(req)
    if found:  # before reading the code dir or calling the cluster, every problem at once
        raise objects.SubmitError("\n".join(found))
    bundle = collect(args.code_dir)
    if args.dry_run:
        cm, tj = objects.build(req, bundle)
        if (warning := objects.efa_image_warning(req, None)) is not None:
            print(f"trainctl: warning: {warning}", file=sys.stderr)
        if args.output == "json":
            print(json.dumps({"apiVersion": "v1", "kind": "List", "items": [cm, tj]}, indent=2))
        else:
            print(yaml.safe_dump_all([cm, tj], sort_keys=False), end="")
        return 0
    cluster = KubeApi(namespace=args.namespace, kubeconfig=args.kubeconfig, context=args.context)
    done = jobstate.submit(cluster, req, bundle, instance_type_given=args.instance_type is not None, trainer_version=args.trainer_version, runtime_name=args.runtime_name)
    result = {k: done[k] for k in ("trainjob", "namespace", "configmap", "configmapCreated", "runtime", "trainerVersion")}
    created_cm, runtime_name = done["configmapCreated"], done["runtime"]
    for warning in done.get("warnings", []):
        print(f"trainctl: warning: {warning}", file=sys.stderr)
    if done.get("replaced"):
        print(f"trainctl: replaced the finished ({done['replaced']}) trainjob/{done['trainjob']}; its checkpoints stay: the job resumes from them", file=sys.stderr)
    if args.output == "table":
        reused = "" if created_cm else " (already there: same code)"
        print(f"trainjob/{result['trainjob']} created in {args.namespace}: {req.nodes} nodes on {runtime_name}, code in configmap/{result['configmap']}{reused}")
    else:
        emit(result, args.output)
    return 0


def cmd_diagnose(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    ev = jobstate.evidence(cluster, args.name)
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
        r["progress"] = progress.text(jobstate.progress_of(cluster, by_name[r["name"]])) if r["phase"] == "Running" else "-"
    cols = ["name", "phase", "nodes", "progress", "runtime", "queue", "created"]
    emit(rows, args.output, _table(f"TrainJobs in {cluster.namespace}", [c.upper() for c in cols], [[r[c] for c in cols] for r in rows]))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    tj = cluster.get_trainjob(args.name)
    refused: list[str] = []  # reads the API server refused: shown as "not allowed: ...", never as "none"
    pods = jobstate.readable(refused, cluster.pods, args.name, default=[])
    job_events = jobstate.readable(refused, cluster.events, "TrainJob", args.name, default=[])
    prefix = f"trainjob-{args.name}-"
    workload_events = [e for e in jobstate.readable(refused, cluster.events, "Workload", default=[]) if e["involvedObject"]["name"].startswith(prefix)]
    queue = jobstate.queue_report(cluster, tj, refused=refused)
    steps = jobstate.readable(refused, lambda: cluster.job(args.name).steps, default=[])
    report = status_report(tj, pods, job_events, workload_events, steps, queue=queue, refused=refused)
    found = jobstate.progress_of(cluster, tj, pods)
    if found:
        report["progress"] = found
    fields = [(k, report.get(k)) for k in ("name", "namespace", "phase", "admission", "priority", "queuePosition", "runtime", "nodes", "restarts", "progress", "created", "started", "finished", "lastFailure")]
    fields = [(k, v) for k, v in fields if v is not None or k not in ("priority", "queuePosition")]
    fields += [("notAllowed", line) for line in report.get("notAllowed", [])]
    if args.output == "table":
        from rich.console import Console

        console = Console(soft_wrap=True)
        # progress as every listing shows it (trainctl/progress.py text), not its raw fields
        console.print(_table(f"TrainJob {report['name']}", ["FIELD", "VALUE"], [[k, progress.text(v) if k == "progress" else v] for k, v in fields]))
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
    result = jobstate.delete(cluster, args.name)
    cm = result["configmap"]
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
        if args.cmd == "secret":
            from trainctl import secret_cmd

            return secret_cmd.run(args)
        if args.cmd == "ui":
            from trainctl import ui

            try:
                return ui.run(args)
            except ValueError as err:
                raise UsageError(str(err)) from None
        if getattr(args, "local", False):
            return cmd_local(args)
        if args.cmd == "logs" and args.node is None:
            args.node = 0
        return COMMANDS[args.cmd](args)
    except (UsageError, objects.SubmitError, CodeError, SecretInputError) as err:
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
