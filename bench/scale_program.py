"""A Pulumi program for the render-scaling benchmark: the real dev stack plus N extra
ClusterTrainingRuntimes and N extra TrainJobs, built by the project's own builders and
registered through the same ``apply_manifest`` path."""

import os

import pulumi

n = int(os.environ.get("SCALE_N", "1"))
exec(open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "__main__.py")).read())  # the real program  # noqa: S102

from config.settings import load_settings  # noqa: E402
from infra.project_config import aws_region, project_config  # noqa: E402
from k8s.builders.runtimes import torch_runtime  # noqa: E402
from k8s.resources import apply_manifest  # noqa: E402
from workloads.builders import trainjobs as tj  # noqa: E402

_s = load_settings(project_config(), stack=pulumi.get_stack(), region=aws_region())
_files = tj.code_files()
for i in range(n):
    rt = torch_runtime(_s.trainer)
    rt["metadata"]["name"] = f"torch-scale-{i}"
    apply_manifest(rt, pulumi.ResourceOptions(provider=cluster.provider))  # noqa: F821 - defined by the real program
    job = tj.trainjob(tj.WORKLOADS["ddp"], _s.trainjobs.ddp, _s, code_configmap=tj.code_configmap_name(_files), runtime_name=rt["metadata"]["name"],
        image=training_image.ref if training_image else None,  # noqa: F821 - defined by the real program
    )
    job["metadata"]["name"] = f"ddp-scale-{i}"
    apply_manifest(job, pulumi.ResourceOptions(provider=cluster.provider))  # noqa: F821
