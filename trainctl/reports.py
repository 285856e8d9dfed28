"""trainctl's output (tables for people, JSON/YAML for scripts) and its local-mode commands, which
need no cluster."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

import yaml

import versions
from trainctl import diagnose, local, objects, progress, usage
from trainctl.code import collect


def emit(data: Any, output: str, table: Any = None) -> None:
    if output == "json":
        print(json.dumps(data, indent=2, sort_keys=False, default=str))
    elif output == "yaml":
        print(yaml.safe_dump(data, sort_keys=False, default_flow_style=False), end="")
    else:
        from rich.console import Console

        Console(soft_wrap=True).print(table)


def _table(title: str | None, columns: Sequence[str], rows: list[Sequence[Any]]) -> Any:
    from rich.table import Table

    t = Table(title=title, show_lines=False, header_style="bold")
    for c in columns:
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(*("-" if v in (None, "") else str(v) for v in r))
    return t


def cmd_submit_local(args: argparse.Namespace, command: list[str]) -> int:
    """The objects the cluster path creates, run on this machine by the emulator in the background
    (with ``--dry-run`` only printed: nothing starts)."""
    env, secret_env, env_lines = objects.env_flags(getattr(args, "env", None), getattr(args, "secret_env", None))
    req = objects.Request(
        env=env, secret_env=secret_env, local=True, namespace=args.namespace or "local", nodes=args.nodes, command=command, runtime=args.runtime, gpus_per_node=args.gpus_per_node if args.gpus_per_node is not None else 1,
        instance_type=args.instance_type or objects.DEFAULT_INSTANCE_TYPE, image=args.image, name=args.name, trainer_version=args.trainer_version or versions.DEFAULT_TRAINER_VERSION,
        grace_seconds=args.grace_seconds, priority=args.priority, efa_zone=args.efa_zone, resume_from=args.resume_from, deps_timeout=args.deps_timeout,
    )
    found = env_lines + objects.problems(req) + local.node_problems(req.nodes, req.gpus_per_node or 1)
    if getattr(args, "ttl", None) is not None:
        found.append("--ttl: not with --local (a local job stays until trainctl delete --local)")
    if found:  # every problem at once, before the code dir is read
        raise objects.SubmitError("\n".join(found))
    cm, tj = objects.build(req, collect(args.code_dir))
    if req.image is not None and (warning := objects.efa_image_warning(req, None)) is not None:  # no image: this machine's Python runs it
        print(f"trainctl: warning: {warning}", file=sys.stderr)
    if args.dry_run:
        if args.output == "json":
            print(json.dumps({"apiVersion": "v1", "kind": "List", "items": [cm, tj]}, indent=2))
        else:
            print(yaml.safe_dump_all([cm, tj], sort_keys=False), end="")
        print(f"trainctl: --dry-run: nothing started (trainctl submit --local without it runs {tj['metadata']['name']} on this machine)", file=sys.stderr)
        return 0
    state = local.submit(cm, tj, grace_s=req.grace_seconds)
    name = state["name"]
    if state.get("replaced"):
        print(f"trainctl: replaced the finished ({state['replaced']}) local job {name}; its checkpoints stay: the job resumes from them", file=sys.stderr)
    if args.output == "table":
        print(f"{name}: {req.nodes} nodes on this machine (emulator pid {state['pid']}); follow it: trainctl logs --local {name} -f")
    else:
        emit({"name": name, "pid": state["pid"], "dir": str(local.job_dir(name))}, args.output)
    return 0


def _local_rows(reports: list[dict]) -> list[Sequence[Any]]:
    return [[r["name"], r["phase"], r.get("nodes"), r.get("restarts", 0), progress.text(r.get("progress")), r.get("submitted")] for r in reports]


def cmd_local(args: argparse.Namespace) -> int:
    if args.cmd == "list":
        reports = local.jobs()
        emit(reports, args.output, _table(None, ["NAME", "PHASE", "NODES", "RESTARTS", "PROGRESS", "SUBMITTED"], _local_rows(reports)))
    elif args.cmd == "status":
        r = local.report(args.name)
        if args.output == "table":
            for key in ("name", "phase", "nodes", "restarts", "progress", "reason", "message", "cause", "submitted"):
                if r.get(key) is not None:
                    print(f"{key + ':':<10} {r[key]}")
            failure = r.get("failure")
            if failure:
                print(f"{'failed:':<10} {failure['where']} exited with code {failure['exit_code']}")
                for line in failure.get("last_lines", []):
                    print(f"           | {line}")
        else:
            emit(r, args.output)
    elif args.cmd == "logs":
        for line in local.logs(args.name, node=args.node, follow=args.follow):
            print(line, flush=True)
    elif args.cmd == "diagnose":
        return _print_findings(args.name, diagnose.diagnose(local.evidence(args.name)), args.output)
    elif args.cmd == "delete":
        stopped = local.delete(args.name)
        print(f"{args.name}: {'stopped and ' if stopped else ''}deleted (local)")
    return 0


def _print_findings(name: str, findings: list, output: str) -> int:
    if output != "table":
        emit([f.as_dict() for f in findings], output)
        return 0
    if not findings:
        print(f"{name}: nothing found that explains a failure or a wait (trainctl status {name})")
    for f in findings:
        print(f"{f.cause}:")
        for line in f.evidence:
            print(f"  | {line}")
        if f.hint:
            print(f"  -> {f.hint}")
    return 0


def print_usage(rs: list, *, since: Any, now: Any, csv_out: bool, output: str) -> int:
    if csv_out:
        sys.stdout.write(usage.to_csv(rs))
        return 0
    teams = usage.per_team(rs)
    if output != "table":
        emit({"since": since.isoformat(), "until": now.isoformat(), "teams": teams, "jobs": [r.__dict__ | {"start": r.start.isoformat(), "end": r.end.isoformat() if r.end else None} for r in rs]}, output)
        return 0
    print(f"GPU-hours {since:%Y-%m-%d %H:%M} to {now:%Y-%m-%d %H:%M} UTC")
    emit(None, "table", _table("per team", ["TEAM", "GPU-HOURS"], [[t, f"{h:.2f}"] for t, h in teams.items()]))
    emit(None, "table", _table("per job", ["TEAM", "NAMESPACE", "JOB", "GPUS", "GPU-HOURS", "RUNNING"], [[r.team, r.namespace, r.job, r.gpus, f"{r.gpu_hours:.2f}", "yes" if r.end is None else ""] for r in rs]))
    return 0


