"""training-platform-workloads: one training run per stack, on a platform stack.

``cd workloads && pulumi up -s fsdp`` registers exactly the run its stack file describes (its code
ConfigMap and TrainJob) on the platform stack it names, read through a StackReference (the
platform's ``kubeconfig`` and ``jobPlatform`` outputs: namespace, checkpoint claim, runtimes,
image, queue, Trainer version, pools, EFA). The run is built by the same function as the
platform's ``trainjobs.<job>`` (workloads/builders/trainjobs.py run_objects); a run the platform cannot
take (no such runtime, no pool for its instance type, no EFA in its zone, a Trainer without a
field it sets, a priority without Kueue) is refused, one line per problem, before anything of it
is registered. This file is the only one that reads the run's config.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository: config, infra, k8s, workloads

import pulumi  # noqa: E402

from config.run_config import RUN_PROJECT, load_run  # noqa: E402
from config.schema import ConfigError, ConfigErrors  # noqa: E402
from infra.project_config import project_config  # noqa: E402
from workloads.builders.job_platform import DocumentError, run_problems  # noqa: E402
from workloads.builders.trainjobs import WORKLOADS, size_problems  # noqa: E402
from workloads.trainjobs import PlatformReference, TrainJobRun  # noqa: E402

try:
    run = load_run(project_config(RUN_PROJECT), stack=pulumi.get_stack(), base_names={k: w.name for k, w in WORKLOADS.items()})
except ConfigError as err:  # nothing has been registered yet
    raise pulumi.RunError(str(err)) from None

platform_ref = PlatformReference("platform", run.platform)
try:
    platform = platform_ref.facts()
    if problems := list(run_problems(run.path(), run.job, platform, stack=f"platform stack {run.platform}")):
        raise ConfigErrors(problems)
    # objects the API server cannot store (the check trainctl and the platform's jobs make)
    if problems := list(size_problems(run.path(), run.job, TrainJobRun.objects(run.key, run.job, platform, run.name))):
        raise ConfigErrors(problems)
except (ConfigError, DocumentError) as err:  # the run's objects are not registered
    raise pulumi.RunError(str(err)) from None

trainjob = TrainJobRun(run.key, key=run.key, trainjob_name=run.name, job=run.job, platform=platform, provider=platform_ref.provider())
pulumi.export("trainJob", trainjob.name)
pulumi.export("namespace", trainjob.namespace)
pulumi.export("platform", run.platform)
