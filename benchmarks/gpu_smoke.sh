#!/usr/bin/env bash
# GPU smoke test of the SGLang path (default) or the vLLM path (ENGINE=vllm). STATUS: NOT YET RUN, either path (no
# GPU was available when it was written; every step was exercised on CPU against the stand-in servers,
# `agentrl engine serve [--api vllm]`, instead of SGLang / vLLM).
#
# On a machine with one NVIDIA GPU:
#   1. starts SGLang 0.5.23 (its own venv: it pins torch 2.14.1 / transformers 5.19) with a small model, RL flags,
#      or, with ENGINE=vllm, `VLLM_SERVER_DEV_MODE=1 vllm serve` 0.33.0 (its own venv) with the flags agentrl needs,
#   2. runs a short multi-turn code_tests rollout through agentrl (--engine sglang),
#   3. updates the weights on the server (/update_weights_from_disk, version 1) and runs the rollout again,
#   4. prints tokens/s, the cached-token ratio of turns after the first, and the logprob agreement between SGLang
#      and a transformers recomputation (what the trainer computes) for both weight versions.
#
# Needs (set as environment variables, or the defaults below):
#   ENGINE          sglang (default) or vllm
#   SGLANG_PYTHON   python of a venv with `pip install "sglang==0.5.23"`           (default: .venv-sglang/bin/python)
#   VLLM_PYTHON     python of a venv with `pip install "vllm==0.33.0"`             (default: .venv-vllm/bin/python)
#   AGENTRL_PYTHON  python of agentrl's venv (with a CUDA torch for the recomputation) (default: .venv/bin/python)
#   MODEL           HF checkpoint dir the server loads (default: the embedded SmolLM2-135M-Instruct, converted once)
#   PORT (30000), TASKS (8), GROUP (4), WORK (a temp dir), DEVICE (cuda)
# Usage: bash benchmarks/gpu_smoke.sh            ENGINE=vllm bash benchmarks/gpu_smoke.sh
set -euo pipefail

cd "$(dirname "$0")/.."
ENGINE=${ENGINE:-sglang}
SGLANG_PYTHON=${SGLANG_PYTHON:-.venv-sglang/bin/python}
VLLM_PYTHON=${VLLM_PYTHON:-.venv-vllm/bin/python}
AGENTRL_PYTHON=${AGENTRL_PYTHON:-.venv/bin/python}
PORT=${PORT:-30000}
TASKS=${TASKS:-8}
GROUP=${GROUP:-4}
DEVICE=${DEVICE:-cuda}
WORK=${WORK:-$(mktemp -d -t agentrl-gpu-smoke-XXXXXX)}
URL="http://127.0.0.1:${PORT}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

command -v nvidia-smi >/dev/null || { echo "gpu_smoke: no nvidia-smi: this needs a GPU machine" >&2; exit 2; }
if [ "$ENGINE" = vllm ]; then
  "$VLLM_PYTHON" -c "import vllm; assert vllm.__version__ == '0.33.0', vllm.__version__" || {
    echo "gpu_smoke: $VLLM_PYTHON has no vllm 0.33.0: python -m venv .venv-vllm && \
.venv-vllm/bin/pip install 'vllm==0.33.0'" >&2; exit 2; }
else
  "$SGLANG_PYTHON" -c "import sglang; assert sglang.__version__ == '0.5.23', sglang.__version__" || {
    echo "gpu_smoke: $SGLANG_PYTHON has no sglang 0.5.23: python -m venv .venv-sglang && \
.venv-sglang/bin/pip install 'sglang==0.5.23'" >&2; exit 2; }
fi
MODEL=${MODEL:-$("$AGENTRL_PYTHON" -c "from agentrl.engine.models import resolve_model; print(resolve_model(None))")}
echo "gpu_smoke: engine $ENGINE, model $MODEL, work dir $WORK"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader

if [ "$ENGINE" = vllm ]; then
  # vLLM flags (docs/vllm.md): dev mode for /pause, /collective_rpc reload_weights, /update_weight_version,
  # /weight_info; processed logprobs = log_softmax(logits / T) (the default raw_logprobs ignores T); prefix caching
  # on (the default) so later turns reuse their prefix; prompt-token details report cached_tokens per turn; the
  # checkpoint's generation_config is not applied (agentrl sends every sampling field anyway).
  VLLM_SERVER_DEV_MODE=1 "$VLLM_PYTHON" -m vllm.entrypoints.cli.main serve "$MODEL" --host 127.0.0.1 \
    --port "$PORT" --gpu-memory-utilization 0.6 --max-model-len 8192 --max-num-seqs 128 \
    --logprobs-mode processed_logprobs --enable-prefix-caching --enable-prompt-tokens-details \
    --generation-config vllm --uvicorn-log-level warning >"$WORK/server.log" 2>&1 &
  READY="$URL/health"
