"""TF_CONFIG for a TensorFlow MultiWorkerMirroredStrategy job run by Kubeflow Trainer.

Everything comes from what the Trainer injects into each node: ``PET_NNODES`` (node count),
``PET_NODE_RANK`` (this node's index) and ``PET_MASTER_ADDR`` (node 0's stable DNS name,
``<pod-host>.<subdomain>``). Worker hosts are node 0's name with its pod index replaced, so no
worker count is written by hand and no job name is assumed.

A master address that is an IP address means every node runs on that one host (the local
emulator, tools/emulate.py): the workers then listen on consecutive ports from ``TF_PORT``.

Run as a program it prints TF_CONFIG for the current node, or with ``-- CMD ...`` exports it and
execs the command.
"""

from __future__ import annotations

import ipaddress
import json
import os
import sys
from collections.abc import Mapping

TF_PORT = 2222


def worker_hosts(*, nnodes: int, master_addr: str, port: int = TF_PORT) -> list[str]:
    try:
        ip = ipaddress.ip_address(master_addr)
    except ValueError:
        ip = None
    if ip is not None:  # one host: one port per worker
        host = f"[{ip}]" if ip.version == 6 else str(ip)
        return [f"{host}:{port + i}" for i in range(nnodes)]
    host, dot, domain = master_addr.partition(".")
    stem, sep, index = host.rpartition("-")
    if not sep or index != "0":
        raise ValueError(f"master address {master_addr!r} is not the first node's pod name (<name>-0[.<subdomain>])")
    return [f"{stem}-{i}{dot}{domain}:{port}" for i in range(nnodes)]


def tf_config(*, nnodes: int, node_rank: int, master_addr: str, port: int = TF_PORT) -> dict:
    if nnodes < 1 or not 0 <= node_rank < nnodes:
        raise ValueError(f"node rank {node_rank} out of range for {nnodes} nodes")
    return {"cluster": {"worker": worker_hosts(nnodes=nnodes, master_addr=master_addr, port=port)}, "task": {"type": "worker", "index": node_rank}}


def from_env(env: Mapping[str, str] | None = None) -> dict:
    env = os.environ if env is None else env
    return tf_config(nnodes=int(env["PET_NNODES"]), node_rank=int(env["PET_NODE_RANK"]), master_addr=env["PET_MASTER_ADDR"], port=int(env.get("TF_PORT", TF_PORT)))


def main(argv: list[str]) -> int:
    config = json.dumps(from_env())
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        print(config)
        return 0
    os.environ["TF_CONFIG"] = config
    os.execvp(argv[0], argv)
    return 1  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
