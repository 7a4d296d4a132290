#!/bin/bash
# Hollow nodes for the dev cluster (kubemark, built from the same Debian source tree: build.sh kubemark): each is a
# real kubelet with a fake container runtime and a fake cAdvisor. It registers as a node; the real API server,
# scheduler and controllers place pods on it and see them run. Used by benchmarks/bench_k8s_scale.py to run
# thousands of sandbox pods on one machine; only the kubelets and the containers are simulated.
#
#   k8s/dev-cluster/hollow-nodes.sh up N      start N hollow nodes (hollow-0 .. hollow-N-1), wait until all are Ready
#   k8s/dev-cluster/hollow-nodes.sh down      stop them and delete their Node objects (and the pods bound there)
#
# Environment (defaults in brackets): AGENTRL_HOLLOW_POD_IP [127.0.0.1] every pod's IP (a simulated agent listens
# there), AGENTRL_HOLLOW_MAX_PODS [250] pods per node, AGENTRL_HOLLOW_CPUS [250], AGENTRL_HOLLOW_MEMORY_MB [65536] and
# AGENTRL_HOLLOW_DISK_MB [1048576] the node's capacity. Nodes are labelled and tainted agentrl.io/hollow=true (NoSchedule): only pods that tolerate
# and select it land there, never anything else of the cluster. They talk to the API server with the admin
# kubeconfig (a hollow node is not a real node identity, so the Node authorizer's per-node rules do not apply).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
P=${AGENTRL_K8S_DIR:-$HOME/.cache/agentrl/k8s}
R=$P/run/hollow
export KUBECONFIG=$P/pki/admin.kubeconfig PATH=$PATH:$P/bin
say() { echo "hollow-nodes: $*" >&2; }

start_missing() {  # N: start every hollow node of 0..N-1 whose process is not running (again, if it died)
  local n=$1 i
  for ((i = 0; i < n; i++)); do
    [ -f "$R/hollow-$i.pid" ] && kill -0 "$(cat "$R/hollow-$i.pid")" 2>/dev/null && continue
    mkdir -p "$R/tmp-$i"
    TMPDIR=$R/tmp-$i AGENTRL_DEV_NODE_CPUS=${AGENTRL_HOLLOW_CPUS:-250} \
      AGENTRL_HOLLOW_POD_IP=${AGENTRL_HOLLOW_POD_IP:-127.0.0.1} AGENTRL_HOLLOW_MAX_PODS=${AGENTRL_HOLLOW_MAX_PODS:-250} \
      AGENTRL_HOLLOW_MEMORY_MB=${AGENTRL_HOLLOW_MEMORY_MB:-65536} AGENTRL_HOLLOW_DISK_MB=${AGENTRL_HOLLOW_DISK_MB:-1048576} \
      AGENTRL_HOLLOW_EXIT_AT_ONCE=agentrl-init \
      setsid "$P/bin/kubemark" --morph=kubelet --name="hollow-$i" --kubeconfig="$KUBECONFIG" \
      --kubelet-port=$((20250 + 2 * i)) --kubelet-read-only-port=0 \
      --node-labels=agentrl.io/hollow=true --register-with-taints=agentrl.io/hollow=true:NoSchedule \
      > "$P/logs/hollow-$i.log" 2>&1 < /dev/null &
    echo $! > "$R/hollow-$i.pid"
  done
}

up() {
  local n=$1
  [ -x "$P/bin/kubemark" ] || { say "building kubemark (once per machine, ~3 min)"; bash "$HERE/build.sh" kubemark; }
  mkdir -p "$R" "$P/logs"
  start_missing "$n"
  local t0; t0=$(date +%s)
  while :; do
    # kubemark can exit at start when its kubelet dials the fake runtime's socket before it listens ("get remote
    # runtime typed version failed"): start any that died again
    start_missing "$n"
    local ready
    ready=$(kubectl get nodes -l agentrl.io/hollow=true --no-headers 2>/dev/null | awk '$2 == "Ready"' | wc -l)
    [ "$ready" -ge "$n" ] && { say "$ready hollow nodes Ready in $(( $(date +%s) - t0 ))s"; return 0; }
    [ $(( $(date +%s) - t0 )) -gt 300 ] && { say "only $ready of $n hollow nodes Ready after 300s; see $P/logs/hollow-*.log"; exit 1; }
    sleep 2
  done
}

down() {
  local f pids=() i
  for f in "$R"/hollow-*.pid; do
    [ -f "$f" ] || continue
    pids+=("$(cat "$f")")
    kill "${pids[-1]}" 2>/dev/null || true
    rm -f "$f"
  done
  for ((i = 0; i < 30; i++)); do  # a hollow kubelet still running re-registers its Node after the delete below
    local alive=0 p
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.5
  done
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  # wait until the Node objects are gone: a delete still in flight when the next `up` registers the same names removes
  # the new nodes, and the pod garbage collector then deletes every pod bound to them (pods churn, the fill stalls)
  kubectl delete nodes -l agentrl.io/hollow=true --timeout=120s >/dev/null 2>&1 || true
  rm -rf "$R"/tmp-*
  say "stopped"
}

case ${1:-} in
  up) up "${2:?usage: hollow-nodes.sh up N}" ;;
  down) down ;;
  *) echo "usage: hollow-nodes.sh up N | down" >&2; exit 2 ;;
esac
