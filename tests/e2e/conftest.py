"""End-to-end tests on real local control planes (tools/cluster): one per stack, brought up once
on first use and stopped (by pid) when the e2e tests are done.

Needs Go (to build the pinned components once, cached under ~/.cache/training-platform), Debian's
etcd-server and openssl; `.ci/run` installs etcd. Without Go or etcd these tests fail, saying so:
they are part of `make test`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.conftest import stack_file
from tools.cluster import up as cluster
from tools.cluster.client import Client
from tools.cluster.procs import Processes

_UP: dict[str, cluster.Up] = {}


class Clusters:
    def __init__(self, out):
        self.out = out

    def get(self, stack: str, instance: str = "shared", **options) -> cluster.Up:
        """The stack's cluster (Pulumi.<stack>.yaml applied), brought up on first use; another
        ``instance`` is a cluster of its own (for a test that changes what others read), brought
        up with ``options`` (``cluster.up``'s keywords)."""
        key = f"{instance}/{stack}"
        if key not in _UP:
            _UP[key] = cluster.up(stack, out=self.out / instance, **options)
        return _UP[key]

    def release(self, stack: str, instance: str) -> None:
        """Stop a cluster of its own once its tests are done (2 cores hold only a few at once)."""
        if _UP.pop(f"{instance}/{stack}", None) is not None:
            cluster.down(stack, out=self.out / instance)


@pytest.fixture(scope="package")  # stopped when the e2e tests are done, not at the end of the whole suite
def clusters(tmp_path_factory) -> Iterator[Clusters]:
    out = tmp_path_factory.mktemp("e2e-out")
    yield Clusters(out)
    for key in list(_UP):
        instance, stack = key.split("/")
        cluster.down(stack, out=out / instance)
        del _UP[key]


def wait_for(what: str, check: Callable[[], Any], up: cluster.Up, timeout: float = 120, interval: float = 0.5) -> Any:
    """``check()`` until it returns something truthy; fails naming ``what`` (and any component that died)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        Processes(up.dir).check()
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r}); logs in {up.dir / 'logs'}")


def require_kueue_visibility(up: cluster.Up) -> None:
    """Skip, saying why, where cluster-up could not serve Kueue's visibility API (no mount
    namespace here: tools/cluster/up.py says so as it starts); elsewhere its APIService is there."""
    if up.client().get_or_none("apiregistration.k8s.io/v1", "APIService", "v1beta2.visibility.kueue.x-k8s.io") is None:
        pytest.skip("Kueue's visibility API is not served on this machine's local control plane (no mount namespace for its certificate)")


def admin(up: cluster.Up) -> Client:
    return up.client()


def trainctl(capsys, up: cluster.Up, *args: str) -> tuple[int, str, str]:
    """``trainctl <command> --kubeconfig <the cluster's> <args...>``: exit code, stdout, stderr."""
    from trainctl import cli

    capsys.readouterr()
    rc = cli.main([args[0], "--kubeconfig", str(up.kubeconfig), *args[1:]])
    out = capsys.readouterr()
    return rc, out.out, out.err


__all__ = ["Clusters", "admin", "stack_file", "trainctl", "wait_for"]
