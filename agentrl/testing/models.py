"""Tiny real models for tests: a random LlamaForCausalLM with SmolLM2's tokenizer and chat template.

Owns: building small, deterministic Hugging Face checkpoint directories that load like any real model (same
vocabulary, special tokens and chat template as the embedded SmolLM2-135M-Instruct) but run a forward pass in
milliseconds. Not a fake: the engine, runner and trainer run their real code paths on it; only the weights are
random, so what it generates is gibberish.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from agentrl.engine.models import default_cache_dir, embedded_gguf_path, resolve_model

TINY_MARKER = "agentrl-tiny-model.json"


def load_embedded_tokenizer(cache_dir: Path | None = None) -> Any:
    """SmolLM2's tokenizer: from the converted cache when present, else straight from the GGUF (~3 s, no conversion)."""
    from transformers import AutoTokenizer

    converted = (cache_dir or default_cache_dir()) / "smollm2-135m-instruct"
    if (converted / "tokenizer_config.json").is_file():
        return AutoTokenizer.from_pretrained(resolve_model(None, cache_dir))
    gguf = embedded_gguf_path()
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


def make_tiny_model(
    directory: str | os.PathLike[str],
    tokenizer_from: str | os.PathLike[str] | None = None,
    *,
    seed: int = 0,
    num_layers: int = 2,
    hidden_size: int = 64,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    max_position_embeddings: int = 2048,
    init_std: float = 0.1,
) -> Path:
    """Write a random tiny Llama checkpoint (+ tokenizer, chat template, generation config) into `directory`.

    Same `seed` and arguments -> bit-identical weights. `tokenizer_from` is a checkpoint dir whose tokenizer is
    copied (default: the embedded SmolLM2 tokenizer). `init_std` is larger than the usual 0.02 so the logits are
    spread out: greedy decoding then has clear winners and does not flip on float rounding between batch shapes.
    Returns the directory.
    """
    import torch
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    out = Path(directory)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_from) if tokenizer_from else load_embedded_tokenizer()
    eos_id = tokenizer.eos_token_id
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        initializer_range=init_std,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=eos_id,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=eos_id, pad_token_id=config.pad_token_id
    )
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / TINY_MARKER).write_text(f'{{"seed": {seed}, "layers": {num_layers}, "hidden": {hidden_size}}}\n')
    return out
