"""What the API server can store of one object: the one size check of every ConfigMap and
TrainJob the platform's stack, a TrainJob stack and ``trainctl submit`` build.

Two limits apply, and the lower binds:

* etcd refuses a request larger than 1.5 MiB (``--max-request-bytes``, default
  ``DefaultMaxRequestBytes = 1.5 * 1024 * 1024``, etcd v3.6.4 ``server/embed/config.go``; etcd docs,
  dev-guide "System limits"), and the API server writes each object in one etcd request
  (k8s.io/apiserver v0.34.4 ``pkg/server/config.go``, on ``MaxRequestBodyBytes``: "1.5MB is the
  recommended client request size in byte the etcd server should accept ... A request body might be
  encoded in json, and is converted to proto when persisted in etcd");
* the API server's own request-body limit is 3 MiB (``MaxRequestBodyBytes = 3 * 1024 * 1024``, the
  same file), above etcd's, so it never binds first.

So :data:`MAX_OBJECT_BYTES` is etcd's 1.5 MiB. An EKS control plane's etcd limit is not
published; 1.5 MiB is the default the upstream components ship, the one measured here on a local
control plane (kube-apiserver v1.34.4, etcd v3.6.4: a ConfigMap of 1.49 MB as compact JSON is
stored, one of 1.72 MB refused with "etcdserver: request is too large"; tests/e2e/test_trainctl.py).

A ConfigMap's values have a limit of their own: 1 MiB (1048576 bytes), the sum of ``len(value)``
over ``data`` (UTF-8 bytes) and ``binaryData`` (decoded bytes) (``ValidateConfigMap``, kubernetes
``pkg/apis/core/validation/validation.go``, ``MaxSecretSize``; Kubernetes docs, "ConfigMaps").

:func:`stored_size` counts an object as compact JSON (a custom resource such as the TrainJob is
stored as JSON, a ConfigMap as protobuf, which is no larger) plus a margin for what the server adds
(uid, timestamps, managedFields). A value not known before deploy (a Pulumi output: the image the
stack builds) counts as :data:`UNRESOLVED_BYTES`.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

MAX_CONFIGMAP_BYTES = 1024 * 1024
MAX_OBJECT_BYTES = 1024 * 1024 * 3 // 2  # etcd's default request limit (1.5 MiB)
SERVER_ADDED_BYTES = 4096  # what the API server adds to a created object (uid, resourceVersion, timestamps, a managedFields entry)
UNRESOLVED_BYTES = 256  # a value known only at deploy: an image <registry>/<repository>@sha256:<64 hex digits>


def _mib(n: int) -> str:
    return f"{n / (1024 * 1024):.1f} MiB"


def stored_size(obj: dict) -> int:
    """About how many bytes the API server stores for ``obj`` (see the module's docstring)."""
    return len(json.dumps(obj, separators=(",", ":"), ensure_ascii=False, default=lambda _: "?" * UNRESOLVED_BYTES).encode()) + SERVER_ADDED_BYTES


def configmap_data_size(obj: dict) -> int:
    """What ``ValidateConfigMap`` sums: the UTF-8 bytes of ``data`` and the decoded ``binaryData``."""
    text = sum(len(v.encode()) for v in (obj.get("data") or {}).values() if isinstance(v, str))
    binary = sum(len(base64.b64decode(v)) if isinstance(v, str) else len(v) for v in (obj.get("binaryData") or {}).values())
    return text + binary


def size_problem(obj: dict[str, Any]) -> str | None:
    """Why the API server would refuse to store ``obj`` (None when it fits): its ConfigMap data over
    1 MiB, or the whole object over etcd's request limit."""
    if obj.get("kind") == "ConfigMap" and (data := configmap_data_size(obj)) > MAX_CONFIGMAP_BYTES:
        return f"its ConfigMap {obj['metadata']['name']} would hold {_mib(data)} ({data} bytes) of data, more than the 1 MiB ({MAX_CONFIGMAP_BYTES} bytes) a ConfigMap holds"
    if (size := stored_size(obj)) > MAX_OBJECT_BYTES:
        return (f"its {obj.get('kind', 'object')} {obj.get('metadata', {}).get('name', '')} would be about {_mib(size)} ({size} bytes) as stored, "
                f"more than the {_mib(MAX_OBJECT_BYTES)} ({MAX_OBJECT_BYTES} bytes) etcd takes in one request (--max-request-bytes, its default), so the API server cannot store it")
    return None


def env_blame(obj: dict[str, Any], env: Mapping[str, str]) -> tuple[str | None, str]:
    """For an object too large to store (:func:`size_problem`) built with the environment ``env``:
    the variable whose value alone makes the difference (None when none does, or for a ConfigMap,
    which holds no environment), and words naming the largest values (their sizes, never the values),
    for the render's line and trainctl's alike."""
    if obj.get("kind") == "ConfigMap" or not env:
        return None, ""
    sizes = sorted(((len(v.encode()), n) for n, v in env.items()), reverse=True)
    culprit = sizes[0][1] if sizes[0][0] >= stored_size(obj) - MAX_OBJECT_BYTES else None
    return culprit, f" (its largest environment values: {', '.join(f'{n} {b} bytes' for b, n in sizes[:3])})"
