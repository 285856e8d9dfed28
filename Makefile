# Offline-first entry points. Every target creates/refreshes the virtualenv it needs.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STACK  ?= dev
# PROJECT=workloads: STACK is a TrainJob stack of workloads/ (a run on its platform stack), rendered under
# out/workloads/$(STACK)/ after its platform stack (out/workloads/$(STACK)/platform/)
PROJECT ?=
OUT    := out/$(if $(PROJECT),$(PROJECT)/)$(STACK)
JOB    ?= $(if $(PROJECT),$(STACK),ddp)
EMULATE_ARGS ?=

.PHONY: venv venv-tf render validate test emulate bench bench-gpu lint policy clean image docs schema golden cost dashboard-preview cluster-up cluster-down cluster-build cluster-build-e2e e2e engine-build

$(VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -e .  # the trainctl command (.venv/bin/trainctl)
	touch $@

venv: $(VENV)/.installed

## venv-tf: TensorFlow (CPU) in its own virtualenv, only for the TF job's emulation (make emulate JOB=tf)
VENV_TF ?= .venv-tf
$(VENV_TF)/.installed: workloads/requirements-tf.txt
	$(PYTHON) -m venv $(VENV_TF)
	$(VENV_TF)/bin/python -m pip install -q -r workloads/requirements-tf.txt
	touch $@

venv-tf: $(VENV_TF)/.installed

## render: run the program under Pulumi's mock runtime -> out/$(STACK)/plan.json + manifests/
render: venv
	$(PY) -m tools.render --stack $(STACK) $(if $(PROJECT),--project $(PROJECT))

## cost: what $(STACK) costs per hour at its configured sizes and the GPU vCPU quotas its jobs need
## (prices and their source in config/prices.yaml; offline)
cost: venv
	$(PY) -m tools.cost --stack $(STACK)

## validate: a bare API server (etcd + kube-apiserver of the stack's minor, the pinned CRDs, the render's
## admission policies; cached builds) judges every rendered object as a create, with the Trainer version the
## render deploys; PREVIOUS=<an earlier render's manifests dir> judges each as the update from it; then it stops
validate: render
	$(PY) -m tools.validate $(OUT)/manifests $(if $(PREVIOUS),--previous $(PREVIOUS)) $(if $(PROJECT),--platform $(OUT)/platform/manifests)

## test: the whole test suite (offline, CPU only)
test: venv
	$(PY) -m pytest -q

## emulate: run the rendered TrainJob $(JOB) of $(STACK) locally (CPU, gloo): ddp, fsdp, tf, nccl-check;
## JOB=tf runs with TensorFlow from $(VENV_TF), created here on first use
emulate: venv $(if $(filter tf,$(JOB)),venv-tf)
	$(PY) -m tools.emulate --stack $(STACK) $(if $(PROJECT),--project $(PROJECT),--job $(JOB)) $(if $(filter tf,$(JOB)),--python $(VENV_TF)/bin/python) $(EMULATE_ARGS)

## bench: CPU benchmarks (training throughput, render time, checkpoint cost, ours against the workshop's approach)
bench: venv
	$(PY) -m bench.run_all

## bench-gpu: on a GPU host, the GPU figures: ours against the workshop's approach in one run with the
## top kernels of a profile, the FSDP variants, the checkpoint cost; each also saved in bench/results/
RESULTS := bench/results/gpu-$(shell date +%F)
bench-gpu: venv
	bash -o pipefail -c '$(PY) -m bench.efficiency --gpu --profile --json $(RESULTS)-efficiency.json | tee $(RESULTS)-efficiency.txt'
	bash -o pipefail -c '$(PY) -m bench.train --gpu --json $(RESULTS)-variants.json | tee $(RESULTS)-variants.txt'
	bash -o pipefail -c '$(PY) -m bench.checkpoint --gpu | tee $(RESULTS)-checkpoint.txt'

## lint: ruff and pyright on the code, the policy rules on the plan, checkov on the rendered manifests
lint: venv render
	$(PY) -m ruff check .
	PYRIGHT_PYTHON_IGNORE_WARNINGS=1 $(PY) -m pyright  # pinned in requirements.txt: no "new version" check
	$(PY) -m policy.check out/$(STACK)/plan.json
	bash tools/checkov.sh out/$(STACK)/manifests

## policy: the platform's policy rules over the rendered plan (offline)
policy: render
	$(PY) -m policy.check out/$(STACK)/plan.json

clean:
	rm -rf out .pytest_cache

## image: build the training image locally (needs a Docker engine), with the build args of versions.py;
## the stack builds and pushes the same image itself (infra/registry.py)
IMAGE ?= training-platform/workloads:local
image: venv
	docker build --platform linux/amd64 $$($(PY) -c "import versions; print(' '.join(f'--build-arg {k}={v}' for k, v in versions.WORKLOAD_BUILD_ARGS.items()))") -t $(IMAGE) workloads

## docs: regenerate the config reference (docs/reference.md) from the settings classes, and the README's cost of dev
docs: venv
	$(PY) -m tools.config_docs --write docs/reference.md
	$(PY) -m tools.cost --stack dev --write README.md

## schema: regenerate the stack files' JSON Schema (editor completion and checks) from the settings classes
schema: venv
	$(PY) -m tools.config_json_schema --write schema/stack-config.schema.json

## dashboard-preview: redraw docs/dashboard.png, a layout preview of the CloudWatch dashboard (Pillow)
dashboard-preview: venv
	$(PY) -m pip install -q -r tools/requirements-preview.txt
	$(PY) -m tools.dashboard_preview --out docs/dashboard.png

## golden: rewrite tests/golden after an intended change to the rendered objects
golden: venv
	$(PY) -m tools.golden --update

## cluster-up: a local control plane for $(STACK) (etcd, kube-apiserver, controller-manager, scheduler, kwok,
## JobSet, Trainer, Kueue, Karpenter's kwok provider, built from their Go modules at the pinned versions and
## cached), the stack applied with server-side apply; out/$(STACK)/cluster/kubeconfig; keeps running.
## PROJECT=workloads STACK=<run>: the run's platform stack first (its cluster, or the one running), then only the run
cluster-up: venv
	$(PY) -m tools.cluster up --stack $(STACK) $(if $(PROJECT),--project $(PROJECT))

## cluster-down: stop exactly the processes cluster-up started (by pid) and remove out/$(STACK)/cluster
cluster-down: venv
	$(PY) -m tools.cluster down --stack $(STACK)

## cluster-build: build (or find cached) every pinned local-cluster component
cluster-build: venv
	$(PY) -m tools.cluster build --all

## cluster-build-e2e: the components the e2e tests' stacks need (CI builds them before make test)
E2E_STACKS ?= dev prod workshop teams
cluster-build-e2e: venv
	$(PY) -m tools.cluster build $(foreach s,$(E2E_STACKS),--stack $(s))

## e2e: the end-to-end tests against real local control planes (each test module brings its stack up and down)
e2e: venv
	$(PY) -m pytest -q tests/e2e

## engine-build: the Pulumi engine for `pulumi up` on this machine: the CLI and the Kubernetes provider built from
## their Go modules at the versions.py pins (cached like cluster-build), our Python language host
## (tools/engine/) and the plugins in this checkout's PULUMI_HOME, out/engine/pulumi-home
engine-build: venv
	$(PY) -m tools.engine.build
