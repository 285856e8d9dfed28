"""Our Pulumi language host for Python programs (the engine's ``pulumi-language-python``).

The engine starts it as ``pulumi-language-python [--logtostderr] [-v=N] [--tracing URL] <engine address>``,
reads the port it serves the LanguageRuntime gRPC service on from its first line of stdout, and forwards
everything it prints after that as the program's output. ``Run`` starts the SDK's
``pulumi-language-python-exec`` script (found next to this host, or given with ``-use-executor``) with the
program's virtualenv's Python, as the Go host of the same CLI release does; the RPCs the engine needs for
``preview``/``up``/``destroy`` and ``about`` are served, code generation and packaging answer UNIMPLEMENTED.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent import futures

import grpc
from google.protobuf import empty_pb2
from pulumi.runtime.proto import language_pb2, language_pb2_grpc, plugin_pb2

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent.parent))
import versions  # noqa: E402  (the repository root, whichever directory the engine starts us in)

EXEC_SCRIPT = "pulumi-language-python-exec"
# the exec script exits with this code after printing an error the user can act on: the engine then
# shows no further "program exited" error (RunResponse.bail)
EXIT_USER_ACTIONABLE = 32
PACKAGES_WITHOUT_PLUGINS = {"pulumi-policy", "pulumi-esc-sdk"}
GRPC_OPTIONS = [("grpc.max_receive_message_length", 400 * 1024 * 1024), ("grpc.max_send_message_length", 400 * 1024 * 1024)]

# Run inside the program's Python: every installed distribution, whether the top-level package of each
# ships a pulumi-plugin.json, and what each requires (for the "not required by another" listing).
LIST_PACKAGES = r"""
import importlib.metadata as md, json, os, re
out = []
for dist in md.distributions():
    name = dist.metadata["Name"]
    if not name:
        continue
    canonical = re.sub(r"[-_.]+", "-", name).lower()
    plugin = None
    for top in (dist.read_text("top_level.txt") or "").split() or [name.replace("-", "_")]:
        candidate = dist.locate_file(os.path.join(top, "pulumi-plugin.json"))
        if os.path.isfile(candidate):
            with open(candidate) as fh:
                plugin = json.load(fh)
            break
    requires = [re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", r).group(0)).lower() for r in (dist.requires or []) if "extra ==" not in r]
    out.append({"name": canonical, "version": dist.version, "plugin": plugin, "requires": requires})
print(json.dumps(out))
"""


class HostError(Exception):
    """A request the host cannot serve, as one line for the engine."""


def plugin_version(package_version: str) -> str | None:
    """A PEP 440 package version as the plugin's semver (1.2 -> 1.2.0, 1.2.3a4 -> 1.2.3-alpha.4,
    1.2.3rc4 -> 1.2.3-rc.4, .postN/.devN -> +postN/+devN); None where that cannot be derived (epochs)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)*)(?:(a|b|rc)(\d+))?(?:\.post(\d+))?(?:\.dev(\d+))?", package_version)
    if m is None:
        return None
    release, pre, pre_n, post, dev = m.groups()
    segments = release.split(".")
    segments += ["0"] * (3 - len(segments))
    out = ".".join(segments)
    if pre:
        out += "-" + {"a": "alpha", "b": "beta", "rc": "rc"}[pre] + "." + pre_n
    if post is not None:
        out += "+post" + post
    if dev is not None:
        out += ("dev" if post is not None else "+dev") + dev
    return out


