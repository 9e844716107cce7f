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
IMG_STORE_API ?= agentrun/store-api:dev
IMG_RECEIVER ?= agentrun/receiver:dev
IMG_RUNNER ?= agentrun/runner:dev
IMG_POSTGRES ?= agentrun/postgres:dev

.PHONY: help
help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk -F':.*?## ' '{printf "  %-18s %s\n", $$1, $$2}'

# The exact versions come from requirements.lock (constraints), so pip resolves nothing.
$(VENV)/.installed: pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -c requirements.lock -e '.[dev]'
	touch $@

.PHONY: lock
lock: ## re-resolve pyproject.toml's ranges in a fresh environment into requirements.lock
	rm -rf $(LOCAL)/lock-venv && $(PYTHON) -m venv $(LOCAL)/lock-venv
	$(LOCAL)/lock-venv/bin/pip install --quiet --upgrade pip
	$(LOCAL)/lock-venv/bin/pip install --quiet '.[dev]'
	{ sed -n '/^#/p' requirements.lock; $(LOCAL)/lock-venv/bin/pip freeze --exclude-editable \
	  | grep -Ev '^agentrun( @|==)'; } > requirements.lock.new && mv requirements.lock.new requirements.lock
	rm -rf $(LOCAL)/lock-venv

.PHONY: venv
venv: $(VENV)/.installed console ## the Python environment in .venv/ (with the console's pages)

# The console's pages (kubectl-plugin/console, Vite + Preact + TypeScript) built into the
# plugin's package (kubectl-plugin/agentrun_kubectl/console/static, not committed); cached in
# $${AGENTRUN_CACHE:-~/.cache/agentrun}/console by the lock file and the sources. Needs Node.js
# >= 20.19 and npm.
.PHONY: console
console: ## build (or find cached) the console's pages into the kubectl plugin's package
	bash devtools/console/build.sh

# The screenshots in docs/console.md, taken by the console's browser tests (tests/kubectl/
# test_console_browser.py) at 1280x800; CI writes them to an output folder, never to docs/.
# Look at them before you commit them.
.PHONY: console-screenshots
console-screenshots: venv controlplane ## refresh docs/console/*.png from the console's browser tests
	AGENTRUN_CONSOLE_SCREENSHOTS=$(CURDIR)/docs/console $(VENV)/bin/pytest \
		tests/kubectl/test_console_browser.py -p no:cacheprovider -q $(PYTEST_ARGS)

.PHONY: controlplane
controlplane: ## build (or find cached) etcd, kube-apiserver, ..., kubectl, helm
	bash devtools/controlplane/build.sh

# Argo CD's health-check code and cli-utils' kstatus, which the tests run where those peers'
# behaviour is the contract, and the kubelet's $(VAR) expansion, which the development node
# runs (docs/development.md).
.PHONY: peers
peers: ## build (or find cached) argocd-health, kstatus and kubelet-expansion, small commands over Argo CD's, cli-utils' and the kubelet's own code
	bash devtools/peers/build.sh

# Kueue's controller manager, from its Go module (devtools/kueue/build.sh, cached).
.PHONY: kueue-build
kueue-build: ## build (or find cached) Kueue's controller manager and its manifests
	bash devtools/kueue/build.sh

# Kueue on the running development cluster, left running (docs/kueue.md); make
# dev-cluster-down stops it.
.PHONY: kueue
kueue: venv ## install Kueue (pod and batch/job integrations, for objects labelled kueue.x-k8s.io/queue-name) on the development cluster
	$(PY) -m agentrun_devtools.kueue up --state $(LOCAL)

.PHONY: lint
lint: venv ## ruff and mypy
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# Two pytest processes at once (pytest-xdist, a test file at a time, in tests/conftest.py's
# order: the longest first), each with its own control
# plane, development node, Postgres and operator (tests/cluster_fixtures.py): the suite waits
# on real parts far more than it computes. Not more than two on these 2-core machines: the
# sub-second eviction tests need a core free. PYTEST_WORKERS=0 runs everything in one process.
PYTEST_WORKERS ?= 2
PYTEST_PARALLEL = $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder)

