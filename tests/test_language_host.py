"""Our Python language host (tools/engine/language_host.py) over gRPC, started as the engine starts it:
its plugin info, the packages of this project, and Run of small programs against a resource monitor
and engine served here (no Pulumi CLI needed)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import threading
from concurrent import futures

import grpc
import pytest
from google.protobuf import empty_pb2, struct_pb2
from pulumi.runtime.proto import engine_pb2, engine_pb2_grpc, language_pb2, language_pb2_grpc, resource_pb2, resource_pb2_grpc

import versions
from tools.engine import build as engine
from tools.engine.language_host import plugin_version

PROJECT = pathlib.Path(__file__).resolve().parent.parent
HOST = PROJECT / "tools" / "engine" / "pulumi-language-python"


class Monitor(resource_pb2_grpc.ResourceMonitorServicer):
    """Records what a program registers; supports no optional feature."""

    def __init__(self):
        self.registered: list[tuple[str, str]] = []
        self.outputs: dict[str, dict] = {}

    def SupportsFeature(self, request, context):
        return resource_pb2.SupportsFeatureResponse(hasSupport=False)

    def RegisterResource(self, request, context):
        self.registered.append((request.type, request.name))
        urn = f"urn:pulumi:test::tiny::{request.type}::{request.name}"
        return resource_pb2.RegisterResourceResponse(urn=urn, object=struct_pb2.Struct())

    def RegisterResourceOutputs(self, request, context):
        self.outputs[request.urn] = json.loads(json.dumps(dict(request.outputs)))
        return empty_pb2.Empty()


class Engine(engine_pb2_grpc.EngineServicer):
    def __init__(self):
        self.root = ""
        self.logs: list[str] = []

    def Log(self, request, context):
        self.logs.append(request.message)
        return empty_pb2.Empty()

    def GetRootResource(self, request, context):
        return engine_pb2.GetRootResourceResponse(urn=self.root)

    def SetRootResource(self, request, context):
        self.root = request.urn
        return engine_pb2.SetRootResourceResponse()


@pytest.fixture
def served():
    """A resource monitor and an engine on local ports."""
    monitor, eng = Monitor(), Engine()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    resource_pb2_grpc.add_ResourceMonitorServicer_to_server(monitor, server)
    engine_pb2_grpc.add_EngineServicer_to_server(eng, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", monitor, eng
    server.stop(0)


@pytest.fixture
def host(tmp_path):
    """Our host started as the engine starts it: the port on its first stdout line; the exec script
    beside it (a plugin directory of links, as make engine-build installs it)."""
    plugin_dir = tmp_path / "language-python"
    plugin_dir.mkdir()
    (plugin_dir / "pulumi-language-python").symlink_to(HOST)
    (plugin_dir / "pulumi-language-python-exec").symlink_to(engine.exec_script())
    env = {**os.environ, "PULUMI_LANGUAGE_PYTHON_HOST_PYTHON": sys.executable}
    proc = subprocess.Popen([str(plugin_dir / "pulumi-language-python")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    assert proc.stdout is not None
    port = proc.stdout.readline().strip()
    assert port.isdigit(), proc.stderr.read() if proc.stderr else ""
    output: list[str] = []
    for stream in (proc.stdout, proc.stderr):  # what the engine would forward: the program's output
        threading.Thread(target=output.extend, args=(stream,), daemon=True).start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield language_pb2_grpc.LanguageRuntimeStub(channel), output
    channel.close()
    proc.terminate()
    proc.wait(10)


def info(root: pathlib.Path, **options) -> language_pb2.ProgramInfo:
    opts = struct_pb2.Struct()
    opts.update(options)
    return language_pb2.ProgramInfo(root_directory=str(root), program_directory=str(root), entry_point=".", options=opts)


def test_plugin_info_is_the_cli_release_it_pairs_with(host):
    stub, _ = host
    assert stub.GetPluginInfo(empty_pb2.Empty()).version == versions.PULUMI_CLI_VERSION.removeprefix("v")


def test_required_packages_of_this_project_are_its_pulumi_sdks_at_their_plugin_versions(host):
    stub, _ = host
    got = stub.GetRequiredPackages(language_pb2.GetRequiredPackagesRequest(info=info(PROJECT, virtualenv=".venv")))
    by_name = {p.name: p for p in got.packages}
    pinned = {line.split("==")[0]: line.split("==")[1] for line in (PROJECT / "requirements.txt").read_text().split() if line.startswith("pulumi-")}
    for dist, version in pinned.items():
        name = dist.removeprefix("pulumi-")
        assert by_name[name].version == "v" + version, name
        assert by_name[name].kind == "resource"
    assert by_name["kubernetes"].version == "v" + engine.sdk_plugin_version("pulumi_kubernetes")
    assert "pulumi" not in by_name and "policy" not in by_name  # the core SDK has resource: false


def test_program_dependencies_list_the_top_level_ones_unless_transitive(host):
    stub, _ = host
    top = stub.GetProgramDependencies(language_pb2.GetProgramDependenciesRequest(info=info(PROJECT, virtualenv=".venv")))
    every = stub.GetProgramDependencies(language_pb2.GetProgramDependenciesRequest(info=info(PROJECT, virtualenv=".venv"), transitiveDependencies=True))
    top_names = {d.name for d in top.dependencies}
    every_names = {d.name for d in every.dependencies}
    assert "pulumi-eks" in top_names and top_names < every_names
    assert "grpcio" in every_names and "grpcio" not in top_names  # pulumi requires it


@pytest.mark.parametrize(
    ("package", "plugin"),
    [("4.34", "4.34.0"), ("1.2.3a4", "1.2.3-alpha.4"), ("1.2.3rc4", "1.2.3-rc.4"), ("1.2.3.post4", "1.2.3+post4"), ("1.2.3.post4.dev5", "1.2.3+post4dev5"), ("1!2.0", None)],
)
def test_package_versions_become_plugin_versions(package, plugin):
    assert plugin_version(package) == plugin


TINY = """
import pulumi

