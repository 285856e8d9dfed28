"""The local control plane's command line.

Usage:
  python -m tools.cluster up --stack dev      start it and apply the stack (make cluster-up STACK=dev)
  python -m tools.cluster down --stack dev    stop exactly what it started, remove its state
  python -m tools.cluster build --stack dev [--stack prod ...]   only build the stacks' components (cached per version)
  python -m tools.cluster build --all         every pinned version (KUBERNETES minors, Trainer releases, ...)
  python -m tools.cluster status --stack dev  its processes, and any that died, with their last log lines
  python -m tools.cluster charts --stack dev  render the stack's Helm charts that ship in the components' modules
                                              with its values (unknown keys fail); no cluster needed

Every failure is one line (and, for a component that exited, its last log lines), exit 2.
"""

from __future__ import annotations

import argparse
import sys

import versions
from tools.cluster import build
from tools.cluster.procs import Processes, alive, log_tail
from tools.cluster.up import cluster_dir, down, summary, up, wrap_errors


def _build(args) -> str:
    if args.all:
        units: list[build.Unit] = [build.kubernetes(m) for m in versions.LOCAL_KUBERNETES_RELEASES]
        for trainer in versions.TRAINER_VERSIONS:
            units += [build.jobset(trainer), build.trainer(trainer)]
        units += [build.karpenter(), build.kwok(), build.kueue(), build.etcd(), build.helm()]
    else:
        from tools.cluster.plan import stack_plan
        from tools.cluster.up import PROJECT_DIR, _region
        from tools.mock_runtime import run_program

        units = []
        for stack in args.stack or ["dev"]:
            plan = stack_plan(run_program(str(PROJECT_DIR), stack), _region(stack, None))
            units += [u for u in build.units_for(plan.kubernetes_version, plan.trainer_version, plan.kueue is not None) if u not in units]
        units.append(build.helm())  # the e2e tests render the stacks' charts with it (tests/e2e/test_charts.py)
    seconds = build.build_all(units)
    return f"cluster build: {len(units)} components ready under {build.cache_dir() / 'bin'}; built now in {seconds:.0f} s (0 = all cached)"


def _charts(args) -> str:
    from tools.cluster import charts
    from tools.cluster.plan import stack_plan
    from tools.cluster.up import PROJECT_DIR, _region
    from tools.mock_runtime import run_program

    plan = stack_plan(run_program(str(PROJECT_DIR), args.stack), _region(args.stack, None))
    try:
        rendered = charts.rendered(plan)
    except charts.ChartError as err:
        raise ValueError(str(err)) from None
    lines = [f"charts {args.stack}: rendered with the stack's values by the Helm SDK {versions.HELM_VERSION}"]
    for r in rendered:
        kinds: dict[str, int] = {}
        for obj in r.manifests + r.crds + [h["object"] for h in r.hooks]:
            kinds[obj["kind"]] = kinds.get(obj["kind"], 0) + 1
        lines.append(f"  {r.release.name} {r.source.chart_version} ({r.source}): {', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))}")
    lines += [f"  {name}: not rendered: {why}" for name, why in charts.not_rendered(plan).items()]
    return "\n".join(lines)


def _status(args) -> str:
    d = cluster_dir(args.stack, args.out)
    procs = Processes(d)
    if not procs.procs:
        return f"no local cluster for stack {args.stack} ({d})"
    lines = [f"local cluster {args.stack}: {procs.info.get('server', '?')}, kubeconfig {d / 'kubeconfig'}"]
    for p in procs.procs:
        state = "running" if alive(p) else "EXITED"
        lines.append(f"  {p.name:24} pid {p.pid:<8} {state}")
        if state != "running":
            lines.append(log_tail(p.log))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.cluster", description="A local Kubernetes control plane for a stack, from the pinned upstream releases.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("up", "down", "build", "status", "charts"):
        p = sub.add_parser(name)
        if name == "build":
            p.add_argument("--stack", action="append", help="a stack whose components to build (repeatable)")
        else:
            p.add_argument("--stack", default="dev")
        if name == "up":
            p.add_argument("--project", choices=("", "workloads"), default="", help="workloads: --stack is a TrainJob stack, applied after its platform stack (tools/cluster/run_up.py)")
        p.add_argument("--out", default="out")
        if name == "build":
            p.add_argument("--all", action="store_true")
    args = ap.parse_args(argv)

    if args.cmd == "up":
        def run() -> str:
            if args.project:
                from tools.cluster.run_up import up_run

                applied = up_run(args.stack, out=args.out)
                # the platform's summary when it was brought up now (a running one was applied before)
                head = summary(applied.platform) + "\n" if applied.platform.plan.waves else f"local cluster {applied.platform.plan.stack}: running, {applied.platform.kubeconfig}\n"
                return head + f"TrainJob stack {args.stack}: created {', '.join(applied.created) or 'nothing'}" + "".join(f"\nPROBLEM {p}" for p in applied.outcome.problems)
            result = up(args.stack, out=args.out)
            return summary(result)
        message, code = wrap_errors(run)
        if code == 0 and "PROBLEM" in message:
            code = 1
    elif args.cmd == "down":
        def stop() -> str:
            d = cluster_dir(args.stack, args.out)
            if not d.exists():
                return f"cluster-down {args.stack}: no local cluster ({d} does not exist)"
            stopped = down(args.stack, out=args.out)
            return f"cluster-down {args.stack}: stopped {', '.join(stopped) or 'nothing (none of its processes was running)'}; removed {d}"
        message, code = wrap_errors(stop)
    elif args.cmd == "build":
        message, code = wrap_errors(lambda: _build(args))
    elif args.cmd == "charts":
        message, code = wrap_errors(lambda: _charts(args))
    else:
        message, code = wrap_errors(lambda: _status(args))
    stream = sys.stdout if code in (0, 1) else sys.stderr  # 1: up, with problems in its summary
    print(message if code in (0, 1) else f"cluster {args.cmd}: {message}", file=stream)
    return code


if __name__ == "__main__":
    sys.exit(main())
