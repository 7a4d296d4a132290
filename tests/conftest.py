"""Shared fixtures: the embedded model (converted once per machine), a tiny random model with its tokenizer, and
tier gating (docker/k8s/gpu skip with a reason unless the environment says the resource must exist)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    from agentrl.engine.models import resolve_model

    return resolve_model(None)


@pytest.fixture(scope="session")
def tiny_model_path(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agentrl.testing.models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny-model"), tokenizer_from=smollm2_path)


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_path: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path)


@pytest.fixture(scope="session")
def eos_prone_model(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random model, edited so it ends turns on its own: one residual dimension is held constant (every
    token embedding has C there and no layer writes to it), and the end-of-turn embedding row (tied to the LM head)
    has extra weight on it, so P(end-of-turn) is roughly 5-20% per step instead of 1/vocab."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    d0, c = 0, 20.0
    with torch.no_grad():
        emb = model.get_input_embeddings().weight
        emb[:, d0] = c
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[d0, :] = 0.0
            layer.mlp.down_proj.weight[d0, :] = 0.0
        head = model.get_output_embeddings().weight
        if head.data_ptr() != emb.data_ptr():
            head[:, d0] = 0.0
        head[tok.eos_token_id, d0] += 2.5
    out = tmp_path_factory.mktemp("eos-prone")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
