# Offline-first entry points. Every target creates/refreshes the virtualenv it needs.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STACK  ?= dev
JOB    ?= ddp
EMULATE_ARGS ?=

.PHONY: venv render validate test emulate bench lint policy clean image docs schema golden

$(VENV)/.installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	touch $@

venv: $(VENV)/.installed

## render: run the program under Pulumi's mock runtime -> out/$(STACK)/plan.json + manifests/
render: venv
	$(PY) -m tools.render --stack $(STACK)

## validate: check rendered manifests against the upstream CRD schemas (OpenAPI and CEL rules) and built-in
## kinds, with the Trainer version the render deploys; PREVIOUS=<an earlier render's manifests dir> also
## checks the CRDs' transition rules (immutable fields) from it
validate: render
	$(PY) -m tools.validate out/$(STACK)/manifests $(if $(PREVIOUS),--previous $(PREVIOUS))

## test: the whole test suite (offline, CPU only)
test: venv
	$(PY) -m pytest -q

## emulate: run the rendered TrainJob $(JOB) of $(STACK) locally (CPU, gloo)
emulate: venv
	$(PY) -m tools.emulate --stack $(STACK) --job $(JOB) $(EMULATE_ARGS)

## bench: CPU benchmarks (training throughput, render time, checkpoint cost)
bench: venv
	$(PY) -m bench.run_all

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

## docs: regenerate the README's config reference from the settings classes
docs: venv
	$(PY) -m tools.config_docs --write README.md

## schema: regenerate the stack files' JSON Schema (editor completion and checks) from the settings classes
schema: venv
	$(PY) -m tools.config_json_schema --write schema/stack-config.schema.json

## golden: rewrite tests/golden after an intended change to the rendered objects
golden: venv
	$(PY) -m tools.golden --update
