"""The portal's submit form (trainctl/portal/form.py, pages.py, templates/submit.html): Clone & edit
carries everything of a job on both backends (the cluster's Portal, ``trainctl ui --local``'s
LocalPortal), and the clone posted back unchanged, as a browser posts it (text boxes with CRLF),
builds the same ConfigMap and TrainJob; the env and Secret reference boxes are judged by
config/job_env.py, code is required, requirements.txt is judged in its box, MPI is shown disabled
with its reason; every problem is tied to its control and listed in a summary that links to it;
/api/docs is served by the portal itself, and no page or asset of either mode references another origin."""

from __future__ import annotations

import html
import html.parser
import pathlib
import re
import shlex
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from kubernetes import client

import versions
from tests.test_portal import ALB_FORWARDED, ARN, PUB, TEAMS, alb_token
from trainctl import local, objects
from trainctl.code import collect
from trainctl.kube import ClusterError
from trainctl.portal import apidocs, form, service, submission
from trainctl.portal.app import Settings, create_app
from trainctl.portal.local_service import LocalPortal
from trainctl.portal.submission import MPI_REASON, code_bundle, request_of
from trainctl.ui import build_local
from workloads.builders.trainjobs import CODE_MOUNT

ROOT = pathlib.Path(__file__).resolve().parent.parent
PORT = 8767
TRAIN_PY = "\n# a blank first line (a textarea drops one leading line end unless the page writes one)\nimport sys\nprint('epochs', sys.argv[1:])\n"


