"""A TrainJob stack's config (the ``workloads/`` project): the platform stack it runs on and one
run, in the same job model as the platform's ``trainjobs.<job>`` (config/job_models.py) with the
same rules (the model's own, config/effect_rules.py's per job). What the run needs of its platform
is judged once the platform's facts are read (workloads/builders/job_platform.py run_problems).

A stack file::

    config:
      training-platform-workloads:platform: organization/training-platform/dev
      training-platform-workloads:fsdp:
        numNodes: 2
        instanceType: g5.12xlarge
        epochs: 1
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from config import trainjob_names
from config.effect_rules import job_args_problems, job_guard_problems
from config.infra_models import TORCH_HF_RUNTIME
from config.job_models import JobBase, TrainJobsSettings
from config.schema import ConfigError, ConfigErrors, unknown_key_hint, validate_section
from config.settings import start_minutes_for

RUN_PROJECT = "training-platform-workloads"
"""The TrainJob stacks' Pulumi project (workloads/Pulumi.yaml) and config namespace."""
PLATFORM_KEY = "platform"
# the job keys of the platform's trainjobs section and their models (ddp, fsdp, tf, ncclCheck)
JOB_MODELS: dict[str, type[JobBase]] = {cast(str, f.alias): cast(type[JobBase], f.annotation) for f in TrainJobsSettings.model_fields.values() if isinstance(f.annotation, type) and issubclass(f.annotation, JobBase)}
# A stack reference names <organization>/<project>/<stack> (Pulumi docs, "Stack references"; the DIY
# backends' form is organization/<project>/<stack>): each part letters, digits, '-', '_', '.'
_STACK_REF_RE = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$", re.ASCII)




@dataclass(frozen=True)
class RunConfig:
    platform: str  # the platform stack, fully qualified
    key: str  # the job key: ddp, fsdp, tf, ncclCheck
    job: JobBase
    name: str  # the TrainJob's name: <the job's name on the platform>-<stack> (its checkpoint directory too)

    def path(self) -> str:
        return f"{RUN_PROJECT}:{self.key}"


def _err(key: str, value: Any, allowed: str) -> ConfigError:
    return ConfigError(f"{RUN_PROJECT}:{key}", value, allowed)


def run_name(base: str, stack: str) -> str:
    """A run's TrainJob name: the platform's name for the job (``fsdp-t5``) and the stack, so a run
    never takes the platform's own job, nor its checkpoints, nor another run's."""
    return f"{base}-{stack}"


def load_run(raw: Mapping[str, Any], *, stack: str, base_names: Mapping[str, str]) -> RunConfig:
    """The run a TrainJob stack's config (keys without the namespace) describes; one
    :class:`ConfigErrors` listing every problem otherwise. ``base_names``: job key -> the
    platform's TrainJob name for it (workloads/builders/trainjobs.py WORKLOADS)."""
    errors: list[ConfigError] = []
    allowed = [PLATFORM_KEY, *JOB_MODELS]
    for key in raw:
        if key not in allowed:
            errors.append(_err(key, raw[key], unknown_key_hint(key, allowed)))
    platform = raw.get(PLATFORM_KEY)
    if platform is None:
        errors.append(_err(PLATFORM_KEY, None, "required: the platform stack the run runs on, as <organization>/<project>/<stack> such as organization/training-platform/dev"))
    elif not isinstance(platform, str) or not _STACK_REF_RE.fullmatch(platform):
        errors.append(_err(PLATFORM_KEY, platform, "allowed: a fully qualified stack name <organization>/<project>/<stack> such as organization/training-platform/dev"))
    jobs = [k for k in JOB_MODELS if k in raw]
    if len(jobs) != 1:
        errors.append(_err(", ".join(jobs) or "<job>", None, f"allowed: exactly one run per stack, one of {', '.join(JOB_MODELS)} (a stack per run)"))
    job: JobBase | None = None
    for key in jobs[:1]:
        section = {} if raw[key] in (None, "") else raw[key]  # no value (``ddp:``): Pulumi passes "", the empty section
        if isinstance(section, Mapping) and "enabled" in section:
            errors.append(_err(f"{key}.enabled", section["enabled"], "a TrainJob stack is its run: pulumi destroy of the stack ends it; allowed: unset"))
            section = {k: v for k, v in section.items() if k != "enabled"}
        obj, found = validate_section(JOB_MODELS[key], {**section, "enabled": True} if isinstance(section, Mapping) else section, f"{RUN_PROJECT}:{key}")
        errors += found
        if obj is not None:
            job = cast(JobBase, obj)
            path = f"{RUN_PROJECT}:{key}"
            errors += [*job_guard_problems(path, job, 60 * start_minutes_for([job])), *job_args_problems(path, job)]
    name = run_name(base_names[jobs[0]], stack) if len(jobs) == 1 else ""
    nodes = job.num_nodes if job is not None else 1
    initializers = JOB_MODELS[jobs[0]].RUNTIME == TORCH_HF_RUNTIME if len(jobs) == 1 else False
    if name and (why := trainjob_names.name_problem(name, nodes, initializers=initializers)) is not None:
        errors.append(ConfigError("pulumi:stack", stack, f"the run's TrainJob would be named {name!r} ({len(name)} characters); {why}; a shorter stack name of lowercase letters, digits and '-'"))
    if errors:
        raise ConfigErrors(errors)
    assert job is not None and isinstance(platform, str)
    return RunConfig(platform=platform, key=jobs[0], job=job, name=name)
