"""A PEFT LoRA adapter directory read into weight deltas named like the base checkpoint.

Owns: reading `adapter_config.json` + `adapter_model.safetensors` (what peft's `save_pretrained` of a LoRA model
writes), refusing what it cannot apply exactly (DoRA, embedding/conv LoRA, per-module rank/alpha patterns,
`modules_to_save`, biases), and computing each adapted weight's delta exactly as peft does
(`transpose(B @ A, fan_in_fan_out) * scaling`, scaling = alpha / r, or alpha / sqrt(r) with rsLoRA), so base + delta
equals the trainer's merged weights bit for bit. Does not own applying them (`local.LocalEngine.load_adapter`).

    base_model.model.<module>.lora_A.weight  [r, in]     ->  delta["<module>.weight"] = (B @ A) * scaling  [out, in]
    base_model.model.<module>.lora_B.weight  [out, r]
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch

from agentrl.errors import ConfigError

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
_PREFIX = "base_model.model."


def adapter_files(path: str | os.PathLike[str]) -> tuple[Path, Path]:
    """(config, weights) of an adapter dir; a ConfigError naming the missing file and the fix."""
    root = Path(path)
    config, weights = root / CONFIG_FILE, root / WEIGHTS_FILE
    for f in (config, weights):
        if not f.is_file():
            raise ConfigError(f"LoRA adapter {root}: {f.name} is missing; save the adapter with peft's "
                              "save_pretrained (safe_serialization=True)")
    return config, weights


def adapter_deltas(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """{base weight name: delta} of the adapter saved at `path`, in the adapter's dtype."""
    from safetensors.torch import load_file

    config_file, weights_file = adapter_files(path)
    config = json.loads(config_file.read_text())
    _check_config(config, Path(path))
    r, alpha = int(config["r"]), float(config["lora_alpha"])
    scaling = alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r
    tensors = load_file(str(weights_file))
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        if ".lora_A." in key or ".lora_B." in key:
            module, side = key.rsplit(".lora_", 1)
            pairs.setdefault(module.removeprefix(_PREFIX), {})[side.split(".", 1)[0]] = value
        else:
            raise ConfigError(f"LoRA adapter {path}: tensor {key!r} is not a LoRA A/B weight (embedding LoRA, "
                              "biases and modules_to_save cannot be applied by the engine; train plain LoRA on "
                              "linear layers)")
    deltas: dict[str, torch.Tensor] = {}
    for module, pair in pairs.items():
        if set(pair) != {"A", "B"}:
            raise ConfigError(f"LoRA adapter {path}: {module} has {sorted(pair)} but needs both lora_A and lora_B")
        a, b = pair["A"], pair["B"]
        half = b.dtype in (torch.float16, torch.bfloat16)  # peft merges half precision in float32 on CPU
        delta = b.float() @ a.float() if half else b @ a
        delta = (delta.T if config.get("fan_in_fan_out") else delta) * scaling
        deltas[f"{module}.weight"] = delta.to(b.dtype) if half else delta
    if not deltas:
        raise ConfigError(f"LoRA adapter {path}: no LoRA weights in {WEIGHTS_FILE}")
    return deltas


def _check_config(config: dict, path: Path) -> None:
    if config.get("peft_type", "LORA") != "LORA":
        raise ConfigError(f"LoRA adapter {path}: peft_type {config.get('peft_type')!r} is not LORA")
    refused = [k for k in ("use_dora", "modules_to_save", "rank_pattern", "alpha_pattern", "layers_to_transform")
               if config.get(k)]
    if config.get("bias", "none") != "none":
        refused.append("bias")
    if refused:
        raise ConfigError(f"LoRA adapter {path}: {refused} set in {CONFIG_FILE}; the engine applies plain LoRA "
                          "only (one r and lora_alpha, no DoRA, bias 'none', no modules_to_save)")
