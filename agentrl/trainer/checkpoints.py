"""Which weights a path means, for evaluation and for continuing from a trained model.

Owns: resolving a user-given `--checkpoint` path to a loadable full-weights checkpoint directory:

    <run output_dir>                     -> its last complete checkpoints/checkpoint-<N>
    <run output_dir>/checkpoints         -> the same
    checkpoints/checkpoint-<N> (full)    -> itself (weights + tokenizer, as TRL saved them)
    checkpoints/checkpoint-<N> (LoRA)    -> the adapter merged into its base model, written once to `<ckpt>/merged`
    any other HF checkpoint dir          -> itself

Model names such as "smollm2" are resolved by the caller (agentrl.engine.models.resolve_model) before this.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from agentrl.errors import ConfigError
from agentrl.trainer.resume import last_checkpoint

MERGED_DIR = "merged"


def run_config(path: Path) -> dict | None:
    """The job config of the run a checkpoint path belongs to (`config.json` of the output dir), if any."""
    for candidate in (path, *path.parents[:3]):
        cfg = candidate / "config.json"
        if cfg.is_file() and (candidate / "checkpoints").is_dir():
            return json.loads(cfg.read_text())
    return None


def resolve_checkpoint(path: Path) -> Path:
    """A directory with full weights (config.json + weights) for `path`; see the module docstring."""
    path = Path(path).expanduser()
    if not path.exists():
        raise ConfigError(f"checkpoint {str(path)!r} does not exist")
    for ckpt_dir in (path / "checkpoints", path):
        last = last_checkpoint(ckpt_dir) if ckpt_dir.is_dir() and not (ckpt_dir / "config.json").exists() else None
        if last is not None:
            path = last
            break
    if (path / "adapter_config.json").is_file():
        return merge_lora(path)
    if not (path / "config.json").is_file():
        raise ConfigError(f"checkpoint {str(path)!r} holds no model (no config.json or adapter_config.json): pass a "
                          f"run output_dir, a checkpoints/checkpoint-<N> dir or a Hugging Face checkpoint dir")
    return path


def merge_lora(adapter_dir: Path) -> Path:
    """Merge a LoRA adapter checkpoint into its base model once; returns `<adapter_dir>/merged`."""
    out = adapter_dir / MERGED_DIR
    if (out / "config.json").is_file():
        return out
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoTokenizer

    model = AutoPeftModelForCausalLM.from_pretrained(str(adapter_dir))
    merged = model.merge_and_unload()
    tmp = adapter_dir / f".{MERGED_DIR}-tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    merged.save_pretrained(tmp)
    tok_src = adapter_dir if (adapter_dir / "tokenizer_config.json").is_file() else \
        Path(model.peft_config["default"].base_model_name_or_path)
    AutoTokenizer.from_pretrained(str(tok_src)).save_pretrained(tmp)
    tmp.rename(out)
    return out
