"""Every image the stack pushes (the training image, the portal's, the mirrored copies) follows one
rule: the registry is asked at deploy, a tag it holds is used by its digest and never built or pushed
again (ECR refuses a second push to an IMMUTABLE tag), and tags do not depend on the deployer's machine."""

from __future__ import annotations

import copy
import json
import os
import pathlib
import shutil
import stat

import pytest

from infra import deploy_state, registry
from k8s import portal as portal_component
from tests.conftest import PROJECT, dev_config, stack_file
from tests.e2e.portal_helpers import PORTAL
from tools.mock_runtime import run_program

BUILD, INDEX = "docker-build:index:Image", "docker-build:index:Index"
HELD = "sha256:" + "ab" * 32


def _copy_context(tmp_path: pathlib.Path) -> pathlib.Path:
    ctx = tmp_path / "somewhere" / "else" / "workloads"
    shutil.copytree(PROJECT / "workloads", ctx, ignore=shutil.ignore_patterns("__pycache__"))
    return ctx


def test_the_tag_does_not_depend_on_the_deployers_umask_or_checkout_path(tmp_path):
    ctx = _copy_context(tmp_path)
    tag = registry.image_tag(ctx)
    assert tag == registry.image_tag(PROJECT / "workloads"), "another checkout path, the same tag"
    for f in ctx.rglob("*"):  # a deployer with umask 002 (group-writable files), and a private checkout's 600 files
        if f.is_file():
            f.chmod(0o664)
    assert registry.image_tag(ctx) == tag
    (ctx / "requirements.txt").chmod(0o600)
    assert registry.image_tag(ctx) == tag
    (ctx / "requirements.txt").chmod(0o700)
    assert registry.image_tag(ctx) != tag, "the executable bit is kept by COPY: a new image"


def test_portable_modes_are_gits_two_file_modes():
    assert registry.portable_mode(stat.S_IFREG | 0o664) == registry.portable_mode(stat.S_IFREG | 0o600) == "-rw-r--r--"
    assert registry.portable_mode(stat.S_IFREG | 0o775) == registry.portable_mode(stat.S_IFREG | 0o700) == "-rwxr-xr-x"
    assert registry.portable_mode(stat.S_IFLNK | 0o755) == "Lrwxrwxrwx"


RETAINED = {deploy_state.parameter_name("training-dev", f"{deploy_state.RETAINED_BUILDS}-workloads"): "true"}


def _dev(ssm=RETAINED, **registry_images):
    return run_program(str(PROJECT), "dev", stack_config={"config": dev_config()}, registry_images=registry_images, ssm_parameters=ssm)


def test_a_tag_the_registry_holds_is_used_by_its_digest_and_nothing_is_built():
    first = _dev()
    build = first.one(BUILD)
    assert build.retain_on_delete, "the provider's Image.Delete deletes the pushed digest: a build leaving the program must not"
    repo = first.one("aws:ecr/repository:Repository", "workloads")
    name, url = repo.inputs["name"], repo.state["repositoryUrl"]
    # the second deploy (from any machine, or after a revert of the image's inputs): the tag is there
    again = _dev(**{name: {registry.image_tag(): HELD, "0" * 20: "sha256:" + "cd" * 32}})
    assert not again.by_type(BUILD), "a held tag is built and pushed again, and ECR refuses the push"
    assert again.outputs["trainingImage"] == f"{url}@{HELD}"
    jobs = [r for r in again.registrations if r.type.endswith(":TrainJob")]
    assert jobs and all(j.inputs["spec"]["trainer"]["image"] == f"{url}@{HELD}" for j in jobs if "image" not in (j.inputs["spec"]["trainer"] or {}) or url in j.inputs["spec"]["trainer"]["image"])
    # a repository that exists but does not hold this tag (the inputs changed): built and pushed
    changed = _dev(**{name: {"0" * 20: "sha256:" + "cd" * 32}})
    assert changed.one(BUILD).inputs["tags"] == [f"{url}:{registry.image_tag()}"]
    # every deploy records, after the build, that the state's build is retained
    (param,) = [p for p in first.by_type("aws:ssm/parameter:Parameter") if p.inputs["name"] in RETAINED]
    assert param.inputs["type"] == "String" and first.one(BUILD).urn in param.depends_on


def test_a_stack_whose_build_is_not_yet_retained_keeps_it_registered_until_it_is():
    """A stack deployed before builds were retain_on_delete: dropping its build from the program
    would make the provider delete the pushed digest (Image.Delete), so the first deploy keeps the
    build (unchanged inputs: nothing pushed) and records that it is now retained."""
    first = _dev()
    name = first.one("aws:ecr/repository:Repository", "workloads").inputs["name"]
    held = {name: {registry.image_tag(): HELD}}
    before = _dev(ssm={}, **held)
    build = before.one(BUILD)
    assert build.retain_on_delete and build.inputs["tags"][0].endswith(":" + registry.image_tag())
    assert not _dev(**held).by_type(BUILD)


