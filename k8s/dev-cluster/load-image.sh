#!/bin/bash
# Put locally built images into the dev cluster's private dockerd (there is no registry): `docker save` from the
# machine's Docker Engine ($DOCKER_HOST or its default socket) piped into `docker load` of the cluster's engine.
# An image whose ID the cluster already has is skipped. Pods then use it with imagePullPolicy Never or IfNotPresent.
#   k8s/dev-cluster/load-image.sh agentrl/python:latest [IMAGE ...]
set -euo pipefail
P=${AGENTRL_K8S_DIR:-$HOME/.cache/agentrl/k8s}
SOCK=$P/docker/docker.sock
[ $# -gt 0 ] || { echo "usage: $0 IMAGE [IMAGE ...]" >&2; exit 2; }
[ -S "$SOCK" ] || { echo "load-image: the dev cluster's dockerd is not running ($SOCK): run k8s/dev-cluster/up.sh" >&2; exit 1; }
for image in "$@"; do
  src=$(docker image inspect -f '{{.Id}}' "$image" 2>/dev/null) || {
    echo "load-image: $image is not in the local Docker Engine: build it first (e.g. sandbox_images/build.sh)" >&2
    exit 1; }
  dst=$(docker -H "unix://$SOCK" image inspect -f '{{.Id}}' "$image" 2>/dev/null || true)
  if [ "$src" = "$dst" ]; then echo "load-image: $image already loaded" >&2; continue; fi
  s=$(date +%s)
  docker save "$image" | docker -H "unix://$SOCK" load -q >/dev/null
  echo "load-image: loaded $image in $(( $(date +%s) - s ))s" >&2
done
# the images a reload replaced are dangling now: free their disk (the kubelet evicts pods when the disk runs low)
docker -H "unix://$SOCK" image prune -f >/dev/null 2>&1 || true
