# agentrun — see README.md. Targets follow kubebuilder's conventions.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
LOCAL := $(CURDIR)/.local
export PYTHONPATH := $(CURDIR)/devtools$(if $(PYTHONPATH),:$(PYTHONPATH))

# kubectl/helm: the ones on PATH, else the ones the development cluster links.
KUBECTL ?= $(shell command -v kubectl 2>/dev/null || echo $(LOCAL)/bin/kubectl)
HELM ?= $(shell command -v helm 2>/dev/null || echo $(LOCAL)/bin/helm)
IMG_OPERATOR ?= agentrun/operator:dev
IMG_RUNNER ?= agentrun/runner:dev

.PHONY: help
help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk -F':.*?## ' '{printf "  %-18s %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[dev]'
	touch $@

.PHONY: venv
venv: $(VENV)/.installed ## the Python environment in .venv/

.PHONY: controlplane
controlplane: ## build (or find cached) etcd, kube-apiserver, ..., kubectl, helm
	bash devtools/controlplane/build.sh

.PHONY: lint
lint: venv ## ruff and mypy
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

.PHONY: test
test: venv controlplane ## unit + integration tests (real control plane, real Postgres)
	$(VENV)/bin/pytest $(PYTEST_ARGS)

.PHONY: dev-cluster
dev-cluster: venv ## start the control plane + development node in the background
	$(PY) -m agentrun_devtools.cluster up --state $(LOCAL)

.PHONY: dev-cluster-down
dev-cluster-down: venv ## stop the development cluster and remove its state
	$(PY) -m agentrun_devtools.cluster down --state $(LOCAL)

.PHONY: install
install: ## install the CRDs and the admission policy into the current kube context
	$(KUBECTL) apply --server-side --force-conflicts -f crds/
	$(KUBECTL) wait --for=condition=Established --timeout=60s crd/agentruns.agentrun.dev crd/agentrunreplays.agentrun.dev

.PHONY: uninstall
uninstall: ## remove the CRDs and the admission policy from the current kube context
	$(KUBECTL) delete --ignore-not-found -f crds/
