"""Checking a checkpoint directory before a server is asked to load it.

Why: a real vLLM that fails a `reload_weights` half way is left with meta tensors and dies on its next generation
(a vLLM bug; see docs/vllm.md), so what can be checked on the client is checked first. Owns: reading safetensors
headers (8-byte length + JSON, no tensor data read), and comparing a candidate checkpoint with a reference one (the
served checkpoint, or the last one that loaded): config.json present and of the same architecture and sizes, every
weight file complete (the file is as long as its header says), every tensor of the reference present with the same
shape and dtype. LoRA adapter dirs get the same completeness check. Does not own loading anything.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from agentrl.errors import EngineError

#: config.json fields that must agree between a checkpoint and the one the server runs
SHAPE_FIELDS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "intermediate_size", "vocab_size", "tie_word_embeddings")
MAX_HEADER = 100 * 1024 * 1024  # safetensors' own limit on the JSON header


class CheckpointRejected(EngineError):
    """The checkpoint would not load cleanly; nothing was sent to the server."""


def safetensors_header(path: Path) -> dict[str, Any]:
    """The tensor table of one .safetensors file ({name: {dtype, shape, data_offsets}}), checked to be complete."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise CheckpointRejected(f"{path}: shorter than a safetensors header (truncated write?)")
            (n,) = struct.unpack("<Q", raw)
            if n > MAX_HEADER or 8 + n > size:
                raise CheckpointRejected(f"{path}: header length {n} does not fit the file ({size} bytes)")
            header = json.loads(f.read(n))
    except OSError as exc:
        raise CheckpointRejected(f"{path}: unreadable ({exc})") from None
    except ValueError as exc:
        raise CheckpointRejected(f"{path}: header is not JSON ({exc})") from None
    tensors = {k: v for k, v in header.items() if k != "__metadata__"} if isinstance(header, dict) else {}
    end = max((int(v["data_offsets"][1]) for v in tensors.values()), default=0)
    if 8 + n + end != size:
        raise CheckpointRejected(f"{path}: {size} bytes on disk, the header describes {8 + n + end} (an incomplete "
                                 "or still-running write)")
    return tensors


def weight_files(ckpt: Path) -> list[Path]:
    """The checkpoint's weight files: model.safetensors, or every shard its index names (each must exist)."""
    index = ckpt / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointRejected(f"{index}: unreadable index ({exc})") from None
        missing = [s for s in shards if not (ckpt / s).is_file()]
        if missing:
            raise CheckpointRejected(f"{ckpt}: shards named by its index are missing: {missing}")
        return [ckpt / s for s in shards]
    single = ckpt / "model.safetensors"
    if not single.is_file():
        raise CheckpointRejected(f"{ckpt}: no model.safetensors (or index): save it with save_pretrained("
                                 "safe_serialization=True)")
    return [single]


def tensor_table(ckpt: Path) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for f in weight_files(ckpt):
        table.update(safetensors_header(f))
    return table


def read_config(ckpt: Path) -> dict[str, Any]:
    f = ckpt / "config.json"
    try:
        cfg = json.loads(f.read_text())
    except OSError:
        raise CheckpointRejected(f"{ckpt}: no readable config.json (save_pretrained writes it)") from None
    except ValueError as exc:
        raise CheckpointRejected(f"{f}: not JSON ({exc})") from None
    if not isinstance(cfg, dict):
        raise CheckpointRejected(f"{f}: not a JSON object")
    return cfg.get("text_config") or cfg


def check_checkpoint(candidate: str | Path, reference: str | Path | None) -> None:
    """Raise CheckpointRejected unless `candidate` is complete and matches `reference` (config sizes, every
    reference tensor present with the same shape and dtype). `reference` None: completeness only."""
    cand = Path(candidate)
    if not cand.is_dir():
        raise CheckpointRejected(f"{cand}: not a directory")
    cfg, table = read_config(cand), tensor_table(cand)
    if not table:
        raise CheckpointRejected(f"{cand}: its weight files hold no tensors")
    if reference is None or not Path(reference).is_dir():
        return
    ref = Path(reference)
    ref_cfg = read_config(ref)
    differ = {k: (ref_cfg.get(k), cfg.get(k)) for k in SHAPE_FIELDS if ref_cfg.get(k) != cfg.get(k)}
    if differ:
        raise CheckpointRejected(f"{cand}: config.json differs from the served model's ({ref}) in {differ} "
                                 "(served, new): a server reloads weights into the architecture it started with")
    ref_table = tensor_table(ref)
    missing = sorted(set(ref_table) - set(table))
    if missing:
        raise CheckpointRejected(f"{cand}: {len(missing)} tensors of the served model are missing, e.g. "
                                 f"{missing[:3]}")
    wrong = [(k, ref_table[k]["shape"], table[k]["shape"]) for k in ref_table
             if list(ref_table[k]["shape"]) != list(table[k]["shape"])]
    if wrong:
        raise CheckpointRejected(f"{cand}: tensor shapes differ from the served model's, e.g. {wrong[:3]} "
                                 "(name, served, new)")
    dtypes = {table[k]["dtype"] for k in table} - {ref_table[k]["dtype"] for k in ref_table} - {"F32", "BF16", "F16"}
    if dtypes:
        raise CheckpointRejected(f"{cand}: tensors of dtype {sorted(dtypes)}: a floating-point checkpoint is needed")


def check_adapter(path: str | Path, *, max_rank: int | None = None) -> None:
    """Raise CheckpointRejected unless `path` is a complete peft adapter dir (within `max_rank` when known)."""
    p = Path(path)
    try:
        cfg = json.loads((p / "adapter_config.json").read_text())
    except OSError:
        raise CheckpointRejected(f"{p}: no adapter_config.json (peft's save_pretrained writes it)") from None
    except ValueError as exc:
        raise CheckpointRejected(f"{p}/adapter_config.json: not JSON ({exc})") from None
    weights = p / "adapter_model.safetensors"
    if not weights.is_file():
        raise CheckpointRejected(f"{p}: no adapter_model.safetensors")
    if not safetensors_header(weights):
        raise CheckpointRejected(f"{weights}: holds no tensors")
    rank = cfg.get("r") if isinstance(cfg, dict) else None
    if max_rank is not None and isinstance(rank, int) and rank > max_rank:
        raise CheckpointRejected(f"{p}: LoRA rank {rank} exceeds the server's --max-lora-rank {max_rank}")
