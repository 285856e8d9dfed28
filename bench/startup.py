"""The parts of a job's time to first step that a CPU machine can measure (docs/time-to-first-step.md):

- ``deps``: the launcher's install of a small requirements.txt (``workloads/programs/launch.py``
  ``install_requirements``, the function every trainctl pod runs), into a fresh environment each
  time: first with an empty pip cache (a new pod), then with the cache the first run left (what
  a cache kept across pod starts would give);
- ``imports``: ``import torch``, ``import transformers`` and building the native T5 (random init,
  on the host), each in a fresh process;
- ``first-step``: the FSDP and DDP programs under torchrun (2 processes, gloo, synthetic data),
  from the spawn to the first ``step`` event.

    python -m bench.startup [--only deps imports first-step] [--requirements FILE]

The requirements are installed from the index pip reaches (``TRAINING_PIP_INDEX_URL``, else
https://pypi.org/simple), so ``deps`` needs the network; the other parts run offline.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

from bench.common import PROGRAMS, _port, table

# A small requirements.txt of the kind a team adds on top of the image: tokenization and data
# helpers the image does not carry (each pulls a few dependencies of its own).
DEFAULT_REQUIREMENTS = "sentencepiece==0.2.1\neinops==0.8.1\ntiktoken==0.12.0\n"

IMPORT_TIMER = r"""
import json, sys, time
sys.path.insert(0, {programs!r})
t0 = time.perf_counter()
{statement}
print(json.dumps({{"seconds": time.perf_counter() - t0}}))
"""

BUILD_MODEL = """
import torch, t5_model
from fsdp_t5 import T5_CONFIGS
t1 = time.perf_counter()
model = t5_model.T5Model(t5_model.T5Settings(**T5_CONFIGS[{config!r}], pad_token_id=0, decoder_start_token_id=0, eos_token_id=1))
t5_model.init_weights(model, seed=0)
sys.stderr.write(json.dumps({{"build_s": time.perf_counter() - t1, "params": sum(p.numel() for p in model.parameters())}}) + "\\n")
"""


def install_once(requirements: str, deps_dir: str) -> float:
    """One install by the launcher into a new environment under ``deps_dir`` (its pip cache
    stays there for the next call); the seconds it took."""
    sys.path.insert(0, str(PROGRAMS))
    import launch  # pyright: ignore[reportMissingImports]  (the programs directory, put on sys.path above)

    code = tempfile.mkdtemp(dir=deps_dir, prefix="code-")
    pathlib.Path(code, launch.REQUIREMENTS).write_text(requirements)
    started = time.perf_counter()
    env, venv, failed = launch.install_requirements({**os.environ, launch.DEPS_DIR_ENV: deps_dir}, code)
    seconds = time.perf_counter() - started
    if failed:
        raise RuntimeError(f"install failed: {failed[0]}")
    return seconds


def deps(requirements: str) -> list[dict]:
    with tempfile.TemporaryDirectory() as root:
        cold = install_once(requirements, root)
        again = install_once(requirements, root)
        cache_mib = sum(f.stat().st_size for f in pathlib.Path(root, "pip-cache").rglob("*") if f.is_file()) / 2**20
        # the wheels already on the node (what a cache that outlives the pod would hold): pip
        # reads them from a directory, no index (option lines in requirements.txt are pip's)
        wheels = os.path.join(root, "wheels")
        subprocess.run([sys.executable, "-m", "pip", "download", "--isolated", "--quiet", "--dest", wheels, "--requirement", "/dev/stdin"], input=requirements, text=True, check=True, timeout=600)
        local = install_once(f"--no-index\n--find-links {wheels}\n{requirements}", root)
    return [
        {"part": "deps, empty pip cache (a new pod)", "seconds": round(cold, 1), "note": ", ".join(requirements.split())},
        {"part": "deps, again with the pip cache of the run before", "seconds": round(again, 1), "note": f"pip cache {cache_mib:.0f} MiB after both runs"},
        {"part": "deps, wheels on local disk (--no-index)", "seconds": round(local, 1), "note": "no download, no index"},
    ]


def timed(statement: str) -> tuple[float, str]:
    p = subprocess.run([sys.executable, "-c", IMPORT_TIMER.format(programs=str(PROGRAMS), statement=statement)], capture_output=True, text=True, timeout=900, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])["seconds"], p.stderr.strip()


def imports() -> list[dict]:
    rows = []
    for name, statement in (("import torch", "import torch"), ("import transformers", "import transformers")):
        timed(statement)  # once to warm the page cache: a node reads the image from its own disk
        seconds, _ = timed(statement)
        rows.append({"part": name, "seconds": round(seconds, 2), "note": "second run (page cache warm)"})
    for config in ("t5-small", "t5-large"):
        seconds, err = timed(BUILD_MODEL.format(config=config))
        built = json.loads(err.splitlines()[-1])
        rows.append({"part": f"import + build native {config} (random init, host)", "seconds": round(seconds, 2), "note": f"build {built['build_s']:.2f} s, {built['params'] / 1e6:.0f} M parameters"})
    return rows


def to_first_step(program: str, args: list[str], nproc: int = 2) -> float:
    """torchrun's spawn to the program's first ``step`` event (rank 0's stdout)."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-port", str(_port()), str(PROGRAMS / program), *args, "--checkpoint-dir", os.path.join(tmp, "ckpt")]
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                if line.startswith("TRAINING_EVENT ") and json.loads(line.split(" ", 1)[1]).get("event") == "step":
                    return time.perf_counter() - started
        finally:
            proc.kill()
            proc.wait()
    raise RuntimeError(f"{program} printed no step event")


def first_step() -> list[dict]:
    fsdp = ["--synthetic", "--init", "random", "--model-config", "t5-small", "--batch-size", "4", "--source-len", "64", "--target-len", "16", "--synthetic-samples", "64", "--max-steps", "3", "--log-every", "1", "--epochs", "1"]
    ddp = ["--synthetic", "--synthetic-samples", "512", "--batch-size", "32", "--epochs", "1", "--max-steps", "3", "--log-every", "1", "--checkpoint-every", "100000"]
    return [
        {"part": "fsdp_t5.py t5-small: spawn to first step", "seconds": round(to_first_step("fsdp_t5.py", fsdp), 1), "note": "torchrun, 2 processes, gloo"},
        {"part": "ddp_mnist.py: spawn to first step", "seconds": round(to_first_step("ddp_mnist.py", ddp), 1), "note": "torchrun, 2 processes, gloo"},
    ]


PARTS = {"deps": None, "imports": imports, "first-step": first_step}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    ap.add_argument("--only", nargs="+", choices=sorted(PARTS), default=sorted(PARTS))
    ap.add_argument("--requirements", help="a requirements.txt to time instead of the built-in small one")
    args = ap.parse_args(argv)
    requirements = pathlib.Path(args.requirements).read_text() if args.requirements else DEFAULT_REQUIREMENTS
    rows: list[dict] = []
    for part in args.only:
        rows += deps(requirements) if part == "deps" else PARTS[part]()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    print(table(rows, ["part", "seconds", "note"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