else
  # RL flags: radix cache stays on (the default; no --disable-radix-cache) so later turns reuse their prefix;
  # chunked prefill bounds the prefill batch of long agent contexts; integer weight versions tag every token.
  "$SGLANG_PYTHON" -m sglang.launch_server --model-path "$MODEL" --host 127.0.0.1 --port "$PORT" \
    --mem-fraction-static 0.6 --chunked-prefill-size 8192 --max-running-requests 128 --context-length 8192 \
    --schedule-policy lpm --weight-version 0 --log-level warning >"$WORK/server.log" 2>&1 &
  READY="$URL/health_generate"
fi
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  curl -sf "$READY" >/dev/null && break
  kill -0 $SERVER 2>/dev/null || { echo "gpu_smoke: the $ENGINE server exited:"; tail -50 "$WORK/server.log"; exit 1; }
  sleep 1
done
if [ "$ENGINE" = vllm ]; then curl -sf "$URL/v1/models"; echo; curl -sf "$URL/weight_info"; echo
else curl -sf "$URL/model_info"; echo; fi

rollout() {  # $1: name
  "$AGENTRL_PYTHON" -m agentrl.cli rollout --engine "$ENGINE" --engine-url "$URL" --model "$MODEL" --env code_tests \
    --tasks "$TASKS" --group-size "$GROUP" --max-turns 3 --max-new-tokens 512 --temperature 1.0 --seed 0 \
    --concurrency 32 --out "$WORK/$1.jsonl" --summary-json "$WORK/$1.summary.json"
}

echo "== rollout with weight version 0"
rollout v0
"$AGENTRL_PYTHON" benchmarks/gpu_smoke_report.py report --model "$MODEL" --summary "$WORK/v0.summary.json" \
  --rollout "$WORK/v0.jsonl" --version 0 --device "$DEVICE"

echo "== weight update (perturbed copy of the model, version 1)"
"$AGENTRL_PYTHON" benchmarks/gpu_smoke_report.py update --engine "$ENGINE" --url "$URL" --model "$MODEL" \
  --out "$WORK/weights-v1" --version 1

echo "== rollout with weight version 1"
rollout v1
"$AGENTRL_PYTHON" benchmarks/gpu_smoke_report.py report --model "$MODEL" --weights "$WORK/weights-v1" \
  --summary "$WORK/v1.summary.json" --rollout "$WORK/v1.jsonl" --version 1 --device "$DEVICE"
echo "gpu_smoke: done (logs and trajectories in $WORK)"

# Sharded training (docs/training.md, "Scaling out"): FSDP2 over every GPU of this machine. Each rank trains on its
# own data; the weight sync gathers the shards into full tensors on rank 0 (in place, then through disk) and the
# engine's tensors must equal them (`"gathered": 0.0` in both). STATUS: NOT YET RUN (no GPU when it was written; the
# same script runs unsharded on 2 CPU ranks in tests/integration/test_train_distributed.py).
NGPU=$(nvidia-smi -L | wc -l)
echo "== FSDP weight sync on $NGPU GPU rank(s)"
AGENTRL_DIST_DEVICE=cuda "$AGENTRL_PYTHON" -m accelerate.commands.launch --num_processes "$NGPU" --use_fsdp \
  --fsdp_version 2 --fsdp_state_dict_type FULL_STATE_DICT --fsdp_auto_wrap_policy TRANSFORMER_BASED_WRAP \
  --fsdp_transformer_layer_cls_to_wrap LlamaDecoderLayer --fsdp_reshard_after_forward true \
  tests/integration/dist_weight_sync_ranks.py "$MODEL" "$WORK/fsdp.json" "$WORK/fsdp-weights"
cat "$WORK/fsdp.json"; echo
"$AGENTRL_PYTHON" -c "import json, sys; v = json.load(open(sys.argv[1])); assert 'FSDP' in v['distributed_type'], v; \
assert v['local'] == {'gathered': 0.0} and v['disk'] == {'gathered': 0.0} and v['moved'] > 0, v; print('fsdp: ok')" \
  "$WORK/fsdp.json"
echo "gpu_smoke: FSDP done"
