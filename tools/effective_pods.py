"""The pods a TrainJob will run: its runtime's trainer Job template with the TrainJob's trainer
block and pod customisation applied, as a plain ``batch/v1`` Job. Written next to the manifests
for review and for scanners (checkov cannot look inside TrainJobs and runtimes).

Usage: python -m tools.effective_pods out/dev/manifests out/dev/effective
"""

from __future__ import annotations

import copy
import pathlib
import sys

import yaml

from k8s.builders import trainer_api


def _merge_named(base: list[dict], extra: list[dict]) -> list[dict]:
    out = {item["name"]: copy.deepcopy(item) for item in base}
    for item in extra:
        if item["name"] in out:
            merged = out[item["name"]]
            for k, v in item.items():
                merged[k] = merged.get(k, []) + v if isinstance(v, list) and isinstance(merged.get(k), list) else v
        else:
            out[item["name"]] = copy.deepcopy(item)
    return list(out.values())


def effective_job(trainjob: dict, runtime: dict) -> dict:
    node_job = next(j for j in runtime["spec"]["template"]["spec"]["replicatedJobs"] if j["name"] == trainer_api.TRAINER_JOB)
    job_spec = copy.deepcopy(node_job["template"]["spec"])
    pod = job_spec["template"]
    spec = pod["spec"]
    custom = trainer_api.read_pod_customization(trainjob["spec"])
    for key in ("nodeSelector",):
        spec[key] = {**spec.get(key, {}), **custom.get(key, {})}
    for key in ("volumes", "containers", "initContainers"):
        if key in custom:
            spec[key] = _merge_named(spec.get(key, []), custom[key])
    for key in ("tolerations", "imagePullSecrets"):
        spec[key] = spec.get(key, []) + custom.get(key, [])
        if not spec[key]:
            spec.pop(key)
    trainer = trainjob["spec"].get("trainer", {})
    for c in spec["containers"]:
        if c["name"] == trainer_api.TRAINER_JOB:
            for src, dst in (("image", "image"), ("command", "command"), ("args", "args"), ("resourcesPerNode", "resources")):
                if src in trainer:
                    c[dst] = copy.deepcopy(trainer[src])
            c["env"] = c.get("env", []) + trainer.get("env", [])
    nodes = int(trainer.get("numNodes", 1))
    job_spec.update(parallelism=nodes, completions=nodes, completionMode="Indexed")
    meta = trainjob["metadata"]
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": f"{meta['name']}-node", "namespace": meta.get("namespace", "default")}, "spec": job_spec}


def effective_jobs(objs: list[dict]) -> list[dict]:
    runtimes = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ClusterTrainingRuntime"}
    return [effective_job(o, runtimes[o["spec"]["runtimeRef"]["name"]]) for o in objs if o["kind"] == "TrainJob" and o["spec"]["runtimeRef"]["name"] in runtimes]


def main(argv: list[str]) -> int:
    src, dst = pathlib.Path(argv[0]), pathlib.Path(argv[1])
    objs = [yaml.safe_load(p.read_text()) for p in sorted(src.glob("*.yaml"))]
    dst.mkdir(parents=True, exist_ok=True)
    for old in dst.glob("*.yaml"):
        old.unlink()
    for job in effective_jobs(objs):
        (dst / f"job-{job['metadata']['namespace']}-{job['metadata']['name']}.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