class Box(pulumi.ComponentResource):
    def __init__(self, name, opts=None):
        super().__init__("tiny:index:Box", name, None, opts)
        self.register_outputs({})

config = pulumi.Config()
box = Box("box-" + config.require("size"))
pulumi.export("size", config.require_int("size") * 2)
"""


def _run(stub, address: str, program: pathlib.Path, config: dict[str, str]) -> language_pb2.RunResponse:
    return stub.Run(
        language_pb2.RunRequest(project="tiny", stack="test", pwd=str(program), monitor_address=address, config=config, dryRun=True, parallel=4, info=info(program, virtualenv=sys.prefix)),
        timeout=120,
    )


def _program(tmp_path: pathlib.Path, source: str) -> pathlib.Path:
    program = tmp_path / "tiny"
    program.mkdir(parents=True)
    (program / "__main__.py").write_text(source)
    return program


def test_run_executes_the_program_against_the_monitor_with_its_config(host, served, tmp_path):
    stub, _ = host
    address, monitor, _ = served
    response = _run(stub, address, _program(tmp_path, TINY), {"tiny:size": "3"})
    assert (response.error, response.bail) == ("", False), "".join(host[1])
    assert ("tiny:index:Box", "box-3") in monitor.registered
    assert ("pulumi:pulumi:Stack", "tiny-test") in monitor.registered
    assert {"size": 6} in monitor.outputs.values()


def test_a_missing_config_key_is_one_logged_error_and_exit_code_1(host, served, tmp_path):
    """The exec script logs a RunError (a missing key) through the engine and exits 1; an unhandled
    exception it logs with the user's traceback and exits 32 (bail: nothing more to print)."""
    stub, output = host
    address, _, eng = served
    stub.Handshake(language_pb2.LanguageHandshakeRequest(engine_address=address))
    response = _run(stub, address, _program(tmp_path, TINY), {})
    assert (response.error, response.bail) == ("program exited with non-zero exit code: 1", False)
    assert [m for m in eng.logs if "tiny:size" in m] == ["Missing required configuration variable 'tiny:size'\n\tplease set a value using the command `pulumi config set tiny:size <value>`"]
    assert "Traceback" not in "".join(eng.logs + output)
    response = _run(stub, address, _program(tmp_path / "raises", "raise ValueError('no')\n"), {})
    assert (response.error, response.bail) == ("", True)
    assert any("ValueError: no" in m for m in eng.logs)


def test_a_program_that_exits_nonzero_is_an_error_with_its_code(host, served, tmp_path):
    stub, _ = host
    address, _, _ = served
    response = _run(stub, address, _program(tmp_path, "import sys\nsys.exit(3)\n"), {})
    assert response.error == "program exited with non-zero exit code: 3"


def test_a_missing_virtualenv_is_an_rpc_error_naming_it(host, served, tmp_path):
    stub, _ = host
    program = _program(tmp_path, TINY)
    with pytest.raises(grpc.RpcError) as err:
        stub.Run(language_pb2.RunRequest(project="tiny", stack="test", pwd=str(program), monitor_address=served[0], info=info(program, virtualenv="venv")))
    assert "'virtualenv' option in Pulumi.yaml is set to 'venv'" in err.value.details()
    assert "doesn't exist" in err.value.details()


def test_code_generation_is_not_served(host):
    stub, _ = host
    with pytest.raises(grpc.RpcError) as err:
        stub.GenerateProject(language_pb2.GenerateProjectRequest())
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    with pytest.raises(grpc.RpcError) as err:
        stub.GetRequiredPlugins(language_pb2.GetRequiredPluginsRequest())
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
