#!/bin/bash
# Stop the dev cluster that up.sh started and leave the host as it was: processes by their recorded PID only (never
# by name), the pod containers in the private dockerd, the kubelet's mounts under the cluster directory, the bridge,
# and the kubelet's cgroups. Keeps the cache (binaries, PKI, loaded images) so the next up.sh is warm.
# `down.sh --purge` also deletes the whole cluster directory (the next up.sh builds again).
set -uo pipefail
P=${AGENTRL_K8S_DIR:-$HOME/.cache/agentrl/k8s}
BRIDGE=${AGENTRL_K8S_BRIDGE:-agentrl-k8s0}
CGROUP_ROOT=/agentrl-k8s
R=$P/run D=$P/docker
T0=$(date +%s)
say() { echo "down: $*" >&2; }

stop_pid() {  # NAME: TERM, then KILL after 15 s, the process recorded by up.sh
  local f=$R/$1.pid pid i
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for ((i = 0; i < 30; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    if kill -0 "$pid" 2>/dev/null; then say "SIGKILL $1 ($pid)"; kill -9 "$pid"; sleep 0.5; fi
    say "stopped $1 ($pid)"
  fi
  rm -f "$f"
}

remove_containers() {  # pod containers die with the kubelet gone only if removed: ask the private dockerd
  [ -S "$D/docker.sock" ] && [ -f "$R/dockerd.pid" ] || return 0
  local ids
  ids=$(docker -H "unix://$D/docker.sock" ps -aq 2>/dev/null)
  [ -n "$ids" ] || return 0
  # shellcheck disable=SC2086
  docker -H "unix://$D/docker.sock" rm -f $ids >/dev/null 2>&1 && say "removed $(echo $ids | wc -w) containers"
}

unmount_all() {  # tmpfs/secret volumes of the kubelet and overlay mounts of the dockerd under $P, deepest first
  awk -v p="$P/" 'index($2, p) == 1 {print $2}' /proc/mounts | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m"
  done
}

remove_cgroups() {  # the kubelet's pod cgroups (empty once the containers are gone), deepest first
  local d
  for d in /sys/fs/cgroup/*/"${CGROUP_ROOT#/}" /sys/fs/cgroup/"${CGROUP_ROOT#/}"; do
    [ -d "$d" ] || continue
    find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null
    [ -d "$d" ] && say "cgroup $d is still in use"
  done
  return 0
}

for f in "$R"/hollow/hollow-*.pid; do  # kubemark hollow nodes (hollow-nodes.sh), if any run
  [ -f "$f" ] || continue
  kill "$(cat "$f")" 2>/dev/null && say "stopped $(basename "$f" .pid)"
  rm -f "$f"
done
stop_pid kubelet
remove_containers
stop_pid dockerd
for n in kube-scheduler kube-controller-manager kube-apiserver etcd; do stop_pid "$n"; done
unmount_all
remove_cgroups
if ip link show "$BRIDGE" >/dev/null 2>&1; then ip link del "$BRIDGE" && say "deleted bridge $BRIDGE"; fi
if [ "${1:-}" = --purge ]; then rm -rf "$P" && say "deleted $P"; fi
say "done in $(( $(date +%s) - T0 ))s"