class Toolchain:
    """The program's Python: ``runtime.options.virtualenv`` (relative to the project root) or, without
    one, ``python3`` on PATH (or $PULUMI_PYTHON_CMD); only the pip toolchain."""

    def __init__(self, info: language_pb2.ProgramInfo | None):
        options = dict(info.options.items()) if info is not None and info.HasField("options") else {}
        root = info.root_directory if info is not None else ""
        venv = options.get("virtualenv", "")
        if not isinstance(venv, str):
            raise HostError("virtualenv option must be a string")
        toolchain = options.get("toolchain", "pip")
        if toolchain != "pip":
            raise HostError(f"this language host supports the pip toolchain only, not {toolchain!r} (Pulumi.yaml runtime.options.toolchain)")
        if options.get("typechecker"):
            raise HostError("this language host runs no typechecker (Pulumi.yaml runtime.options.typechecker)")
        self.option = venv
        self.venv = os.path.join(root, venv) if venv and not os.path.isabs(venv) else venv

    def check(self) -> None:
        if self.option and not os.path.isfile(os.path.join(self.venv, "bin", "python")):
            state = "doesn't exist" if not os.path.exists(self.venv) else "doesn't appear to be a virtual environment"
            raise HostError(f"The 'virtualenv' option in Pulumi.yaml is set to {self.option!r}, but {self.venv!r} {state}; create it and install the program's requirements into it (make venv)")

    @property
    def python(self) -> str:
        if self.venv:
            return os.path.join(self.venv, "bin", "python")
        return os.environ.get("PULUMI_PYTHON_CMD") or "python3"

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ)
        if self.venv:
            env["VIRTUAL_ENV"] = self.venv
            env["PATH"] = os.pathsep.join([os.path.join(self.venv, "bin"), env.get("PATH", "")])
            env.pop("PYTHONHOME", None)
        env.update(extra or {})
        return env

    def output(self, *args: str) -> str:
        self.check()
        proc = subprocess.run([self.python, *args], capture_output=True, text=True, env=self.env(), check=False)
        if proc.returncode != 0:
            raise HostError(f"calling `{self.python} {' '.join(args[:2])}` failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
        return proc.stdout

    def packages(self) -> list[dict]:
        return json.loads(self.output("-c", LIST_PACKAGES))


def _abort(context: grpc.ServicerContext, err: Exception):
    context.abort(grpc.StatusCode.UNKNOWN, str(err))


class LanguageHost(language_pb2_grpc.LanguageRuntimeServicer):
    """The LanguageRuntime service for Python programs; RPCs not defined here answer UNIMPLEMENTED."""

    def __init__(self, executor: str, engine_address: str, tracing: str):
        self.executor = executor
        self.engine_address = engine_address
        self.tracing = tracing
        self._running: set[subprocess.Popen] = set()
        self._lock = threading.Lock()

    def Handshake(self, request, context):
        self.engine_address = request.engine_address
        return language_pb2.LanguageHandshakeResponse()

    def GetPluginInfo(self, request, context):
        return plugin_pb2.PluginInfo(version=versions.PULUMI_SDK_VERSION.removeprefix("v"))

    def GetRequiredPackages(self, request, context):
        try:
            tc = Toolchain(request.info)
            packages = tc.packages()
        except HostError as err:
            return _abort(context, err)
        out = []
        for pkg in packages:
            if pkg["name"] in PACKAGES_WITHOUT_PLUGINS or (pkg["plugin"] is None and not pkg["name"].startswith("pulumi-")):
                continue
            dep = _package_dependency(pkg)
            if dep is not None:
                out.append(dep)
        return language_pb2.GetRequiredPackagesResponse(packages=sorted(out, key=lambda d: d.name))

    def GetProgramDependencies(self, request, context):
        try:
            packages = Toolchain(request.info).packages()
        except HostError as err:
            return _abort(context, err)
        if not request.transitiveDependencies:
            required = {r for p in packages for r in p["requires"]}
            packages = [p for p in packages if p["name"] not in required]
        deps = [language_pb2.DependencyInfo(name=p["name"], version=p["version"]) for p in sorted(packages, key=lambda p: p["name"])]
        return language_pb2.GetProgramDependenciesResponse(dependencies=deps)

    def About(self, request, context):
        try:
            tc = Toolchain(request.info if request.HasField("info") else None)
            found = json.loads(tc.output("-c", "import json, sys; print(json.dumps([sys.executable, sys.version.split()[0]]))"))
            pip = tc.output("-m", "pip", "--version").split()[1]
        except HostError as err:
            return _abort(context, err)
        return language_pb2.AboutResponse(executable=found[0], version=found[1], metadata={"toolchain": "pip", "toolchainVersion": pip, "typechecker": "none"})

    def InstallDependencies(self, request, context):
        """Creates the virtualenv where it is missing and installs requirements.txt into it (pip)."""
        try:
            tc = Toolchain(request.info)
        except HostError as err:
            return _abort(context, err)
        directory = request.info.program_directory or request.directory
        steps = []
        if tc.venv and not os.path.isfile(tc.python):
            steps.append([sys.executable, "-m", "venv", tc.venv])
        if os.path.isfile(os.path.join(directory, "requirements.txt")):
            steps.append([tc.python, "-m", "pip", "install", "-r", "requirements.txt"])
        yield language_pb2.InstallDependenciesResponse(stdout=b"Installing dependencies...\n\n")
        for args in steps:
            proc = subprocess.Popen(args, cwd=directory, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=tc.env())
            assert proc.stdout is not None
            for line in proc.stdout:
                yield language_pb2.InstallDependenciesResponse(stdout=line)
            if proc.wait() != 0:
                context.abort(grpc.StatusCode.UNKNOWN, f"`{' '.join(args)}` exited with {proc.returncode}")
        yield language_pb2.InstallDependenciesResponse(stdout=b"Finished installing dependencies\n\n")

    def Run(self, request, context):
        try:
            tc = Toolchain(request.info)
            tc.check()
        except HostError as err:
            return _abort(context, err)
        env = tc.env({"PULUMI_CONFIG": json.dumps(dict(request.config)), "PULUMI_CONFIG_SECRET_KEYS": json.dumps(list(request.configSecretKeys))})
        try:
            proc = subprocess.Popen([tc.python, self.executor, *self.arguments(request)], env=env)
        except OSError as err:
            return language_pb2.RunResponse(error=f"problem executing program (could not run language executor): {err}")
        with self._lock:
            self._running.add(proc)
        context.add_callback(lambda: _interrupt(proc))
        try:
            code = proc.wait()
        finally:
            with self._lock:
                self._running.discard(proc)
        sys.stdout.flush()
        if code == 0:
            return language_pb2.RunResponse()
        if code == EXIT_USER_ACTIONABLE:
            return language_pb2.RunResponse(bail=True)
        if code < 0:
            return language_pb2.RunResponse(error=f"program exited unexpectedly: signal: {signal.Signals(-code).name}")
        return language_pb2.RunResponse(error=f"program exited with non-zero exit code: {code}")

    def arguments(self, request) -> list[str]:
        """The exec script's command line: the flags with a value, then the entry point and the program's args."""
        flags = [
            ("monitor", request.monitor_address),
            ("engine", self.engine_address),
            ("project", request.project),
            ("root_directory", request.info.root_directory),
            ("stack", request.stack),
            ("pwd", request.pwd),
            ("dry_run", "true" if request.dryRun else "false"),
            ("parallel", str(request.parallel)),
            ("tracing", self.tracing),
            ("organization", request.organization),
        ]
        args = [item for key, value in flags if value for item in (f"--{key}", value)]
        return [*args, request.info.entry_point or ".", *request.args]

    def Cancel(self, request, context):
        with self._lock:
            running = list(self._running)
        for proc in running:
            _interrupt(proc)
        return empty_pb2.Empty()


def _interrupt(proc: subprocess.Popen) -> None:
    """SIGINT, then SIGKILL after 5 s, as the Go host cancels a run."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()


def _package_dependency(pkg: dict) -> plugin_pb2.PackageDependency | None:
    plugin = pkg["plugin"] or {}
    if pkg["plugin"] is not None and not plugin.get("resource"):
        return None  # the package says it has no plugin
    name = plugin.get("name") or pkg["name"].removeprefix("pulumi-")
    version = plugin.get("version") or plugin_version(pkg["version"])
    if not version:
        return None
    dep = plugin_pb2.PackageDependency(name=name, version=version if version.startswith("v") else "v" + version, kind="resource", server=plugin.get("server", ""))
    for field, key in (("parameterization", "parameterization"), ("extension", "extensionParameterization")):
        if plugin.get(key):
            p = plugin[key]
            value = p.get("value", "")
            getattr(dep, field).CopyFrom(plugin_pb2.PackageParameterization(name=p.get("name", ""), version=p.get("version", ""), value=value.encode() if isinstance(value, str) else bytes(value)))
    return dep


def parse_args(argv: list[str]) -> dict:
    """Go flag syntax as the engine passes it: -name value, --name value, -name=value, bare booleans."""
    opts: dict = {"tracing": "", "executor": "", "version": False, "engine": ""}
    positional: list[str] = []
    takes_value = {"tracing": "tracing", "use-executor": "executor", "root": None, "v": None}
    booleans = {"version", "logtostderr", "logflow"}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("-") and len(arg) > 1:
            name, eq, value = arg.lstrip("-").partition("=")
            if name in booleans:
                opts["version"] = opts["version"] or name == "version"
            elif name in takes_value:
                if not eq:
                    i += 1
                    value = argv[i] if i < len(argv) else ""
                if takes_value[name]:
                    opts[takes_value[name]] = value
            else:
                raise SystemExit(f"pulumi-language-python: unknown flag {arg}")
        else:
            positional.append(arg)
        i += 1
    opts["engine"] = positional[0] if positional else ""
    return opts


def _watch_engine(address: str, server: grpc.Server) -> None:
    """Stop serving once the engine stops answering (the Go host's health check): a host whose engine
    died must not outlive it."""
    channel = grpc.insecure_channel(address)
    check = channel.unary_unary("/grpc.health.v1.Health/Check", request_serializer=lambda b: b, response_deserializer=lambda b: b)  # pyright: ignore[reportArgumentType]  (raw bytes both ways)
    failures = 0
    while True:
        time.sleep(1)
        try:
            check(b"", timeout=5)
            failures = 0
        except grpc.RpcError as err:
            failures = failures + 1 if err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) else 0
        if failures >= 5:
            server.stop(0)
            return


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    if opts["version"]:
        print(versions.PULUMI_SDK_VERSION.removeprefix("v"))
        return 0
    executor = opts["executor"]
    if not executor:
        # next to the host as the engine started it (the wrapper passes its own path)
        here = os.environ.get("PULUMI_LANGUAGE_PYTHON_HOST") or __file__
        executor = os.path.join(os.path.dirname(here), EXEC_SCRIPT)
        if not os.path.isfile(executor):
            print(f"pulumi-language-python: missing executor {executor} (make engine-build)", file=sys.stderr)
            return 1
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16), options=GRPC_OPTIONS)
    language_pb2_grpc.add_LanguageRuntimeServicer_to_server(LanguageHost(executor, opts["engine"], opts["tracing"]), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    if opts["engine"]:
        threading.Thread(target=_watch_engine, args=(opts["engine"], server), daemon=True).start()
    signal.signal(signal.SIGINT, lambda *_: server.stop(5))
    signal.signal(signal.SIGTERM, lambda *_: server.stop(0))
    server.wait_for_termination()
    return 0


if __name__ == "__main__":
    sys.exit(main())
