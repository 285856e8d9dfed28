"""A TrainJob's name fits its JobSet's pod names (config/trainjob_names.py): the one limit of
trainctl's --name, --resume-from and default name, the portal's name and the TrainJob stacks'
names; at the limit accepted, one more refused in one line."""

from __future__ import annotations

import re

import pytest

from config import trainjob_names as tn
from config.infra_models import TORCH_HF_RUNTIME
from config.run_config import JOB_MODELS, load_run, run_name
from config.schema import ConfigErrors
from k8s.builders import trainer_api
from trainctl import cli, code, objects
from trainctl.portal.submission import JobSpec, Problems, request_of
from workloads.builders import trainjobs as tj

DEV = "organization/training-platform/dev"
# JobSet v0.12.0 pkg/webhooks/jobset_webhook.go: validation.IsDNS1035Label of the longest pod name
_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def webhook_accepts(name: str, num_nodes: int, initializers: bool) -> bool:
    """The webhook's check written out: every replicated job's longest pod name
    ``<jobset>-<rjob>-<replicas-1>-<completions-1>-abcde`` is a label of at most 63 characters."""
    jobs = [(trainer_api.TRAINER_JOB, num_nodes)] + ([(trainer_api.DATASET_INITIALIZER, 1), (trainer_api.MODEL_INITIALIZER, 1)] if initializers else [])
    return all(len(pod) <= 63 and _LABEL.fullmatch(pod) for pod in (f"{name}-{job}-{1 - 1}-{count - 1}-abcde" for job, count in jobs))


def test_the_replicated_job_names_are_the_trainers():
    assert tn.TRAINER_JOB == trainer_api.TRAINER_JOB == "node"
    assert tn.INITIALIZER_JOBS == (trainer_api.DATASET_INITIALIZER, trainer_api.MODEL_INITIALIZER)


@pytest.mark.parametrize(("nodes", "initializers", "limit"), [(1, False, 48), (10, False, 48), (11, False, 47), (101, False, 46), (1000, False, 46), (1, True, 33), (1000, True, 33)])
def test_the_limit_is_the_webhooks_at_the_boundary(nodes, initializers, limit):
    assert tn.name_max(nodes, initializers=initializers) == limit
    assert webhook_accepts("a" * limit, nodes, initializers) and not webhook_accepts("a" * (limit + 1), nodes, initializers)
    assert tn.name_problem("a" * limit, nodes, initializers=initializers) is None
    why = tn.name_problem("a" * (limit + 1), nodes, initializers=initializers) or ""
    assert f"at most {limit} characters" in why and "must fit 63" in why and "\n" not in why


def _dry_run(capsys, proj, *flags: str) -> tuple[int, list[str], str]:
    rc = cli.main(["submit", "--dry-run", "-n", "vision", *flags, str(proj), "--", "python", "train.py"])
    out, err = capsys.readouterr()
    names = re.findall(r"^kind: TrainJob\n(?:.*\n)*?  name: (\S+)", out, re.M) if rc == 0 else []
    return rc, names, err


@pytest.fixture
def proj(tmp_path):
    d = tmp_path / "p"
    d.mkdir()
    (d / "train.py").write_text("print('hi')\n")
    return d


@pytest.mark.parametrize(("nodes", "limit"), [("1", 48), ("11", 47)])
def test_trainctl_name_at_the_limit_is_taken_one_more_is_one_line(capsys, proj, nodes, limit):
    rc, _, err = _dry_run(capsys, proj, "--nodes", nodes, "--name", "a" * limit)
    assert rc == 0, err
    rc, _, err = _dry_run(capsys, proj, "--nodes", nodes, "--name", "a" * (limit + 1))
    assert rc == 2 and err.count("\n") == 1 and f"--name '{'a' * (limit + 1)}'" in err and f"at most {limit} characters" in err


def test_resume_from_takes_the_longest_name_a_job_that_ran_can_have(capsys, proj):
    rc, _, err = _dry_run(capsys, proj, "--nodes", "1", "--name", "b", "--resume-from", "a" * 48)
    assert rc == 0, err
    rc, _, err = _dry_run(capsys, proj, "--nodes", "1", "--name", "b", "--resume-from", "a" * 49)
    assert rc == 2 and err.count("\n") == 1 and "--resume-from" in err and "at most 48 characters" in err


