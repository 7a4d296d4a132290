#!/usr/bin/env bash
# End to end on a local kind cluster: a small rollout (2 `agentrl rollout` workers on CPU with the embedded model,
# code_tests, sandboxes as pods from one shared warm pool), then checks that it finished, that its trajectories were
# written, and that no sandbox pod is left. Optionally runs the `k8s` test tier against the same cluster.
#
#   k8s/e2e.sh                 create (or reuse) kind cluster "agentrl", build + load images, run, check, delete
#   KEEP=1 k8s/e2e.sh          keep the cluster afterwards (kubectl --context kind-agentrl -n agentrl ...)
#   RUN_TESTS=1 k8s/e2e.sh     also run `pytest -m k8s tests/k8s` against it (routes the pod CIDR to the node:
#                              needs root; the test process reaches sandbox pods at their pod IPs)
#
# Needs: docker (running), kind, kubectl, and images buildable here (sandbox_images/build.sh; k8s/Dockerfile).
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
cluster="${CLUSTER:-agentrl}"
ctx="kind-${cluster}"
timeout_s="${TIMEOUT_S:-1800}"
k() { kubectl --context "$ctx" "$@"; }

for tool in docker kind kubectl; do
  command -v "$tool" >/dev/null || { echo "e2e.sh: $tool is not installed" >&2; exit 2; }
done

if ! kind get clusters | grep -qx "$cluster"; then
  kind create cluster --name "$cluster" --wait 120s
fi
cleanup() { if [ "${KEEP:-0}" != 1 ]; then kind delete cluster --name "$cluster"; fi; }
trap cleanup EXIT

echo "== images"
docker image inspect agentrl/python:latest >/dev/null 2>&1 || "$here/sandbox_images/build.sh" --only python
docker build -q -f "$here/k8s/Dockerfile" -t agentrl/agentrl:latest "$here" >/dev/null
kind load docker-image --name "$cluster" agentrl/python:latest agentrl/agentrl:latest

echo "== apply k8s/overlays/kind"
k delete job -n agentrl agentrl-rollout --ignore-not-found
k apply -k "$here/k8s/overlays/kind"

echo "== wait for the rollout job (at most ${timeout_s}s)"
deadline=$(( $(date +%s) + timeout_s ))
while :; do
  done_=$(k get job -n agentrl agentrl-rollout -o jsonpath='{.status.succeeded}')
  failed=$(k get job -n agentrl agentrl-rollout -o jsonpath='{.status.failed}')
  [ "${done_:-0}" = 2 ] && break
  if [ "${failed:-0}" != 0 ] && [ "${failed:-0}" != "" ]; then
    k logs -n agentrl -l app.kubernetes.io/name=agentrl-rollout --tail=50 || true
    echo "e2e.sh: the rollout job failed" >&2; exit 1
  fi
  [ "$(date +%s)" -lt "$deadline" ] || { echo "e2e.sh: timed out" >&2; exit 1; }
  sleep 5
done
k logs -n agentrl -l app.kubernetes.io/name=agentrl-rollout --tail=-1 | tee /tmp/agentrl-e2e.log

echo "== checks"
n=$(grep -o '"trajectories": *[0-9]*' /tmp/agentrl-e2e.log | awk -F: '{s+=$2} END {print s+0}')
[ "$n" -ge 16 ] || { echo "e2e.sh: expected >= 16 trajectories in the summaries, got $n" >&2; exit 1; }
for _ in $(seq 30); do
  left=$(k get pods -n agentrl -l agentrl.io/role=sandbox --no-headers 2>/dev/null | wc -l)
  [ "$left" = 0 ] && break
  sleep 2
done
[ "$left" = 0 ] || { k get pods -n agentrl -l agentrl.io/role=sandbox; echo "e2e.sh: sandbox pods left" >&2; exit 1; }
echo "ok: $n trajectories, no sandbox pod left"

if [ "${RUN_TESTS:-0}" = 1 ]; then
  echo "== k8s test tier"
  node_ip=$(docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "${cluster}-control-plane")
  pod_cidr=$(k get node "${cluster}-control-plane" -o jsonpath='{.spec.podCIDR}')
  ip route replace "$pod_cidr" via "$node_ip"
  kubeconfig=$(mktemp)
  kind get kubeconfig --name "$cluster" > "$kubeconfig"
  # a namespace without k8s/base's network policy: the test process is not a rollout pod
  k create namespace agentrl-test --dry-run=client -o yaml | k apply -f -
  (cd "$here" && KUBECONFIG="$kubeconfig" AGENTRL_K8S_NAMESPACE=agentrl-test AGENTRL_REQUIRE_K8S=1 \
     .venv/bin/python -m pytest -m k8s tests/k8s -q)
fi
