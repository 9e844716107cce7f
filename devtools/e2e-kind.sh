#!/usr/bin/env bash
# make test-e2e: the eviction story on a kind cluster, with the real images.
# Needs a Docker engine and kind; skips (exit 0, with the reason) where they are absent.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! docker info >/dev/null 2>&1; then
  echo "test-e2e: SKIPPED — no Docker engine on this machine (kind needs one)."
  echo "          The same story runs against the real control plane in 'make test'."
  exit 0
fi
command -v kind >/dev/null || { echo "test-e2e: SKIPPED — kind is not installed (go install sigs.k8s.io/kind@v0.33.0)"; exit 0; }
cluster=agentrun-e2e
kind create cluster --name "$cluster" --wait 120s
trap 'kind delete cluster --name "$cluster"' EXIT
make docker-build
kind load docker-image --name "$cluster" agentrun/operator:dev agentrun/runner:dev
make install
make deploy HELM_ARGS="--set postgres.enabled=true --wait --timeout 5m"
kubectl create namespace e2e
kubectl -n agentrun-system get secret agentrun-store -o json \
  | python3 -c 'import json,sys; s=json.load(sys.stdin); print(json.dumps({"apiVersion":"v1","kind":"Secret","metadata":{"name":"agentrun-store","namespace":"e2e"},"data":s["data"]}))' \
  | kubectl apply -f -
kubectl -n e2e apply -f samples/agentrun-scripted.yaml
kubectl -n e2e wait --for=jsonpath='{.status.phase}'=Succeeded agentrun --all --timeout=300s
echo "test-e2e: passed"
