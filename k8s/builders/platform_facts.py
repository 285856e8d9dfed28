"""The platform's facts, published where teams can read them: a ConfigMap ``platform-facts`` in
every team namespace (a team's Role may read its ConfigMaps). ``trainctl`` reads it to default and
check a job the way the stack's own jobs are built: which GPU pools exist and which instance types
each launches, the EFA layouts and zone, the image that carries EFA's libraries.

The document (``facts.json``)::

    {"version": 1, "trainerVersion": "v2.3.0", "kueue": true,
     "pools": [{"name": "gpu-pool", "instanceTypes": [...], "efa": false, "zone": null}, ...],
     "efa": {"zone": "us-east-1a", "instanceTypes": [...]} | null,
     "defaultInstanceType": "g5.xlarge", "image": "<account>.dkr.ecr...@sha256:..." | null,
     "finishedJobRetention": "168h", "finishedJobRetentionMax": "720h", ...}
"""

from __future__ import annotations

import json
from typing import Any

from config import catalog
from config.settings import Settings
from k8s.builders import kueue as kq
from k8s.builders.tenants import TEAM_SERVICE_ACCOUNT

CONFIGMAP = "platform-facts"
KEY = "facts.json"
VERSION = 1


def facts(settings: Settings, image: str | None, team: str | None = None) -> dict[str, Any]:
    pools = []
    for pool in kq.pools(settings):
        pools.append({"name": pool.name, "instanceTypes": sorted(pool.instance_types), "efa": pool.efa, "zone": settings.efa.availability_zone if pool.efa else None})
    gpu_types = sorted(next(p for p in kq.pools(settings) if not p.efa).instance_types, key=lambda t: (catalog.lookup(t).gpus, catalog.lookup(t).vcpu, t))
    return {
        "version": VERSION,
        "trainerVersion": settings.trainer.version,
        "kueue": bool(settings.kueue_enabled),
        "pools": pools,
        "efa": {"zone": settings.efa.availability_zone, "instanceTypes": list(settings.efa.instance_types)} if settings.efa.enabled else None,
        "defaultInstanceType": gpu_types[0] if gpu_types else None,
        "image": image,
        "priorities": list(kq.PRIORITIES) if settings.kueue_enabled else [],
        "defaultPriority": settings.tenants.teams()[team].default_priority if team in settings.tenants.teams() else "normal",
        # what a team's jobs run as (k8s/builders/tenants.py): trainctl and the portal set it on the trainer pods
        "serviceAccount": TEAM_SERVICE_ACCOUNT if team in settings.tenants.teams() else None,
        # how long finished jobs are kept, and the most a job may ask for (trainctl submit --ttl; k8s/pods/trainjob_cleanup.py)
        "finishedJobRetention": settings.trainjobs.finished_job_retention,
        "finishedJobRetentionMax": settings.trainjobs.retention_max(),
    }


def configmap(ns: str, document: Any, labels: dict[str, str]) -> dict:
    """``document``: the facts' JSON text (a string, or a Pulumi output of one)."""
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": CONFIGMAP, "namespace": ns, "labels": dict(labels)}, "data": {KEY: document}}


def dumps(document: dict[str, Any]) -> str:
    return json.dumps(document, sort_keys=True)
