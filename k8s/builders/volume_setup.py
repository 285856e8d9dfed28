"""One-shot Jobs that prepare directories on the shared checkpoint file system for the non-root
training user (``versions.WORKLOAD_UID``).

Why a Job: a new FSx for Lustre or EFS file system's root directory belongs to root (mode 0755),
and neither CSI driver applies a pod's ``fsGroup`` to these ReadWriteMany volumes (the kubelet
changes ownership only for drivers whose CSIDriver ``fsGroupPolicy`` allows it; aws-fsx-csi-driver
keeps the default ``ReadWriteOnceWithFSType``: kubernetes-sigs/aws-fsx-csi-driver PR #348 was not
merged). The training pods run as the non-root user with every capability dropped, so someone must
hand them their directories once: this Job runs as root with only ``CAP_CHOWN`` and ``CAP_FOWNER``
(a later run, for a new team say, chmods directories the training user already owns: without
FOWNER only the owner may; both are allowed by Pod Security "baseline"), mounts the claim, and exits. pulumi-kubernetes
waits for a Job to complete before dependants are created, so TrainJobs start on prepared volumes.
"""

from __future__ import annotations

import hashlib
import json

from k8s.builders.tenants import CHECKPOINT_CLAIM, STORAGE_NAMESPACE, tenant_dirs_script

MOUNT = "/fs"


def directories_job(*, namespace: str, prefix: str, script: str, image: str, claim: str = CHECKPOINT_CLAIM) -> dict:
    """A Job named ``<prefix>-<hash of its spec>`` (a Job's pod template is immutable: any change,
    the script, the image or the capabilities, makes a new Job) that runs ``script`` with the claim
    mounted at :data:`MOUNT`."""
    container = {
        "name": "mkdir",
        "image": image,
        "command": ["sh", "-c", script],
        "securityContext": {"runAsUser": 0, "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"], "add": ["CHOWN", "FOWNER"]}, "seccompProfile": {"type": "RuntimeDefault"}},
        "resources": {"requests": {"cpu": "100m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}},
        "volumeMounts": [{"name": "fs", "mountPath": MOUNT}],
    }
    spec = {
        "backoffLimit": 4,
        "template": {
            "spec": {
                "restartPolicy": "OnFailure",
                "automountServiceAccountToken": False,
                "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [container],
                "volumes": [{"name": "fs", "persistentVolumeClaim": {"claimName": claim}}],
            }
        },
    }
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]
    # checkov inline skip: the two capabilities are this Job's whole purpose (see the module docstring)
    skip = {"checkov.io/skip1": "CKV_K8S_25=CHOWN and FOWNER hand the volume's directories to the non-root training user"}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": f"{prefix}-{digest}", "namespace": namespace, "annotations": skip}, "spec": spec}


def owner_script(uid: int) -> str:
    """Hand the claim's root to the training user (mode 0755), as whom the trainer pods and the
    Trainer's initializers run (k8s/builders/runtimes.py)."""
    return f"set -eu; chmod 0755 {MOUNT}; chown {uid}:{uid} {MOUNT}"


def checkpoint_owner_job(namespace: str, *, uid: int, image: str) -> dict:
    """The training namespace's claim (the file system's root) made writable for the training user."""
    return directories_job(namespace=namespace, prefix="checkpoint-owner", script=owner_script(uid), image=image)


def tenant_dirs_job(teams: list[str], *, uid: int, image: str) -> dict:
    """The Job that creates the teams' directories (FSx for Lustre: the CSI driver mounts a
    sub-directory only if it exists), mounting the file system's root through the storage
    namespace's claim."""
    return directories_job(namespace=STORAGE_NAMESPACE, prefix="tenant-dirs", script=tenant_dirs_script(teams, uid), image=image)
