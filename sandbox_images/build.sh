#!/usr/bin/env bash
# Build every sandbox image: sandbox_images/<name>/Dockerfile -> agentrl/<name>:latest.
#
#   sandbox_images/build.sh                 build from the Dockerfiles' default public base (needs a registry)
#   sandbox_images/build.sh --offline-base  first make agentrl/base:<suite> with debootstrap + docker import (needs
#                                           only a Debian mirror, no registry), then build every image on top of it
#
# Options:
#   --offline-base       build (if missing) and use the debootstrap base image
#   --rebuild-base       with --offline-base: rebuild the base image even if it exists
#   --base-image IMAGE   build on IMAGE instead (passed as --build-arg BASE_IMAGE=IMAGE)
#   --suite SUITE        Debian suite for the offline base (default: bookworm)
#   --mirror URL         Debian mirror (default: $DEBIAN_MIRROR or http://deb.debian.org/debian)
#   --only NAME          build only sandbox_images/NAME
# Needs root for debootstrap (apt-get install debootstrap) and a running Docker Engine.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
offline=0
rebuild_base=0
base_image=""
suite="bookworm"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
only=""
# python3-pytest pulls pytest's dependencies from Debian, so the image build itself needs no network.
base_packages="python3,python3-pytest"

usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
  case "$1" in
    --offline-base) offline=1 ;;
    --rebuild-base) rebuild_base=1 ;;
    --base-image) base_image="${2:?--base-image needs an image name}"; shift ;;
    --suite) suite="${2:?--suite needs a Debian suite name}"; shift ;;
    --mirror) mirror="${2:?--mirror needs a URL}"; shift ;;
    --only) only="${2:?--only needs an image folder name}"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "build.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

if ! docker info >/dev/null 2>&1; then
  echo "build.sh: the Docker Engine is not reachable (start dockerd, or run .ci/docker-setup.sh)" >&2
  exit 1
fi

make_offline_base() {
  local tag="$1"
  if ! command -v debootstrap >/dev/null; then
    echo "build.sh: --offline-base needs debootstrap (apt-get install -y debootstrap)" >&2
    exit 1
  fi
  if [ "$(id -u)" != 0 ]; then
    echo "build.sh: --offline-base runs debootstrap, which needs root" >&2
    exit 1
  fi
  local root
  root="$(mktemp -d "${TMPDIR:-/tmp}/agentrl-base.XXXXXX")"
  # shellcheck disable=SC2064
  trap "rm -rf '$root'" EXIT
  echo "build.sh: debootstrap $suite ($base_packages) from $mirror"
  debootstrap --variant=minbase --include="$base_packages" "$suite" "$root" "$mirror" >"$root.log" 2>&1 || {
    echo "build.sh: debootstrap failed; last lines of $root.log:" >&2
    tail -n 20 "$root.log" >&2
    exit 1
  }
  rm -f "$root.log"
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/tmp/*
  echo "build.sh: docker import -> $tag"
  tar -C "$root" --numeric-owner -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/bin/bash"]' \
    - "$tag" >/dev/null
  rm -rf "$root"
  trap - EXIT
}

if [ "$offline" = 1 ]; then
  [ -n "$base_image" ] && { echo "build.sh: use either --offline-base or --base-image, not both" >&2; exit 2; }
  base_image="agentrl/base:$suite"
  if [ "$rebuild_base" = 1 ] || ! docker image inspect "$base_image" >/dev/null 2>&1; then
    make_offline_base "$base_image"
  else
    echo "build.sh: using existing $base_image (--rebuild-base to remake it)"
  fi
fi

built=0
for dockerfile in "$here"/*/Dockerfile; do
  dir="$(dirname "$dockerfile")"
  name="$(basename "$dir")"
  [ -n "$only" ] && [ "$name" != "$only" ] && continue
  args=(build -t "agentrl/$name:latest")
  [ -n "$base_image" ] && args+=(--build-arg "BASE_IMAGE=$base_image")
  echo "build.sh: docker ${args[*]} $dir"
  docker "${args[@]}" "$dir"
  built=$((built + 1))
done
if [ "$built" = 0 ]; then
  echo "build.sh: no image folder matched${only:+ '$only'} under $here" >&2
  exit 1
fi
echo "build.sh: built $built image(s)"