def test_the_current_tag_never_expires_under_the_lifecycle_policy():
    run = _dev()
    policy = json.loads(run.one("aws:ecr/lifecyclePolicy:LifecyclePolicy", "workloads").inputs["policy"])
    first, *rest = sorted(policy["rules"], key=lambda r: r["rulePriority"])
    assert first["selection"] == {"tagStatus": "tagged", "tagPatternList": [registry.image_tag()], "countType": "imageCountMoreThan", "countNumber": 1}
    assert rest[-1]["selection"]["tagStatus"] == "any"  # ECR: the rule of tagStatus any is evaluated last


def test_a_mirrored_pin_the_registry_holds_is_not_copied_again():
    first = _dev()
    copies = first.by_type(INDEX)
    assert copies and all(c.retain_on_delete for c in copies)
    held, refs = {}, {}
    for c in copies:
        upstream = c.inputs["sources"][0]
        repo_name = registry.mirror_repository_name("training-dev", upstream)
        tag = upstream.rsplit(":", 1)[1]
        held[repo_name] = {tag: HELD}
        refs[upstream] = c.inputs["tag"] + "@" + HELD
    again = run_program(str(PROJECT), "dev", stack_config={"config": dev_config()}, registry_images=held)
    assert not again.by_type(INDEX), "a pin going A -> B -> A copies A again, which ECR refuses"
    rendered = str([r.inputs for r in again.registrations])
    assert all(ref in rendered for ref in refs.values())


def _teams_cluster() -> str:
    return stack_file("teams")["config"]["training-platform:cluster"].get("name") or "training-platform-teams"


def _portal_stack(ssm=None, **registry_images):
    stack = copy.deepcopy(stack_file("teams"))
    stack["config"]["training-platform:portal"] = copy.deepcopy(PORTAL)
    return run_program(str(PROJECT), "teams", stack_config=stack, registry_images=registry_images, ssm_parameters=ssm)


def test_the_portals_image_follows_the_same_rule():
    first = _portal_stack()
    builds = [b for b in first.by_type(BUILD) if b.name == "portal-image"]
    assert len(builds) == 1 and builds[0].retain_on_delete
    repo = first.one("aws:ecr/repository:Repository", "portal-image")
    assert repo.inputs["name"] == portal_component.portal_repository_name(_teams_cluster()) == f"{_teams_cluster()}/portal"  # the name it always had
    assert builds[0].inputs["tags"] == [f"{repo.state['repositoryUrl']}:{portal_component.image_tag()}"]
    again = _portal_stack(ssm={deploy_state.parameter_name(_teams_cluster(), f"{deploy_state.RETAINED_BUILDS}-portal"): "true"},
                          **{repo.inputs["name"]: {portal_component.image_tag(): HELD}})
    assert not [b for b in again.by_type(BUILD) if b.name == "portal-image"]
    deployments = [r for r in again.registrations if r.type.endswith(":Deployment") and "portal" in r.name]
    assert any(f"{repo.state['repositoryUrl']}@{HELD}" in str(d.inputs) for d in deployments)


def test_the_portal_tag_ignores_modes_the_umask_decides(tmp_path, monkeypatch):
    tag = portal_component.image_tag()
    project = tmp_path / "p"
    shutil.copytree(PROJECT / "portal", project / "portal")
    shutil.copytree(PROJECT / "trainctl", project / "trainctl", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for extra in ("config", "k8s", "workloads", "versions.py", "pyproject.toml", "setup.py", "README.md"):
        src = PROJECT / extra
        if src.is_dir():
            shutil.copytree(src, project / extra, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        elif src.exists():
            shutil.copy(src, project / extra)
    for root, _dirs, files in os.walk(project):
        for f in files:
            p = pathlib.Path(root, f)
            p.chmod((p.stat().st_mode & 0o100) | 0o664)  # umask 002
    monkeypatch.setattr(portal_component, "PROJECT_DIR", project)
    assert portal_component.image_tag() == tag


def test_only_a_missing_repository_means_nothing_is_held(monkeypatch):
    class Boom(Exception):
        pass

    class Found:
        def __init__(self, names):
            self.names = names

    def denied(**_kw):
        raise Boom("reading ECR Images: AccessDeniedException: not authorized to perform: ecr:ListImages")

    monkeypatch.setattr(registry.aws.ecr, "get_repositories", lambda **_kw: Found(["other"]))
    monkeypatch.setattr(registry.aws.ecr, "get_images", denied)
    assert registry.held_tags("x", None) == {}  # pyright: ignore[reportArgumentType]  (not there: nothing held, the images never read)
    monkeypatch.setattr(registry.aws.ecr, "get_repositories", lambda **_kw: Found(["other", "x"]))
    with pytest.raises(Boom):  # never taken as "nothing held": the build would push over a held tag
        registry.held_tags("x", None)  # pyright: ignore[reportArgumentType]