# What the tests need built before they start. .ci/run builds the peers and Kueue in the
# background instead (TEST_BUILDS=controlplane): the tests that run them wait for that
# build's lock.
TEST_BUILDS ?= controlplane peers kueue-build

.PHONY: test
test: venv $(TEST_BUILDS) ## unit + integration tests (real control plane, real Postgres, Argo CD and kstatus as their own code)
	$(VENV)/bin/pytest $(PYTEST_PARALLEL) --durations=20 $(PYTEST_ARGS)

.PHONY: dev-cluster
dev-cluster: venv ## start the control plane + development node in the background
	$(PY) -m agentrun_devtools.cluster up --state $(LOCAL)

.PHONY: dev-cluster-down
dev-cluster-down: venv ## stop the development cluster and remove its state
	$(PY) -m agentrun_devtools.cluster down --state $(LOCAL)

.PHONY: demo
demo: venv controlplane ## dev-cluster + install + operator + the replay story (a run, an eviction, a refused replay, a forced replay)
	$(MAKE) dev-cluster
	$(PY) -m agentrun_devtools.demo

.PHONY: install
install: ## install the CRDs and the admission policy into the current kube context
	$(KUBECTL) apply --server-side --force-conflicts -f crds/
	$(KUBECTL) wait --for=condition=Established --timeout=60s crd/agentruns.agentrun.dev \
		crd/agentrunreplays.agentrun.dev crd/agentrunapprovals.agentrun.dev \
		crd/agentrunschedules.agentrun.dev crd/agentruntriggers.agentrun.dev
	@# Established is not yet usable: the API server's admission policies map a new kind
	@# from discovery, refreshed every 30 s or so (kubernetes/kubernetes#124237), and refuse
	@# it with ServiceUnavailable until then. A server-side dry run of the sample run waits
	@# that out; any other answer (created, or a refusal of its own) ends the wait.
	@for i in $$(seq 60); do \
		out=$$($(KUBECTL) create --dry-run=server -n default -o name \
			-f samples/agentrun-scripted.yaml 2>&1) && exit 0; \
		case "$$out" in *"There can be a delay"*) sleep 1 ;; *) exit 0 ;; esac; \
	done; echo "the API server's admission policies do not know AgentRun yet: $$out" >&2; exit 1

# The chart's copies of crds/ (CRDs, admission policies, ClusterRoles) and the Argo CD
# argocd-cm patch are generated; tests/chart/test_chart_sources.py fails when they drift.
.PHONY: chart-crds
chart-crds: venv ## regenerate the chart's copies of crds/ and charts/agentrun/argocd/argocd-cm-patch.yaml
	$(PY) -m agentrun_devtools.chart_sources

.PHONY: uninstall
uninstall: ## remove the CRDs and the admission policy from the current kube context
	$(KUBECTL) delete --ignore-not-found -f crds/

# `make run`: the operator, the store API (`agentrun-store-api`, the program the chart runs
# as its own Deployment) and the trigger receiver (`agentrun-receiver`), each its own
# process, in the foreground, against the current kube context. Ctrl-C stops them all, and
# so does the end of any one (agentrun_devtools.supervise).
#
# On the development cluster the operator and the store API use .local/operator.kubeconfig, also when the admin's
# .local/kubeconfig is exported (as the README does): that identity is in the group
# agentrun:operators, which the admission policy lets set spec.replayOf. As the admin, every
# replay run the operator creates is refused.
DEV_KUBECONFIG := $(LOCAL)/kubeconfig
RUN_KUBECONFIG ?= $(if $(filter $(DEV_KUBECONFIG),$(abspath $(KUBECONFIG))),$(LOCAL)/operator.kubeconfig,$(or $(KUBECONFIG),$(wildcard $(LOCAL)/operator.kubeconfig)))

# `make run` is a development target: the scripted model (samples/agentrun-scripted.yaml)
# is on. The chart leaves it off (operator.allowScriptedModel).
RUN_ARGS ?= --allow-scripted-model

