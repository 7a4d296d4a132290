"""Start-up check: refuse to train when the engine and the trainer would not see the same model.

Owns the list of things that must agree, each reported with what each side has and how to fix it:

    model       the engine's checkpoint config (architecture, vocabulary, layer shapes) vs the trainer's model, and
                (in-process engines) every parameter name and shape, which weight sync copies one to one
    tokenizer   the runner's tokenizer (it renders prompts and tool observations) vs the trainer's processing_class:
                vocabulary, special tokens, chat template, and the ids of a probe text
    generation  the runner's stop ids must all be end ids for the trainer (else TRL calls finished turns
                "truncated"), and the trainer's temperature / top_p / top_k / max completion tokens equal the
                rollout's (`TrainerGeneration`, read from GRPOConfig by the TRL adapter)

A mismatch in any of these silently trains on wrong logprobs or masks, so it is an error, not a warning.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError
from agentrl.trainer.weight_sync import full_weights, is_peft
from agentrl.types import SamplingParams

_CONFIG_KEYS = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "tie_word_embeddings", "max_position_embeddings")
_PROBE = "probe: def f(x):\n    return x + 1  # <tool_call> ✓"


def _text_config(config: Any) -> dict[str, Any]:
    sub = config.get_text_config() if hasattr(config, "get_text_config") else config
    return {k: getattr(sub, k, None) for k in _CONFIG_KEYS}


def _engine_model_config(engine: Any) -> dict[str, Any] | None:
    model = getattr(engine, "model", None)
    if model is not None and hasattr(model, "config"):
        return _text_config(model.config)
    path = (engine.info() or {}).get("model")
    if path and (Path(path) / "config.json").is_file():
        from transformers import AutoConfig

        return _text_config(AutoConfig.from_pretrained(path))
    return None


def model_mismatches(engine: Any, trainer_model: Any) -> list[str]:
    problems = []
    ours = _text_config(trainer_model.config)
    theirs = _engine_model_config(engine)
    if theirs is None:
        return ["model: cannot read the engine's model config (engine.info()['model'] is not a checkpoint dir)"]
    for key in _CONFIG_KEYS:
        if ours[key] != theirs[key]:
            problems.append(f"model: {key} is {theirs[key]!r} in the engine but {ours[key]!r} in the trainer")
    engine_model = getattr(engine, "model", None)
    if not problems and engine_model is not None and hasattr(engine_model, "state_dict"):
        problems += _parameter_mismatches(engine_model, trainer_model)
    return problems


def _parameter_mismatches(engine_model: Any, trainer_model: Any) -> list[str]:
    source = full_weights(trainer_model)
    trainer_sd = source if isinstance(source, dict) else source.state_dict()
    engine_sd = engine_model.state_dict()
    missing = sorted(set(engine_sd) - set(trainer_sd))
    extra = sorted(set(trainer_sd) - set(engine_sd))
    shapes = [k for k in set(engine_sd) & set(trainer_sd) if tuple(engine_sd[k].shape) != tuple(trainer_sd[k].shape)]
    out = []
    if missing or extra:
        out.append(f"model: parameter names differ (engine only: {missing[:3]}, trainer only: {extra[:3]})")
    if shapes:
        k = min(shapes)
        out.append(f"model: {len(shapes)} parameter shapes differ, e.g. {k}: engine {tuple(engine_sd[k].shape)} vs "
                   f"trainer {tuple(trainer_sd[k].shape)}")
    return out


def tokenizer_mismatches(runner_tok: Any, trainer_tok: Any, vocab_size: int | None) -> list[str]:
    if runner_tok is trainer_tok:
        checks = []
    else:
        checks = [
            ("vocabulary size", len(runner_tok), len(trainer_tok)),
            ("eos_token_id", runner_tok.eos_token_id, trainer_tok.eos_token_id),
            ("bos_token_id", runner_tok.bos_token_id, trainer_tok.bos_token_id),
            ("chat_template", _digest(runner_tok.chat_template), _digest(trainer_tok.chat_template)),
            ("ids of a probe text", runner_tok.encode(_PROBE, add_special_tokens=False),
             trainer_tok.encode(_PROBE, add_special_tokens=False)),
        ]
    problems = [f"tokenizer: {name} is {a!r} for the runner but {b!r} for the trainer"
                for name, a, b in checks if a != b]
    if vocab_size is not None and len(trainer_tok) > vocab_size:
        problems.append(f"tokenizer: {len(trainer_tok)} tokens but the model's vocab_size is {vocab_size}")
    return problems


def _digest(text: Any) -> str | None:
    if text is None:
        return None
    import hashlib

    return hashlib.sha256(json.dumps(text, sort_keys=True).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class TrainerGeneration:
    """What the trainer assumes about generation (trl_adapter.generation_settings reads it from GRPOConfig)."""

    temperature: float
    top_p: float
    top_k: int  # 0: off
    max_completion_tokens: int
    end_ids: list[int]  # ids the trainer treats as the end of a completion (eos ids and the pad id)


def generation_mismatches(sampling: SamplingParams, engine_eos: list[int], trainer: TrainerGeneration,
                          max_completion_tokens: int) -> list[str]:
    problems = [f"generation: {name} is {a!r} for rollouts but {b!r} in GRPOConfig"
                for name, a, b in [("temperature", sampling.temperature, trainer.temperature),
                                   ("top_p", sampling.top_p, trainer.top_p),
                                   ("top_k", sampling.top_k, trainer.top_k),
                                   ("max completion tokens", max_completion_tokens, trainer.max_completion_tokens)]
                if a != b]
    trl_end = set(trainer.end_ids)
    runner_stop = set(sampling.stop_token_ids) | set(engine_eos)
    if not runner_stop <= trl_end:
        problems.append(f"generation: the runner stops turns on ids {sorted(runner_stop - trl_end)} that TRL does "
                        f"not treat as end ids ({sorted(trl_end)}); every finished completion would count as "
                        f"truncated. Fix the model's generation_config.eos_token_id or sampling.stop_token_ids")
    return problems


def check_startup(*, engine: Any, trainer: Any, generation: TrainerGeneration, runner_tokenizer: Any,
                  sampling: SamplingParams, max_completion_tokens: int) -> None:
    """Raise ConfigError listing every disagreement between the engine/runner and the trainer (a transformers
    Trainer: its accelerator, model and processing_class) with its `generation` settings."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    base = model.get_base_model() if is_peft(model) else model
    vocab = getattr(base.config.get_text_config(), "vocab_size", None)
    problems = (model_mismatches(engine, model)
                + tokenizer_mismatches(runner_tokenizer, trainer.processing_class, vocab)
                + generation_mismatches(sampling, list(engine.eos_token_ids), generation, max_completion_tokens))
    if problems:
        raise ConfigError("the engine and the trainer disagree; refusing to train on mismatched logprobs:\n  - "
                          + "\n  - ".join(problems)
                          + "\nBoth must load the same checkpoint (top-level `model`) and its own tokenizer.")