class FormReader(html.parser.HTMLParser):
    """What a browser sends for a page's form: enabled named inputs (checked radios and checkboxes),
    selects (the selected option, else the first), textareas without the line end HTML drops after the tag, line ends as CRLF (HTML's submission)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.fields: list[tuple[str, str]] = []
        self.textarea: str | None = None
        self.text = ""
        self.controls: dict[str, dict[str, str | None]] = {}

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if (cid := a.get("id")) is not None:
            self.controls[cid] = a
        if tag == "input" and a.get("name") and "disabled" not in a and a.get("type") != "file":
            if a.get("type") in ("radio", "checkbox") and "checked" not in a:
                return
            self.fields.append((a["name"] or "", a.get("value") or ""))
        if tag == "textarea":
            self.textarea, self.text = a.get("name"), ""
        if tag == "select" and a.get("name") and "disabled" not in a:
            self.select: list[str | None] = [a["name"], None, None]  # name, first option, selected option
        if tag == "option" and getattr(self, "select", None):
            self.select[1] = self.select[1] if self.select[1] is not None else a.get("value") or ""
            self.select[2] = (a.get("value") or "") if "selected" in a else self.select[2]

    def handle_data(self, data):
        if self.textarea is not None:
            self.text += data

    def handle_endtag(self, tag):
        if tag == "select" and getattr(self, "select", None):
            name, first, chosen = self.select
            self.fields.append((name or "", chosen if chosen is not None else first or ""))
            self.select = []
        if tag == "textarea" and self.textarea is not None:
            text = self.text[1:] if self.text.startswith("\n") else self.text
            self.fields.append((self.textarea, text.replace("\r\n", "\n").replace("\n", "\r\n")))
            self.textarea = None


def read_form(page: str) -> FormReader:
    r = FormReader()
    r.feed(page)
    return r


def _code(tmp_path: pathlib.Path) -> pathlib.Path:
    d = tmp_path / "proj"
    (d / "conf").mkdir(parents=True)
    (d / "train.py").write_text(TRAIN_PY)
    (d / "conf" / "a.yaml").write_text("lr: 0.1\n")
    (d / "weights.bin").write_bytes(bytes(range(256)))
    (d / "requirements.txt").write_text("numpy==2.3.4\n")
    return d


def _request(namespace: str, **kw) -> objects.Request:
    given: dict[str, Any] = {"nodes": 2, "command": ["python", "train.py", "--epochs", "30", "--conf", "conf/a.yaml"], "gpus_per_node": 1, "instance_type": "g5.2xlarge",
                             "image": "123456789012.dkr.ecr.us-west-2.amazonaws.com/train:1.0", "name": "proj", "env": (("NCCL_DEBUG", "INFO"), ("WANDB_PROJECT", "mnist"))}
    return objects.Request(namespace=namespace, **{**given, **kw})


def _resubmitted(form: list[tuple[str, str]], name: str) -> dict[str, list[str]]:
    """The clone's form as posted, the job's name given (the original's, to compare whole objects)."""
    out: dict[str, list[str]] = {}
    for k, v in form:
        out.setdefault(k, []).append(name if k == "name" else v)
    return out


def _built(spec, parts, *, local_run: bool):
    req = request_of(spec, None, local=local_run)
    return objects.build(req, code_bundle(parts, req.name))


# --- the cluster's portal ------------------------------------------------------------------------------


class FakeKube:
    def __init__(self, objs: tuple[dict, dict], facts: dict | None = None):
        self.cm, self.tj = objs
        self.core = self
        self.facts = facts

    def platform_facts(self):
        return self.facts

    def list_trainjobs(self):
        return [self.tj]

    def all_workloads(self, all_namespaces=False):
        raise ClusterError("not allowed: no cluster in this test")

    def get_trainjob(self, name):
        assert name == self.tj["metadata"]["name"]
        return self.tj

    def read_namespaced_config_map(self, name, namespace):
        assert (name, namespace) == (self.cm["metadata"]["name"], "vision")
        return client.V1ConfigMap(data=self.cm.get("data"), binary_data=self.cm.get("binaryData"))


@pytest.fixture
def alb(monkeypatch):
    cfg = client.Configuration()
    cfg.host = "https://127.0.0.1:9"
    created: list = []
    monkeypatch.setattr(service.Portal, "create", lambda self, caller, spec, parts: created.append((spec, parts)) or {"trainjob": spec.name or "job"})
    app = create_app(cfg, Settings(mode="alb", region="us-west-2", signer=ARN, teams=TEAMS), alb_keys=lambda kid: PUB)
    c = TestClient(app, raise_server_exceptions=False, headers={**ALB_FORWARDED, "x-amzn-oidc-data": alb_token()})
    return c, created


def test_a_clone_of_a_cluster_job_carries_everything_and_resubmitted_builds_the_same_objects(alb, monkeypatch, tmp_path):
    c, created = alb
    original = objects.build(_request("vision", secret_env=(("WANDB_API_KEY", "wandb/api-key"),)), collect(_code(tmp_path)))
    monkeypatch.setattr(service.Portal, "kube", lambda self, caller, ns: FakeKube(original))
    page = c.get("/submit?clone=proj")
    assert page.status_code == 200, page.text
    form = read_form(page.text)
    fields = dict(form.fields)
    assert fields["command"] == "python train.py --epochs 30 --conf conf/a.yaml"
    assert fields["framework"] == "pytorch" and fields["num_nodes"] == "2" and fields["preset"] == "custom"
    assert (fields["gpu_per_node"], fields["cpu_per_node"], fields["memory_per_node"], fields["instance_type"]) == ("1", "5", "23", "g5.2xlarge")
    assert fields["image_choice"] == "custom" and fields["image"].endswith("/train:1.0")
    assert fields["training_code"] == TRAIN_PY.replace("\n", "\r\n") and fields["requirements"] == "numpy==2.3.4\r\n"
    assert fields["env"] == "NCCL_DEBUG=INFO\r\nWANDB_PROJECT=mnist" and fields["secret_env"] == "WANDB_API_KEY=wandb/api-key"
    assert "conf/a.yaml" in page.text and "weights.bin" in page.text and fields["keep_carried"] == "1"
    assert "the Secrets' values are not" in html.unescape(page.text)  # what cannot be carried is said
    r = c.post("/submit", data=_resubmitted(form.fields, "proj"), follow_redirects=False)
    assert r.status_code == 303, r.text
    (spec, parts), = created
    assert sorted(p.name for p in parts) == ["conf/a.yaml", "requirements.txt", "train.py", "weights.bin"]
    assert _built(spec, parts, local_run=False) == original


def test_a_clone_whose_code_is_gone_says_so_and_the_form_stays_usable(alb, monkeypatch, tmp_path):
    c, _ = alb
    cm, tj = objects.build(_request("vision"), collect(_code(tmp_path)))

    class Gone(FakeKube):
        def read_namespaced_config_map(self, name, namespace):
            raise client.ApiException(status=404)

    monkeypatch.setattr(service.Portal, "kube", lambda self, caller, ns: Gone((cm, tj)))
    page = c.get("/submit?clone=proj").text
    assert f"its code ConfigMap {cm['metadata']['name']} could not be read (HTTP 404)" in page
    assert dict(read_form(page).fields)["command"] == "python train.py --epochs 30 --conf conf/a.yaml"


# --- trainctl ui --local --------------------------------------------------------------------------------


@pytest.fixture
def ui(tmp_path, monkeypatch):
    monkeypatch.setenv(local.HOME_ENV, str(tmp_path / "state"))
    created: list = []
    monkeypatch.setattr(LocalPortal, "create", lambda self, caller, spec, parts: created.append((spec, parts)) or {"trainjob": spec.name or "job"})
    app, _ = build_local(PORT)
    with TestClient(app, base_url=f"http://127.0.0.1:{PORT}") as c:
        yield c, created


def test_a_clone_of_a_local_job_carries_everything_and_resubmitted_builds_the_same_objects(ui, tmp_path):
    c, created = ui
    original = objects.build(_request("local", nodes=1, local=True, image=None), collect(_code(tmp_path)))
    d = local.job_dir("proj")
    d.mkdir(parents=True)
    (d / "objects.yaml").write_text(yaml.safe_dump_all(list(original), sort_keys=False))  # as trainctl submit --local writes it
    page = c.get("/submit?clone=proj").text
    form = read_form(page)
    fields = dict(form.fields)
    assert fields["command"] == "python train.py --epochs 30 --conf conf/a.yaml" and fields["image_choice"] == "builtin" and fields["secret_env"] == ""
    r = c.post("/submit", data=_resubmitted(form.fields, "proj"), follow_redirects=False)
    assert r.status_code == 303, r.text
    (spec, parts), = created
    assert _built(spec, parts, local_run=True) == original


@pytest.mark.parametrize("runtime,command", [
    ("torch", ["python", "train.py", "--epochs", "30"]), ("torch", ["python", "-m", "pkg.main", "--x=1"]), ("torch", ["bash", "run.sh", "a b"]),
    ("torch", ["torchrun", "--nproc-per-node", "2", "train.py"]), ("torch", ["python3", "-u", "train.py"]), ("tensorflow", ["python", "train.py", "--steps", "5"]),
    ("torch", ["python", "/opt/elsewhere/train.py"]),
])
def test_the_command_of_a_built_job_is_given_back_and_builds_the_same_entry(tmp_path, runtime, command):
    d = _code(tmp_path)
    (d / "run.sh").write_text("python3 train.py\n")
    (d / "pkg").mkdir()
    (d / "pkg" / "main.py").write_text("print(1)\n")
    bundle = collect(d)
    req = _request("vision", runtime=runtime, command=command)
    _, tj = objects.build(req, bundle)
    back = objects.command_of(tj, set(bundle.paths))
    assert back is not None and not any(a.startswith(CODE_MOUNT) for a in back if a != "/opt/elsewhere/train.py")
    assert objects.entry(req, bundle) == objects.entry(_request("vision", runtime=runtime, command=shlex.split(shlex.join(back))), bundle)


# --- the form's rules -------------------------------------------------------------------------------------


def _post(c, page: str, **changes: str):
    fields = dict(read_form(page).fields)
    fields.update(changes)
    return c.post("/submit", data=fields, follow_redirects=False)


def _problems(text: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for field, problem in re.findall(r'<span class="field-error" id="error-\d+" data-field="([^"]+)">([^<]*)</span>', text):
        found.setdefault(field, []).append(html.unescape(problem))
    return found


def test_an_empty_code_box_without_files_is_refused_with_a_field_error(ui):
    c, created = ui
    r = _post(c, c.get("/submit").text, training_code="  \r\n", requirements="numpy==2.3.4")
    assert r.status_code == 422 and not created
    assert list(_problems(r.text)) == ["training_code"] and "required" in _problems(r.text)["training_code"][0]
    # the upload source without files, and files chosen while the source is the pasted code: never dropped unsaid
    r = _post(c, c.get("/submit").text, code_source="upload")
    assert r.status_code == 422 and "required" in _problems(r.text)["files"][0]
    fields = dict(read_form(c.get("/submit").text).fields)
    r = c.post("/submit", data=fields, files={"files": ("extra.py", b"print(1)\n")}, follow_redirects=False)
    assert r.status_code == 422 and "choose 'Upload'" in _problems(r.text)["files"][0] and not created


def test_env_and_secret_boxes_follow_trainctls_rules_every_problem_at_once(alb):
    c, created = alb
    page = c.get("/submit").text
    r = _post(c, page, env="PATH=/nonexistent\r\nno equals sign\r\nA=1\r\nA=2\r\nDB_PASSWORD=hunter2hunter2\r\n", secret_env="WANDB_API_KEY=not a reference\r\nA=wandb/key",
              num_nodes="0")
    assert r.status_code == 422 and not created
    found = _problems(r.text)
    assert set(found) == {"env", "secret_env", "config.num_nodes"}
    env = " | ".join(found["env"])
    assert "PATH: the job's start depends on it" in env and "entry 2: allowed: NAME=VALUE" in env and "A: given twice" in env and "DB_PASSWORD: the value looks like a secret" in env
    assert "hunter2" not in r.text.split("<form", 1)[0] and "hunter2" not in " ".join(sum(found.values(), []))  # a value is never in a message
    assert any("WANDB_API_KEY: not a Secret reference" in p for p in found["secret_env"]) and any("A: also in env" in p for p in found["secret_env"])
    # the same rules trainctl applies (config/job_env.py): the same lines, its flags' names left off
    assert {p for p in found["env"]} >= {line.split(" ", 1)[1] for line in objects.env_problems(objects.Request(namespace="vision", nodes=1, command=["x"], env=(("PATH", "/nonexistent"),)))}


def test_a_local_portal_refuses_secret_references_as_trainctl_submit_local_does(ui):
    c, created = ui
    r = _post(c, c.get("/submit").text, secret_env="WANDB_API_KEY=wandb/api-key")
    assert r.status_code == 422 and not created and "reads no cluster Secrets" in _problems(r.text)["secret_env"][0]


def test_requirements_are_judged_in_their_box(ui):
    c, created = ui
    r = _post(c, c.get("/submit").text, requirements="numpy==2.3.4\r\n--index-url https://user:pw@example.com/simple\r\n")
    assert r.status_code == 422 and not created
    assert list(_problems(r.text)) == ["requirements"] and "line 2: holds a credential" in _problems(r.text)["requirements"][0] and "pw@" not in _problems(r.text)["requirements"][0]
    r = _post(c, c.get("/submit").text, requirements="numpy==2.3.4\r\n")
    assert r.status_code == 303
    (spec, parts), = created
    assert {p.name: p.data for p in parts} == {"requirements.txt": b"numpy==2.3.4\n", "train.py": form.EXAMPLE.encode()}


def test_mpi_is_shown_disabled_with_its_reason_and_refused_if_posted(alb):
    c, created = alb
    page = c.get("/submit").text
    mpi = read_form(page).controls["framework-mpi"]
    assert "disabled" in mpi and mpi["aria-describedby"] == "framework-mpi-why"
    assert re.search(r'<p class="hint" id="framework-mpi-why">[^<]*no MPI runtime', page)
    offered = [k for k, a in read_form(page).controls.items() if a.get("name") == "framework" and "disabled" not in a]
    assert offered == ["framework-pytorch", "framework-tensorflow"] and {submission.FRAMEWORKS[f.split("-")[1]] for f in offered} == set(objects.RUNTIMES)
    r = _post(c, page, framework="mpi")
    assert r.status_code == 422 and not created and MPI_REASON in _problems(r.text)["framework"][0]


def test_every_control_has_a_label_and_each_problem_is_tied_to_its_control_and_listed(alb):
    c, _ = alb
    page = c.get("/submit").text
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in page
    form = read_form(page)
    labelled = set(re.findall(r'<label for="([^"]+)"', page))
    for cid, a in form.controls.items():
        if a.get("name") and a.get("type") != "hidden" and cid not in labelled:  # else the control sits inside its label
            assert re.search(rf'<label class="choice"><input [^>]*id="{re.escape(cid)}"', page), cid
    r = _post(c, page, num_nodes="0", preset="custom", gpu_per_node="lots", image_choice="custom", image="not an image", env="1BAD=x")
    assert r.status_code == 422
    errors = re.findall(r'<span class="field-error" id="(error-\d+)" data-field="([^"]+)">', r.text)
    controls = read_form(r.text).controls
    summary = r.text.split('id="problems-summary"', 1)[1].split("</div>", 1)[0]
    assert len(errors) == 4
    for eid, field in errors:
        target = {"config.num_nodes": "num_nodes", "config.gpu_per_node": "gpu_per_node", "image": "image", "env": "env"}[field]
        assert eid in (controls[target].get("aria-describedby") or "").split() and controls[target].get("aria-invalid") == "true"
        assert f'href="#{target}"' in summary


# --- /api/docs and other origins ----------------------------------------------------------------------------


def test_the_api_docs_are_the_portals_own_files_of_the_pinned_swagger_ui(alb):
    c, _ = alb
    bundle = (apidocs.dist() / "swagger-ui-bundle.js").read_text()
    assert re.findall(r'"(\d+\.\d+\.\d+)",GIT_COMMIT:', bundle) == [versions.PORTAL_SWAGGER_UI_VERSION]  # the release versions.py names
    r = c.get("/api/docs")
    assert r.status_code == 200 and "default-src 'self'" in r.headers["content-security-policy"] and "script-src" not in r.headers["content-security-policy"]
    assert "<script>" not in r.text  # no inline script: the CSP allows none
    for src in re.findall(r'(?:src|href)="([^"]+)"', r.text):
        asset = c.get(src)
        assert asset.status_code == 200 and len(asset.content) > 100, src
    assert c.get("/static/swagger-ui/main.py").status_code == 404  # only the files the page loads
    pins = [line for f in ("requirements.txt", "portal/requirements.txt", "pyproject.toml") for line in (ROOT / f).read_text().splitlines() if "fastapi-swagger" in line]
    assert len(pins) == 3 and all("fastapi-swagger==0.4.64" in line for line in pins)


OTHER_ORIGIN = [re.compile(p, re.I) for p in (
    r"""\b(?:src|href|action|poster|srcset)\s*[=:]\s*["']?\s*(?:[a-z][a-z0-9+.-]*:)?//""",  # an attribute (or a script's property) naming another host
    r"""(?<![A-Za-z])(?-i:url)\(\s*["']?\s*(?:[a-z][a-z0-9+.-]*:)?//""",  # CSS (a script's URL("http://a") of core-js's feature test loads nothing)
    r"""@import\s+["']?\s*(?:[a-z][a-z0-9+.-]*:)?//""",
)]
OWN_FILES_ORIGIN = re.compile(r"""["'(]\s*(?:https?:)?//[a-z0-9.-]+""", re.I)  # the portal's own scripts and styles name no host at all


def _crawl(c) -> dict[str, str]:
    """Every page reachable from the portal's pages and /api/docs, and every asset they load or the static directory holds."""
    seen: dict[str, str] = {}
    todo = ["/", "/submit", "/team", "/api/docs", "/submit?clone=proj"] + [f"/static/{p.name}" for p in (ROOT / "trainctl/portal/static").iterdir()]
    todo += [f"/static/swagger-ui/{name}" for name in apidocs.ASSETS]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        r = c.get(path)
        text = r.text if "image" not in r.headers.get("content-type", "") else ""
        seen[path] = text
        for ref in re.findall(r"""(?:src|href)="(/[^"/][^"]*|/)\"""", text):
            if not ref.startswith("/api/trainjob"):
                todo.append(ref.split("#")[0] or "/")
    return seen


@pytest.mark.parametrize("mode", ["alb", "local"])
def test_no_page_or_asset_of_the_portal_references_another_origin(mode, alb, ui, monkeypatch, tmp_path):
    original = objects.build(_request("vision" if mode == "alb" else "local", local=mode == "local"), collect(_code(tmp_path)))
    if mode == "alb":
        c, _ = alb
        monkeypatch.setattr(service.Portal, "kube", lambda self, caller, ns: FakeKube(original))
    else:
        c, _ = ui
        d = local.job_dir("proj")
        d.mkdir(parents=True)
        (d / "objects.yaml").write_text(yaml.safe_dump_all(list(original), sort_keys=False))
    seen = _crawl(c)
    assert {"/", "/submit", "/api/docs", "/static/form.js", "/static/swagger-ui/swagger-ui-bundle.js", "/static/swagger-ui/swagger-ui.css"} <= set(seen)
    for path, text in seen.items():
        for pattern in OTHER_ORIGIN:
            assert not pattern.search(text), (path, pattern.search(text))
        if path.startswith("/static/") and not path.startswith("/static/swagger-ui/"):
            assert not OWN_FILES_ORIGIN.search(text), (path, OWN_FILES_ORIGIN.search(text))
    templates = ROOT / "trainctl/portal/templates"
    for f in templates.iterdir():  # every template, whether a crawl reached it or not
        assert not any(p.search(f.read_text()) for p in OTHER_ORIGIN), f


def test_the_crawl_finds_another_origin_where_there_is_one():
    for bad in ('<script src="https://cdn.jsdelivr.net/npm/swagger-ui-dist@5/swagger-ui-bundle.js">', '<link href="//cdn.example.com/a.css">', "a { background: url( 'https://x.example/a.png') }",
                "@import 'http://fonts.example.com/f.css';", 'e.src = "https://tracker.example/p.gif"'):
        assert any(p.search(bad) for p in OTHER_ORIGIN), bad
    for fine in ('<script src="/static/form.js">', '<a href="/jobs/x">', "url(data:image/svg+xml;base64,AAAA)", '<a href="#num_nodes">'):
        assert not any(p.search(fine) for p in OTHER_ORIGIN), fine