# The run store: DATABASE_URL, else the development cluster's SQLite file in this
# checkout's .local (not wherever the package happens to be installed).
RUN_DATABASE_URL ?= $(or $(DATABASE_URL),sqlite:///$(LOCAL)/agentrun.db)
# The store API speaks TLS: the development cluster's pair, in this checkout's .local (make
# dev-cluster writes it), unless the environment names another. It listens on a fixed
# address (runner pods keep the URL they were given, across restarts), which runner pods
# must reach: on a cluster of other machines, AGENTRUN_STORE_API_LISTEN=0.0.0.0:8089 and
# AGENTRUN_STORE_API_URL=https://<this host>:8089 (docs/operator.md, Running it).
RUN_STORE_API_TLS ?= $(LOCAL)/store-api
RUN_STORE_API_LISTEN ?= $(or $(AGENTRUN_STORE_API_LISTEN),127.0.0.1:8089)
RUN_STORE_API_URL ?= $(or $(AGENTRUN_STORE_API_URL),https://$(RUN_STORE_API_LISTEN))
RUN_STORE_API_METRICS_PORT ?= 0
# The transcript API, where make dev-cluster registered it (its APIService's endpoint).
RUN_TRANSCRIPT_API_LISTEN ?= $(shell cat $(RUN_STORE_API_TLS)/transcript-api-listen 2>/dev/null)

# The trigger receiver, beside the operator as its own process: on this host's loopback
# (AgentRunTriggers' status.url is https://$(RUN_RECEIVER_LISTEN)/v1/triggers/<ns>/<name>),
# with the pair and the credential make dev-cluster wrote to .local/receiver/ and
# .local/receiver.kubeconfig (elsewhere: KUBECONFIG, and the pair the environment names).
RUN_RECEIVER_LISTEN ?= 127.0.0.1:8090
RUN_RECEIVER_TLS ?= $(LOCAL)/receiver
RUN_RECEIVER_KUBECONFIG ?= $(if $(filter $(DEV_KUBECONFIG),$(abspath $(KUBECONFIG))),$(LOCAL)/receiver.kubeconfig,$(or $(KUBECONFIG),$(wildcard $(LOCAL)/receiver.kubeconfig)))

# `make run`'s programs, one a line: 'NAME: COMMAND'. What they share comes from the
# environment the recipe sets (the kubeconfig, the store, the certificates); the receiver
# has its own credential (`env` sets it: the lines run with no shell).
RUN_PROGRAMS = \
	'operator: $(VENV)/bin/agentrun-operator --store-api-url=$(RUN_STORE_API_URL) $(RUN_ARGS)' \
	'store-api: $(VENV)/bin/agentrun-store-api --listen=$(RUN_STORE_API_LISTEN) --metrics-port=$(RUN_STORE_API_METRICS_PORT)' \
	'receiver: env KUBECONFIG=$(RUN_RECEIVER_KUBECONFIG) $(VENV)/bin/agentrun-receiver --listen=$(RUN_RECEIVER_LISTEN)'

.PHONY: run
run: venv ## run the operator, the store API and the trigger receiver in the foreground against the current kube context
	@echo "agentrun-operator, agentrun-store-api and agentrun-receiver with KUBECONFIG=$(or $(RUN_KUBECONFIG),~/.kube/config)"
	@echo "agentrun-receiver on https://$(RUN_RECEIVER_LISTEN) (CA: $(RUN_RECEIVER_TLS)/ca.crt)"
	AGENTRUN_RECEIVER_URL=$${AGENTRUN_RECEIVER_URL:-https://$(RUN_RECEIVER_LISTEN)} \
		AGENTRUN_RECEIVER_TLS_CERT_FILE=$${AGENTRUN_RECEIVER_TLS_CERT_FILE:-$(RUN_RECEIVER_TLS)/tls.crt} \
		AGENTRUN_RECEIVER_TLS_KEY_FILE=$${AGENTRUN_RECEIVER_TLS_KEY_FILE:-$(RUN_RECEIVER_TLS)/tls.key} \
		KUBECONFIG=$(RUN_KUBECONFIG) DATABASE_URL=$(RUN_DATABASE_URL) \
		AGENTRUN_STORE_API_TLS_CERT_FILE=$${AGENTRUN_STORE_API_TLS_CERT_FILE:-$(RUN_STORE_API_TLS)/tls.crt} \
		AGENTRUN_STORE_API_TLS_KEY_FILE=$${AGENTRUN_STORE_API_TLS_KEY_FILE:-$(RUN_STORE_API_TLS)/tls.key} \
		AGENTRUN_STORE_API_CA_FILE=$${AGENTRUN_STORE_API_CA_FILE:-$(RUN_STORE_API_TLS)/ca.crt} \
		AGENTRUN_TRANSCRIPT_LISTEN=$${AGENTRUN_TRANSCRIPT_LISTEN:-$(RUN_TRANSCRIPT_API_LISTEN)} \
		$(PY) -m agentrun_devtools.supervise $(RUN_PROGRAMS)

.PHONY: deploy
deploy: ## Helm install into the current kube context (namespace agentrun-system)
	$(HELM) upgrade --install agentrun charts/agentrun --namespace agentrun-system \
		--create-namespace --set operator.image=$(IMG_OPERATOR) --set storeApi.image=$(IMG_STORE_API) \
		--set receiver.image=$(IMG_RECEIVER) --set runner.image=$(IMG_RUNNER) \
		$(HELM_ARGS)

.PHONY: undeploy
undeploy: ## Helm uninstall
	$(HELM) uninstall agentrun --namespace agentrun-system

.PHONY: docker-build
docker-build: ## build the operator, store API, receiver and runner images (needs a Docker engine)
	@docker info >/dev/null 2>&1 || { echo "docker-build: no Docker engine here; nothing built"; exit 1; }
	docker build -t $(IMG_OPERATOR) -f Dockerfile .
	docker build -t $(IMG_STORE_API) -f store-api-image/Dockerfile .
	docker build -t $(IMG_RECEIVER) -f receiver-image/Dockerfile .
	docker build -t $(IMG_RUNNER) -f runner-image/Dockerfile .

.PHONY: images
# Standard library only: no .venv needed. Archives in $${AGENTRUN_CACHE:-~/.cache/agentrun}/images/archives.
images: ## build the operator, store API, receiver, runner and trial-Postgres images as OCI archives (no Docker engine, no registry)
	$(PYTHON) -m agentrun_devtools.images --operator $(IMG_OPERATOR) --store-api $(IMG_STORE_API) \
		--receiver $(IMG_RECEIVER) --runner $(IMG_RUNNER) --postgres $(IMG_POSTGRES)

# Needs root (containerd, kubelet, the pod network); fails, never skips, where it cannot run.
.PHONY: test-e2e
test-e2e: venv controlplane ## end to end: the images, make install and helm install on a real node (containerd + kubelet)
	bash devtools/realnode/build.sh
	$(VENV)/bin/pytest e2e -v -s -p no:cacheprovider $(PYTEST_ARGS)

# BENCH_QUICK=1: a quick pass at small sizes (the figures are not the goals' sizes).
BENCH_TRIALS := $(or $(TRIALS),$(if $(BENCH_QUICK),10,30))
BENCH_BACKGROUND ?= $(if $(BENCH_QUICK),200,2000)
BENCH_N ?= $(if $(BENCH_QUICK),200,2000)
BENCH_GATED ?= $(if $(BENCH_QUICK),2000,20000)
BENCH_LEVELS ?= $(if $(BENCH_QUICK),200$(comma)500,1000$(comma)2500$(comma)5000)
comma := ,
# Each benchmark prints its figures and writes them to ~/.cache/agentrun/bench/ (outside the
# tree; docs/development.md, Benchmarks); a quick pass only prints them.
BENCH_OUT := $(if $(BENCH_QUICK),--out -)

.PHONY: bench
bench: venv controlplane kueue-build ## benchmarks: ledger cost; the store's CPU per eviction beside ten round trips of SELECT 1; a tenant's ledger writes while another floods the store API, and while one viewer opens 200 transcript follows; ledger writes during a retention purge of 100,000 records; trigger events accepted beside kubectl create; eviction latency idle and under load, throughput beside the Job controller; runs through a Kueue queue beside Jobs; the operator at rest at scale, and among 20,000 live runs held by a scheduling gate; one run a second with a TTL for 30 minutes beside Jobs with theirs; resume; status writes of live usage and approval latency; schedules; the transcript API's latency
	$(PY) bench/ledger.py $(BENCH_OUT)
	$(PY) bench/fence.py $(if $(BENCH_QUICK),--evictions 50,) $(BENCH_OUT)
	$(PY) bench/store_flood.py $(BENCH_OUT)
	$(PY) bench/follow_flood.py $(if $(BENCH_QUICK),--seconds 50 --writes 300,) $(BENCH_OUT)
	$(PY) bench/purge.py $(if $(BENCH_QUICK),--records 10000 --writes 300,) $(BENCH_OUT)
	$(PY) bench/trigger.py --events $(if $(BENCH_QUICK),100,1000) $(BENCH_OUT)
	$(PY) bench/eviction.py --trials $(BENCH_TRIALS) $(BENCH_OUT)
	$(PY) bench/eviction.py --trials $(BENCH_TRIALS) --background $(BENCH_BACKGROUND) $(BENCH_OUT)
	$(PY) bench/throughput.py --n $(BENCH_N) $(BENCH_OUT)
	$(PY) bench/queues.py --n $(if $(BENCH_QUICK),40,200) $(BENCH_OUT)
	$(PY) bench/scale.py --levels $(BENCH_LEVELS) $(BENCH_OUT)
	$(PY) bench/eviction.py --trials $(BENCH_TRIALS) --background $(BENCH_GATED) --background-pods gated --rest-window $(if $(BENCH_QUICK),60,330) $(BENCH_OUT)
	$(PY) bench/churn.py --minutes $(if $(BENCH_QUICK),3,30) $(BENCH_OUT)
	$(PY) bench/resume.py --trials $(if $(BENCH_QUICK),5,20) $(BENCH_OUT)
	$(PY) bench/outcome.py --runs $(if $(BENCH_QUICK),3,10) --approvals $(if $(BENCH_QUICK),5,20) $(BENCH_OUT)
	$(PY) bench/schedule.py --schedules $(if $(BENCH_QUICK),100,1000) --minutes $(if $(BENCH_QUICK),2,4) $(BENCH_OUT)
	$(PY) bench/transcript.py --trials $(if $(BENCH_QUICK),10,50) $(BENCH_OUT)

# Eviction latency on the real node (root; the cluster make test-e2e installs), beside the
# Job controller: ~/.cache/agentrun/bench/eviction-realnode-<time>.txt.
.PHONY: bench-real-node
bench-real-node: venv controlplane ## eviction -> Failed on a real kubelet and containerd, beside the Job controller
	bash devtools/realnode/build.sh
	$(PY) bench/eviction_realnode.py --trials $(or $(TRIALS),10) $(BENCH_OUT)

# The chaos soak (not part of `make test`): SOAK_RUNS runs under seeded faults, then the
# invariant checker; exits non-zero when a must-be-0 figure is not 0. SOAK_STORE=sqlite for
# the embedded store; the figures go to ~/.cache/agentrun/bench/soak-<store>-<time>.txt.
SOAK_RUNS ?= 200
SOAK_SEED ?= 1
SOAK_STORE ?= postgres
.PHONY: soak
soak: venv controlplane ## the chaos soak: many runs under operator kills, evictions, node loss, store restarts; prints the invariant figures
	$(PY) bench/soak.py --store $(SOAK_STORE) --runs $(SOAK_RUNS) --seed $(SOAK_SEED)
