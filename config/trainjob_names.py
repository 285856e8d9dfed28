"""How long a TrainJob's name may be: the one limit trainctl (``--name``, ``--resume-from``, the
default name), the portal (through trainctl's checks) and the TrainJob stacks' names use.

The TrainJob CRD allows an RFC 1035 label of up to 63 characters, but such a job never runs: the
JobSet the Trainer makes for it is refused when its pods' names would not fit.

- JobSet's webhook (sigs.k8s.io/jobset v0.12.0, the same in v0.10.1: pkg/webhooks/jobset_webhook.go,
  ``validateCreate``) checks, for every replicated job that is Indexed with completions set,
  ``placement.GenPodName(jobset, replicatedJob, maxJobIndex, maxPodIndex) + "-abcde"``
  (pkg/util/placement/placement.go: ``"%s-%s-%s-%s"``; the 5 characters stand for the Job
  controller's random suffix) as an RFC 1035 label: at most 63 characters. Its defaulting
  (``Default``) makes every replicated job without a completion mode Indexed.
- The Trainer (kubeflow/trainer v2.1.0 and v2.3.0) names the JobSet after the TrainJob, gives every
  replicated job ``replicas: 1`` (pkg/runtime/framework/plugins/jobset/builder.go: job index 0) and
  completions equal to its pod count (jobset.go: ``Completions = ps.Count``; pkg/runtime/runtime.go:
  ``Count: max(count, 1)``): numNodes for the trainer's job ``node``, 1 for the initializers
  ``dataset-initializer`` and ``model-initializer`` (pkg/constants/constants.go).

So the longest pod name is ``<job>-node-0-<numNodes-1>-xxxxx`` and, on a runtime with the
initializers, ``<job>-dataset-initializer-0-0-xxxxx``. (The webhook's other check, the Job name
``<job>-<replicatedJob>-0``, is shorter than both.)
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

LABEL_MAX = 63  # RFC 1035 label: the TrainJob CRD's name rule and the JobSet webhook's pod-name check
RANDOM_SUFFIX = len("-abcde")  # the webhook's stand-in for the Job controller's random suffix
TRAINER_JOB = "node"  # k8s/builders/trainer_api.py TRAINER_JOB (tests/test_trainjob_names.py checks they agree)
INITIALIZER_JOBS = ("dataset-initializer", "model-initializer")  # trainer_api DATASET_INITIALIZER, MODEL_INITIALIZER
_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$", re.ASCII)


def longest_pod_name(name: str, num_nodes: int, *, initializers: bool = False) -> str:
    """The longest pod name the JobSet webhook checks for TrainJob ``name`` (the random suffix as
    ``abcde``, like the webhook)."""
    pods = [(TRAINER_JOB, num_nodes), *((job, 1) for job in (INITIALIZER_JOBS if initializers else ()))]
    return max((f"{name}-{job}-0-{count - 1}-abcde" for job, count in pods), key=len)


def name_max(num_nodes: int, *, initializers: bool = False) -> int:
    """The longest TrainJob name whose JobSet's pods of ``num_nodes`` nodes (and the initializers'
    pods, on a runtime that has them) get names of at most 63 characters."""
    return LABEL_MAX - len(longest_pod_name("", num_nodes, initializers=initializers))


def name_problem(name: str, num_nodes: int, *, initializers: bool = False) -> str | None:
    """Why ``name`` cannot name a TrainJob of ``num_nodes`` nodes (one line), or None."""
    limit = name_max(num_nodes, initializers=initializers)
    if _NAME_RE.fullmatch(name) and len(name) <= limit:
        return None
    pod = longest_pod_name("<name>", num_nodes, initializers=initializers).replace("abcde", "xxxxx")
    return f"allowed: a lowercase RFC 1035 label (a letter first, then letters, digits, '-') of at most {limit} characters (its pods' names, {pod}, must fit 63)"


def fit_name(base: str, limit: int) -> str:
    """``base`` (already a label) when it fits ``limit``, else cut with a hash of the whole of it
    (``<cut>-<hash8>``): two long names that share their start stay apart, the same name always
    gives the same result."""
    if len(base) <= limit:
        return base
    digest = hashlib.sha256(base.encode()).hexdigest()[:8]
    return f"{base[: limit - len(digest) - 1].rstrip('-')}-{digest}"


def label_from(text: str, limit: int, default: str = "job") -> str:
    """A TrainJob name of at most ``limit`` characters derived from ``text`` (a code directory's
    name), the same for the same name and apart for different ones. A name that is already a label
    (lowercase ASCII letters, digits, '-', a letter first) is kept as it is. Any other loses
    characters when made one (lowercase ASCII letters and digits, every run of other characters one
    ``-``, a letter first), so it gets a hash of the whole name, in Unicode's composed form (NFC:
    macOS writes names decomposed), after what is left: ``My_Model`` -> ``my-model-<hash8>``, apart
    from ``my-model`` and ``My.Model``; ``2024_exp`` -> ``exp-<hash8>``; ``données`` ->
    ``donn-es-<hash8>``; ``模型`` -> ``job-<hash8>``; so two directories never share a job, its
    checkpoints or its resumes. Too long: cut with a hash (:func:`fit_name`)."""
    name = unicodedata.normalize("NFC", text)
    if _NAME_RE.fullmatch(name):
        return fit_name(name, limit)
    base = re.sub(r"[^a-z0-9]+", "-", name.encode("ascii", "replace").decode().replace("?", "-").lower())
    base = re.sub(r"^[^a-z]+", "", base).strip("-")
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    head = (base or default)[: limit - len(digest) - 1].rstrip("-")
    return f"{head}-{digest}"
