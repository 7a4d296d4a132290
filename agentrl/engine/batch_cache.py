"""The running batch of the local engine: rows being decoded and their shared, left-padded KV cache.

Owns the KV-cache bookkeeping of continuous batching. Shapes (B rows, H kv heads, T columns, D head dim):

    cache.layers[i].keys / .values   [B, H, T, D]   `SlotLayer`: views into a [B, H, T + spare, D] buffer
    mask                             [B, T] bool    False at left padding (never attended)
    next_pos                         [B]            position id of each row's next decode input

`merge` right-aligns two batches to the longer T and concatenates them on B; `select` keeps some rows (index_select
on B) and cuts the columns that are padding for every kept row. Does not own the model, sampling or the rows' state.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from transformers.cache_utils import CacheLayerMixin

from agentrl.errors import ConfigError


@dataclass(eq=False)
class RunningBatch:
    """The rows being decoded and their left-padded KV cache. All tensors share the batch order of `rows`."""

    rows: list[Any] = field(default_factory=list)
    cache: Any = None  # transformers DynamicCache whose layers are `SlotLayer`s: keys/values [B, H, T, D]
    mask: torch.Tensor | None = None  # [B, T] bool, False at left padding
    next_pos: torch.Tensor | None = None  # [B] position id of each row's next decode input

    def merge(self, other: RunningBatch) -> RunningBatch:
        """Concatenate on B after left-padding both caches to the same T. `other`'s rows come last."""
        parts = [b for b in (self, other) if b.rows]
        masks: list[torch.Tensor] = []
        positions: list[torch.Tensor] = []
        for b in parts:
            assert b.mask is not None and b.next_pos is not None  # a batch with rows has both
            masks.append(b.mask)
            positions.append(b.next_pos)
        width = max(m.shape[1] for m in masks)
        layers = zip(*[b.cache.layers for b in parts])
        cache = other.cache
        cache.layers = [SlotLayer.concat([(lay.keys, lay.values) for lay in group], width) for group in layers]
        mask = torch.cat([pad_left(m, width, 1) for m in masks])
        return RunningBatch(rows=[r for b in parts for r in b.rows], cache=cache, mask=mask,
                             next_pos=torch.cat(positions))

    def row_kv(self, i: int, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Copies of row i's last `length` cache columns per layer, [1, H, length, D] each (its real tokens)."""
        assert self.mask is not None
        width = self.mask.shape[1]
        return [(layer.keys[i : i + 1, :, width - length :].clone(),
                 layer.values[i : i + 1, :, width - length :].clone())
                for layer in self.cache.layers]

    def select(self, keep: list[int]) -> RunningBatch:
        """Keep only rows `keep` (in order) and cut the columns that are padding for every remaining row."""
        if not keep:
            return RunningBatch()
        assert self.mask is not None and self.next_pos is not None
        index = torch.tensor(keep, device=self.mask.device)
        mask = self.mask.index_select(0, index)
        start = int(mask.any(dim=0).long().argmax())  # first column some row still uses
        for layer in self.cache.layers:
            layer.select(index, start)
        return RunningBatch(rows=[self.rows[i] for i in keep], cache=self.cache, mask=mask[:, start:],
                             next_pos=self.next_pos.index_select(0, index))


class SlotLayer(CacheLayerMixin):
    """A KV cache layer backed by a preallocated [B, H, capacity, D] buffer, appended to in place.

    transformers' DynamicLayer re-concatenates the whole cache on every decode step (O(T) copies per token); this
    layer writes the new column into spare capacity and exposes `keys`/`values` as views [B, H, T, D].
    """

    is_sliding = False
    is_compileable = False
    is_initialized = True
    headroom = 64  # spare columns allocated on each (re)allocation

    def __init__(self, key_buf: torch.Tensor, value_buf: torch.Tensor, length: int) -> None:
        self.key_buf, self.value_buf, self.length = key_buf, value_buf, length
        self.device, self.dtype = key_buf.device, key_buf.dtype

    @classmethod
    def concat(cls, parts: list[tuple[torch.Tensor, torch.Tensor]], width: int, spare: int = 0) -> SlotLayer:
        """Right-align every part's [b, H, t, D] keys/values into one new buffer of `width` used columns
        (+ at least `headroom` spare ones)."""
        keys0 = parts[0][0]
        batch = sum(k.shape[0] for k, _ in parts)
        shape = (batch, keys0.shape[1], width + max(spare, cls.headroom), keys0.shape[3])
        key_buf, value_buf = keys0.new_zeros(shape), keys0.new_zeros(shape)
        row = 0
        for keys, values in parts:
            b, t = keys.shape[0], keys.shape[2]
            key_buf[row : row + b, :, width - t : width] = keys
            value_buf[row : row + b, :, width - t : width] = values
            row += b
        return cls(key_buf, value_buf, width)

    @property  # transformers' layers hold keys/values as attributes; a slot layer views its buffer instead
    def keys(self) -> torch.Tensor:  # type: ignore[override]
        return self.key_buf[:, :, : self.length]

    @property
    def values(self) -> torch.Tensor:  # type: ignore[override]
        return self.value_buf[:, :, : self.length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        new = key_states.shape[2]
        if self.length + new > self.key_buf.shape[2]:
            grown = SlotLayer.concat([(self.keys, self.values)], self.length, spare=new)
            self.key_buf, self.value_buf = grown.key_buf, grown.value_buf
        self.key_buf[:, :, self.length : self.length + new] = key_states
        self.value_buf[:, :, self.length : self.length + new] = value_states
        self.length += new
        return self.keys, self.values

    def select(self, index: torch.Tensor, start: int) -> None:
        """Keep batch rows `index` and drop the first `start` columns (padding for all kept rows)."""
        self.key_buf = self.key_buf.index_select(0, index)[:, :, start:]
        self.value_buf = self.value_buf.index_select(0, index)[:, :, start:]
        self.length -= start

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        return None  # built initialised by `concat`

    def get_seq_length(self) -> int:
        return self.length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_max_length(self) -> int:
        return -1


@dataclass(eq=False)
class _Entry:
    ids: list[int]  # the tokens whose keys/values are stored, in order
    layers: list[tuple[torch.Tensor, torch.Tensor]]  # per layer keys, values [1, H, len(ids), D]
    nbytes: int


class PrefixCache:
    """The KV of each session's last finished generation, so its next turn prefills only the new tokens.

    A multi-turn trajectory sends prompt + reply + tool output as its next input; the longest common prefix with the
    stored tokens is reused (any divergence, e.g. a re-rendered chat template, just shortens the reuse). LRU over
    sessions, bounded in bytes; cleared on every weight update (old keys/values are stale). Worker thread only.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._entries: collections.OrderedDict[str, _Entry] = collections.OrderedDict()

    def take(self, session_id: str, input_ids: list[int]) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], int]:
        """Remove the session's entry; return its layers and how many leading input tokens they cover (0: none).

        At least the last input token is left to compute: its logits give the first new token."""
        entry = self._entries.pop(session_id, None)
        if entry is None:
            return [], 0
        self.nbytes -= entry.nbytes
        limit = min(len(entry.ids), len(input_ids) - 1)
        same = next((i for i in range(limit) if entry.ids[i] != input_ids[i]), limit)
        return (entry.layers, same) if same > 0 else ([], 0)

    def put(self, session_id: str, ids: list[int], layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)
        if nbytes > self.max_bytes:
            return
        old = self._entries.pop(session_id, None)
        self.nbytes += nbytes - (old.nbytes if old else 0)
        self._entries[session_id] = _Entry(ids=ids, layers=layers, nbytes=nbytes)
        while self.nbytes > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.nbytes -= evicted.nbytes

    def clear(self) -> None:
        self._entries.clear()
        self.nbytes = 0


def cache_from_prefixes(model: Any, prefixes: list[list[tuple[torch.Tensor, torch.Tensor]]], reuse: list[int]) -> Any:
    """A batch cache holding the first reuse[i] stored tokens of each row, right-aligned to max(reuse) columns."""
    cache = new_prefill_cache(model)
    width = max(reuse)
    template = next(p for p, r in zip(prefixes, reuse) if r)
    cache.layers = []
    for layer, (k0, _) in enumerate(template):
        empty = k0[:, :, :0]
        parts = [(p[layer][0][:, :, :r], p[layer][1][:, :, :r]) if r else (empty, empty)
                 for p, r in zip(prefixes, reuse)]
        cache.layers.append(SlotLayer.concat(parts, width))
    return cache


def pad_left(t: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    missing = width - t.shape[dim]
    if missing == 0:
        return t
    pad = [0, 0] * (t.dim() - 1 - dim) + [missing, 0]
    return F.pad(t, pad)  # zeros / False: masked out, never attended


def new_prefill_cache(model: Any) -> Any:
    """An empty cache of plain full-length layers. Sliding-window layers (Gemma 3) are made full-length too: every
    column is kept and the model's sliding-window mask limits what each query sees. That mask is built from column
    indices, which equal token distances within a row (a row's tokens are contiguous, right-aligned), so the result
    is exact; only the memory of those layers is not capped at the window."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    cache = DynamicCache(config=model.config)
    if any(type(layer) not in (DynamicLayer, DynamicSlidingWindowLayer) for layer in cache.layers):
        raise ConfigError(
            f"{type(model).__name__} uses chunked, linear-attention or other non-standard KV cache layers, which the "
            f"local engine's batching does not support; use a full- or sliding-window-attention model or the sglang "
            f"engine"
        )
    cache.layers = [DynamicLayer() for _ in cache.layers]
    return cache