def test_a_default_name_from_a_long_directory_is_shortened_to_fit(tmp_path):
    names = []
    for tail in ("one", "two"):
        d = tmp_path / ("Experiment_" + "x" * 60 + tail)
        d.mkdir()
        (d / "t.py").write_text("")
        bundle = code.collect(d)
        for nodes in (1, 11, 1000):
            got = objects.default_name(bundle, nodes)
            assert len(got) == tn.name_max(nodes) and tn.name_problem(got, nodes) is None and got.startswith("experiment-xxx")
            assert objects.default_name(bundle, nodes) == got  # stable: a resubmit resumes
        names.append(objects.default_name(bundle, 1))
    assert names[0] != names[1]  # same start, different directories: different jobs


def test_default_names_of_ascii_directories_that_differ_only_in_what_a_label_drops_stay_apart():
    names = [tn.label_from(d, 48) for d in ("my_model", "my-model", "My.Model", "MY_MODEL", "my--model")]
    assert len(set(names)) == len(names) and names[1] == "my-model" and names[4] == "my--model"  # labels kept as they are
    assert all(re.fullmatch(r"my-model-[0-9a-f]{8}", n) for n in (names[0], names[2], names[3]))
    assert tn.label_from("my_model", 48) == names[0]  # stable: a resubmit resumes
    assert re.fullmatch(r"exp-[0-9a-f]{8}", tn.label_from("2024_exp", 48)) and tn.label_from("2024_exp", 48) != tn.label_from("exp", 48) == "exp"


def test_the_dry_runs_default_name_fits_its_node_count(capsys, tmp_path):
    d = tmp_path / ("z" * 70)
    d.mkdir()
    (d / "train.py").write_text("")
    rc, names, err = _dry_run(capsys, d, "--nodes", "11")
    assert rc == 0, err
    assert len(names) == 1 and len(names[0]) == 47 and webhook_accepts(names[0], 11, False)


def test_the_portal_refuses_a_name_one_past_the_limit_in_its_name_field():
    ok = JobSpec(namespace="vision", framework="pytorch", num_nodes=2, gpu_per_node=1, command="python train.py", name="a" * 48)
    assert request_of(ok, None).name == "a" * 48
    with pytest.raises(Problems) as err:
        request_of(JobSpec(namespace="vision", framework="pytorch", num_nodes=2, gpu_per_node=1, command="python train.py", name="a" * 49), None)
    assert [p["field"] for p in err.value.problems] == ["name"] and "at most 48 characters" in err.value.problems[0]["problem"]


def test_a_trainjob_stacks_name_fits_its_runtime_and_nodes():
    names = {k: w.name for k, w in tj.WORKLOADS.items()}
    assert JOB_MODELS["fsdp"].RUNTIME == TORCH_HF_RUNTIME and JOB_MODELS["ddp"].RUNTIME != TORCH_HF_RUNTIME
    for key, limit in (("ddp", 48), ("fsdp", 33)):  # fsdp's runtime has the initializers
        fits = "s" * (limit - len(names[key]) - 1)
        assert len(run_name(names[key], fits)) == limit and load_run({"platform": DEV, key: {"numNodes": 2}}, stack=fits, base_names=names).name == run_name(names[key], fits)
        with pytest.raises(ConfigErrors) as err:
            load_run({"platform": DEV, key: {"numNodes": 2}}, stack=fits + "s", base_names=names)
        assert err.value.keys == ["pulumi:stack"] and f"at most {limit} characters" in str(err.value)
    with pytest.raises(ConfigErrors):  # more nodes, a longer pod name
        load_run({"platform": DEV, "ddp": {"numNodes": 11}}, stack="s" * (48 - len(names["ddp"]) - 1), base_names=names)


def test_the_platforms_own_job_names_fit_at_the_most_nodes_allowed():
    for key, w in tj.WORKLOADS.items():
        most = JOB_MODELS[key].model_fields["num_nodes"].metadata
        le = next(m.le for m in most if hasattr(m, "le"))
        assert tn.name_problem(w.name, le, initializers=w.runtime == TORCH_HF_RUNTIME) is None, key
