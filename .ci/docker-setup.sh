#!/usr/bin/env bash
# Make a Docker Engine and the sandbox images available for the docker test tier.
#
# Idempotent: installs docker.io (and debootstrap) only if missing, starts dockerd in the background only if no
# engine answers, waits for `docker info`, and builds the images (offline base: debootstrap + docker import, no
# registry) only if agentrl/python:latest is missing. Works as root on a fresh Debian machine and on one whose
# dockerd already runs. Environment:
#   AGENTRL_DOCKERD_LOG      where a dockerd started here logs (default: /var/log/agentrl-dockerd.log)
#   AGENTRL_DOCKER_WAIT_S    how long to wait for the engine (default: 60)
#   AGENTRL_REBUILD_IMAGES=1 rebuild the sandbox images even if they exist
set -euo pipefail
cd "$(dirname "$0")/.."

log="${AGENTRL_DOCKERD_LOG:-/var/log/agentrl-dockerd.log}"
wait_s="${AGENTRL_DOCKER_WAIT_S:-60}"
export DEBIAN_FRONTEND=noninteractive

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo -n "$@"; fi
}

need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v debootstrap >/dev/null || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
  echo "docker-setup: apt-get install ${need[*]}"
  as_root apt-get update -qq
  as_root apt-get install -y -qq "${need[@]}" >/dev/null
fi

if docker info >/dev/null 2>&1; then
  echo "docker-setup: Docker Engine already running"
else
  # Only the default engine counts: another dockerd (k8s/dev-cluster runs its own, on its own socket) is not it.
  pidfile=/var/run/docker.pid
  if ! { [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }; then
    echo "docker-setup: starting dockerd (log: $log)"
    # setsid -f: the daemon is detached into its own session and outlives this script (no shell waits on it).
    as_root setsid -f dockerd >"$log" 2>&1 < /dev/null
  else
    echo "docker-setup: dockerd is starting; waiting for it"
  fi
  deadline=$((SECONDS + wait_s))
  until docker info >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "docker-setup: the Docker Engine did not answer within ${wait_s}s; last lines of $log:" >&2
      tail -n 30 "$log" >&2 || true
      exit 1
    fi
    sleep 1
  done
  echo "docker-setup: Docker Engine is up"
fi

if [ "${AGENTRL_REBUILD_IMAGES:-0}" = 1 ] || ! docker image inspect agentrl/python:latest >/dev/null 2>&1; then
  as_root sandbox_images/build.sh --offline-base
else
  echo "docker-setup: image agentrl/python:latest present (AGENTRL_REBUILD_IMAGES=1 to rebuild)"
fi
