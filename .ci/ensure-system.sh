#!/usr/bin/env bash
# Install the system packages agentrl's commands need, when they are missing. Shared by the Makefile and .ci/run.
#
#   .ci/ensure-system.sh [--require C1,C2,...] [--want C3,...]
#
# Components (what is checked -> the Debian/Ubuntu package installed when it is missing):
#   venv     .venv exists or `python3 -m venv` works -> python3-venv
#   bwrap    bubblewrap, the local sandbox          -> bubblewrap
#   browser  Chromium for the HTML-report test      -> chromium
#   docker   Docker Engine + the sandbox images     -> .ci/docker-setup.sh (docker.io, debootstrap, offline images)
#
# Installs as root with apt-get, otherwise with `sudo -n`, otherwise prints the exact command to run. A missing
# `--require` component is an error (exit 1); a missing `--want` component is a warning (its test tier then skips
# with the reason). AGENTRL_REQUIRE_<X>=1 (X = BWRAP, BROWSER, DOCKER) moves that component to the required ones.
# AGENTRL_SYSTEM_PACKAGES=0 only checks and prints what to install, without installing anything.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

say() { echo "ensure-system: $*" >&2; }

require=() want=()
while [ $# -gt 0 ]; do
  case "$1" in
    --require) IFS=, read -r -a more <<<"$2"; require+=("${more[@]}"); shift 2 ;;
    --want) IFS=, read -r -a more <<<"$2"; want+=("${more[@]}"); shift 2 ;;
    *) say "unknown argument $1 (usage: $0 [--require C,...] [--want C,...])"; exit 2 ;;
  esac
done
[ "${AGENTRL_REQUIRE_BWRAP:-}" = 1 ] && require+=(bwrap)
[ "${AGENTRL_REQUIRE_BROWSER:-}" = 1 ] && require+=(browser)
[ "${AGENTRL_REQUIRE_DOCKER:-}" = 1 ] && require+=(docker)

python_bin() { command -v python3 || command -v python || true; }

present() {  # present COMPONENT -> exit 0 when this machine has it
  case "$1" in
    venv)
      [ -x "${VENV:-.venv}/bin/python" ] && return 0
      local py tmp ok=1; py="$(python_bin)"; [ -n "$py" ] || return 1
      tmp="$(mktemp -d)"; "$py" -m venv "$tmp/v" >/dev/null 2>&1 && ok=0; rm -rf "$tmp"; return "$ok" ;;
    bwrap) command -v bwrap >/dev/null ;;
    browser) [ -n "${AGENTRL_CHROMIUM:-}" ] || command -v chromium >/dev/null || command -v chromium-browser >/dev/null \
               || command -v google-chrome >/dev/null ;;
    docker) command -v docker >/dev/null && docker info >/dev/null 2>&1 \
              && docker image inspect agentrl/python:latest >/dev/null 2>&1 ;;
    *) say "unknown component '$1' (venv, bwrap, browser, docker)"; exit 2 ;;
  esac
}

package_of() {
  case "$1" in venv) echo python3-venv ;; bwrap) echo bubblewrap ;; browser) echo chromium ;; esac
}

# How to run a command as root here: "" (we are root), "sudo -n", or "none".
root_prefix() {
  if [ "$(id -u)" = 0 ]; then echo ""
  elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then echo "sudo -n"
  else echo none
  fi
}

is_required() { local c; for c in "${require[@]}"; do [ "$c" = "$1" ] && return 0; done; return 1; }

missing=() packages=() docker_missing=0
for c in "${require[@]}" "${want[@]}"; do
  case " ${missing[*]} " in *" $c "*) continue ;; esac
  present "$c" && continue
  missing+=("$c")
  if [ "$c" = docker ]; then docker_missing=1; else packages+=("$(package_of "$c")"); fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

prefix="$(root_prefix)"
hint_prefix="${prefix:-}"
[ "$prefix" = none ] && hint_prefix=sudo
install_cmd="${hint_prefix:+$hint_prefix }apt-get install -y ${packages[*]}"

if [ ${#packages[@]} -gt 0 ]; then
  if [ "${AGENTRL_SYSTEM_PACKAGES:-1}" = 0 ]; then
    say "missing ${packages[*]} (AGENTRL_SYSTEM_PACKAGES=0: not installing); run: $install_cmd"
  elif ! command -v apt-get >/dev/null; then
    say "missing ${packages[*]} and there is no apt-get here: install them with your package manager"
  elif [ "$prefix" = none ]; then
    say "missing ${packages[*]}; not root and 'sudo -n' is not available. Run:"
    say "    ${hint_prefix} apt-get update && $install_cmd"
  else
    say "installing ${packages[*]} (${prefix:-as root}: apt-get install)"
    if ! { $prefix apt-get update -qq && $prefix apt-get install -y -qq "${packages[@]}" >/dev/null; }; then
      say "apt-get install failed; run: ${hint_prefix:+$hint_prefix }apt-get update && $install_cmd"
    fi
  fi
fi
if [ "$docker_missing" = 1 ]; then
  if [ "${AGENTRL_SYSTEM_PACKAGES:-1}" != 0 ] && [ "$prefix" != none ]; then
    bash .ci/docker-setup.sh || say "docker-setup failed (see above)"
  else
    say "no Docker Engine with the sandbox images; run (as root): bash .ci/docker-setup.sh"
  fi
fi

status=0
for c in "${missing[@]}"; do
  present "$c" && continue
  if is_required "$c"; then
    say "required component '$c' is still missing"
    status=1
  else
    say "'$c' is missing: its tests skip with the reason (agentrl doctor shows the fix)"
  fi
done
exit "$status"
