"""Download the upstream CRD schemas the validator and the schema tests read, for CI runners that
have no ``../shared/schemas`` beside the checkout (GitHub Actions). Same layout:
``<dir>/<project>/<version>/<file>``. Versions come from ``versions.py`` and ``tools/validate.py``.

Usage: python -m tools.fetch_crds .crds && CRD_SCHEMAS_DIR=.crds make test
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import urllib.request

import versions
from tools.validate import KARPENTER_SCHEMA_VERSION, KUEUE_SCHEMA_VERSION

RAW = "https://raw.githubusercontent.com"
TRAINER_CRDS = ("clustertrainingruntimes", "trainingruntimes", "trainjobs")
KARPENTER_CRDS = ("karpenter.sh_nodepools", "karpenter.sh_nodeclaims", "karpenter.k8s.aws_ec2nodeclasses", "karpenter.sh_nodeoverlays")
KUEUE_CRDS = ("clusterqueues", "localqueues", "resourceflavors", "workloadpriorityclasses", "workloads", "topologies")


def sources() -> dict[str, str]:
    """Local path (relative to the schemas dir) -> upstream URL at the pinned tag."""
    out = {}
    for trainer, pins in versions.TRAINER_VERSIONS.items():
        for crd in TRAINER_CRDS:
            name = f"trainer.kubeflow.org_{crd}.yaml"
            out[f"kubeflow-trainer/{trainer}/{name}"] = f"{RAW}/kubeflow/trainer/{trainer}/manifests/base/crds/{name}"
        jobset = pins["jobset"]
        out[f"jobset/{jobset}/jobset.x-k8s.io_jobsets.yaml"] = f"{RAW}/kubernetes-sigs/jobset/{jobset}/config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml"
    for crd in KARPENTER_CRDS:
        out[f"karpenter/{KARPENTER_SCHEMA_VERSION}/{crd}.yaml"] = f"{RAW}/aws/karpenter-provider-aws/{KARPENTER_SCHEMA_VERSION}/pkg/apis/crds/{crd}.yaml"
    for crd in KUEUE_CRDS:
        name = f"kueue.x-k8s.io_{crd}.yaml"
        out[f"kueue/{KUEUE_SCHEMA_VERSION}/{name}"] = f"{RAW}/kubernetes-sigs/kueue/{KUEUE_SCHEMA_VERSION}/config/components/crd/bases/{name}"
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("dest")
    args = ap.parse_args(argv)
    dest = pathlib.Path(args.dest)
    for rel, url in sources().items():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        with urllib.request.urlopen(url, timeout=60) as resp:  # noqa: S310 - fixed https URLs at pinned tags
            target.write_bytes(resp.read())
        print(f"fetch_crds: {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
