"""Batch-invariant forward passes for the local engine's deterministic mode: a row's numbers do not depend on which
other rows share its decode step.

Owns the two changes to a loaded transformers model that make batched decoding batch-invariant on CPU:

- Linear layers see a fixed row count. BLAS picks its gemm kernel (and so the summation order of every output) from
  the matrix shape: measured with torch's MKL sgemm, a row's output differs in the last bits between 1, 2-3 and
  >= 4 rows of the same weight, but at a fixed row count it is the same at every position and beside any other rows.
  `fix_linear_rows` pads each Linear input of fewer than `rows` rows (tokens x batch, flattened) with zero rows and
  drops their outputs, so a decode step of 1..rows rows always runs the same gemm.
- Attention is computed per row over the row's own keys only (`ROWWISE`). Left padding (set by the longest row of
  the batch) shifts where a row's keys sit in the vectorised softmax/matmul reductions; one SDPA call per row over
  exactly its real columns has the same shape whatever the batch is. Queries of more than one token (prefill, which
  deterministic mode runs one row at a time) go to SDPA unchanged.

Elementwise and last-dimension ops (embedding, RMSNorm, rotary, activations, sampling) are row-wise already.
Does not own batching, seeding or the KV cache (`local.py`, `batch_cache.py`).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

ROWWISE = "agentrl_rowwise"


def fix_linear_rows(model: torch.nn.Module, rows: int) -> None:
    """Make every nn.Linear of `model` compute inputs of fewer than `rows` rows as `rows` rows (zero-padded)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.forward = functools.partial(_padded_linear, module, rows)  # type: ignore[method-assign]


def _padded_linear(module: torch.nn.Linear, rows: int, x: torch.Tensor) -> torch.Tensor:
    flat = x.reshape(-1, x.shape[-1])
    n = flat.shape[0]
    if n >= rows:
        return torch.nn.functional.linear(x, module.weight, module.bias)
    padded = torch.cat([flat, flat.new_zeros((rows - n, flat.shape[1]))])
    out = torch.nn.functional.linear(padded, module.weight, module.bias)[:n]
    return out.reshape(*x.shape[:-1], out.shape[-1])


def use_rowwise_attention(model: Any) -> None:
    """Switch `model` to the per-row attention (`ROWWISE`), registered once with transformers."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(ROWWISE, _rowwise_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ROWWISE, sdpa_mask)  # the same boolean masks SDPA gets
    model.set_attn_implementation(ROWWISE)


def _rowwise_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """SDPA, but a one-token query attends row by row to exactly its row's unmasked keys (no padding columns)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if query.shape[2] != 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    outs = []
    for b in range(query.shape[0]):
        k, v = key[b : b + 1], value[b : b + 1]
        if attention_mask is not None:
            keep = attention_mask[b if attention_mask.shape[0] > 1 else 0, 0, -1]
            if keep.dtype != torch.bool:
                keep = keep == 0  # an additive float mask: 0 = attend
            cols = keep.nonzero().squeeze(1)
            k, v = k.index_select(2, cols), v.index_select(2, cols)
        outs.append(sdpa_attention_forward(module, query[b : b + 1], k.contiguous(), v.contiguous(), None,
                                           **kwargs)[0])
    return torch.cat(outs), None
