#!/usr/bin/env bash
# Build the agentrl image for rollout Jobs inside the dev cluster (k8s/overlays/dev-cluster) with no network during
# `docker build`: agentrl/agentrl:dev-cluster from k8s/Dockerfile.offline on the debootstrap base agentrl/base:bookworm.
#
#   sandbox_images/build-agentrl-image.sh                 build (reuses the cached wheelhouse and Docker's layer cache)
#   sandbox_images/build-agentrl-image.sh --load          ... and load it into the dev cluster (k8s/dev-cluster/load-image.sh)
#   sandbox_images/build-agentrl-image.sh --if-missing    do nothing when the image exists already
#
# Steps: (1) the base image (sandbox_images/build.sh --offline-base, debootstrap; needs a Debian mirror once);
# (2) a wheelhouse of every runtime dependency under $AGENTRL_CACHE/wheelhouse (default ~/.cache/agentrl/wheelhouse):
# filled once with `pip wheel` from the package index, offline (`--no-index`) on later builds; (3) the agentrl and
# code_tests wheels from this checkout; (4) the embedded model, converted on this machine once
# (agentrl.engine.models) and copied into the image, so pods download nothing; (5) `docker build` of a staged
# context. Environment: PYTHON (a python with this checkout importable and pip; default python3), IMAGE (the tag).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"
cache="${AGENTRL_CACHE:-$HOME/.cache/agentrl}"
wheelhouse="$cache/wheelhouse"
ctx="$cache/agentrl-image-context"
image="${IMAGE:-agentrl/agentrl:dev-cluster}"
base="agentrl/base:bookworm"
py="${PYTHON:-python3}"
load=0
if_missing=0
T0=$(date +%s)
say() { echo "build-agentrl-image: [+$(( $(date +%s) - T0 ))s] $*" >&2; }
die() { echo "build-agentrl-image: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
  case "$1" in
    --load) load=1 ;;
    --if-missing) if_missing=1 ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
  shift
done

docker info >/dev/null 2>&1 || die "the Docker Engine is not reachable (start dockerd, or run .ci/docker-setup.sh)"
"$py" -c 'import agentrl' 2>/dev/null || die "$py cannot import agentrl: set PYTHON to the project's venv python"

load_into_cluster() { [ "$load" = 1 ] && "$repo/k8s/dev-cluster/load-image.sh" "$image"; return 0; }

if [ "$if_missing" = 1 ] && docker image inspect "$image" >/dev/null 2>&1; then
  say "$image exists (--if-missing)"
  load_into_cluster
  exit 0
fi

# (1) the debootstrap base (python3 from Debian); build.sh also builds the python sandbox image on it
if ! docker image inspect "$base" >/dev/null 2>&1; then
  say "no $base: sandbox_images/build.sh --offline-base --only python"
  "$here/build.sh" --offline-base --only python >&2
fi

# (2) runtime requirements: agentrl's and code_tests' dependencies, the [train] extra (trl, peft, datasets: the rank
# Jobs of k8s/overlays/dev-cluster-train run `agentrl train`), CPU torch, the kubernetes client, pip itself
rm -rf "$ctx" && mkdir -p "$ctx/agentrl-wheels" "$wheelhouse"
"$py" - "$repo" > "$ctx/requirements.txt" <<'PY'
import sys, tomllib
from pathlib import Path
repo = Path(sys.argv[1])
reqs = ["pip", "torch==2.13.0"]  # torch 2.13.0 first: the CPU build
for pyproject in (repo / "pyproject.toml", repo / "envs/code_tests/pyproject.toml"):
    project = tomllib.loads(pyproject.read_text())["project"]
    extras = project.get("optional-dependencies", {})
    reqs += [r for r in project["dependencies"] if not r.startswith("agentrl")]
    reqs += extras.get("train", [])
    reqs += [r for r in extras.get("k8s", []) if r.startswith("kubernetes>")]
print("\n".join(dict.fromkeys(reqs)))
PY
if "$py" -m pip wheel -q --no-index --find-links "$wheelhouse" -w "$wheelhouse" -r "$ctx/requirements.txt" >/dev/null 2>&1
then
  say "wheelhouse $wheelhouse complete (offline)"
else
  say "filling the wheelhouse $wheelhouse from the package index (once)"
  "$py" -m pip wheel -q --find-links "$wheelhouse" -w "$wheelhouse" -r "$ctx/requirements.txt" 2>&1 \
    | grep -v "^WARNING: Location" >&2 || true
  "$py" -m pip wheel -q --no-index --find-links "$wheelhouse" -w "$wheelhouse" -r "$ctx/requirements.txt" >/dev/null \
    || die "the wheelhouse $wheelhouse is incomplete after pip wheel (see the errors above)"
fi
cp -al "$wheelhouse" "$ctx/wheelhouse"

# (3) agentrl and the code_tests env from this checkout (no build isolation: no index needed). Fixed zip timestamps:
# an unchanged checkout gives the same layer, hence the same image ID, and load-image.sh skips reloading it.
SOURCE_DATE_EPOCH=315532800 "$py" -m pip wheel -q --no-deps --no-build-isolation -w "$ctx/agentrl-wheels" "$repo" "$repo/envs/code_tests" \
  >/dev/null 2>"$cache/agentrl-wheel.log" || { cat "$cache/agentrl-wheel.log" >&2; die "building the agentrl wheels failed"; }
cp -l "$wheelhouse"/pip-*.whl "$ctx/agentrl-wheels/"
rm -rf "$repo/build" "$repo/envs/code_tests/build"  # setuptools' scratch dirs

# (4) the embedded model, converted here once
model="$("$py" -c 'from agentrl.engine.models import ensure_embedded_model; print(ensure_embedded_model())')"
cp -al "$model" "$ctx/model" 2>/dev/null || cp -a "$model" "$ctx/model"
cp "$repo/k8s/Dockerfile.offline" "$ctx/Dockerfile"

# (5) docker build: no network inside the build
say "docker build -t $image (network none)"
previous="$(docker image inspect -f '{{.Id}}' "$image" 2>/dev/null || true)"
docker build --network none --build-arg "BASE_IMAGE=$base" -t "$image" "$ctx" >&2
# a rebuild leaves the image it replaced untagged (~1.6 GB each): remove it unless something still uses it
if [ -n "$previous" ] && [ "$previous" != "$(docker image inspect -f '{{.Id}}' "$image")" ]; then
  docker image rm "$previous" >/dev/null 2>&1 || true
fi
rm -rf "$ctx"
say "built $image ($(docker image inspect -f '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1/1e6}'))"
load_into_cluster
