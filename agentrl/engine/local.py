"""LocalEngine: in-process generation with `transformers`, continuously batched in one worker thread.

Owns: loading a checkpoint for generation, the batching loop, per-row sampling (temperature / top-p / top-k, seeded
per request), logprobs, stop / length handling, and in-place weight updates. Does not own tokenization or chat
templates (the runner renders text; this engine is token in, token out) nor resolving model names (`models.py`).

Threads. `generate()` runs on the caller's asyncio loop: it puts a `_Row` into a deque and awaits a future. One
daemon worker thread owns the model and the KV cache; torch releases the GIL, so the event loop keeps running while
it computes. Results go back with `loop.call_soon_threadsafe`. A cancelled `generate()` only flags its row; the
worker drops the row at the next step.

Continuous batching. The running batch is one left-padded KV cache (transformers `DynamicCache`, per layer keys /
values of shape [B, H, T, D]) plus a bool mask [B, T] (False = padding) and the next position id of every row:

    step:  admit pending rows (up to max_batch_size) -> prefill them as their own left-padded batch (in column chunks
           of at most `prefill_chunk_tokens` tokens) -> sample their first token -> merge their cache into the running
           one (both left-padded to the longer T, concatenated on B) -> one decode forward for all rows ([B, 1]) ->
           sample -> finished / cancelled rows are removed (index_select on B) and all-padding columns trimmed on T.

Invariant: the cache holds every token of a row except its last sampled one, which is the next decode input; its
position id is the row's real-token count, so padding never shifts positions and the logits equal a single-sequence
forward pass (checked by the tests to 1e-4 in fp32).

Weight updates drain: `update_weights` stops admission, lets running rows finish with the old weights, applies the
new weights between steps and resumes. Every Generation is produced by exactly one weight version and tagged with it.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import os
import secrets
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from transformers.cache_utils import CacheLayerMixin as _CacheLayerMixin

from agentrl.engine.models import validate_checkpoint_dir
from agentrl.errors import ConfigError, EngineError, EngineUnavailableError
from agentrl.types import Generation, SamplingParams

_MAX_SESSIONS = 100_000  # per-session call counters kept for seeding (oldest forgotten first)


@dataclass
class EngineStats:
    """Counters of the batching loop (a snapshot; see `LocalEngine.stats`)."""

    forward_calls: int = 0  # model forward passes (prefill chunks + decode steps)
    prefill_calls: int = 0
    decode_steps: int = 0
    max_batch_rows: int = 0  # the most rows any one forward pass carried
    generated_tokens: int = 0
    finished: int = 0
    cancelled: int = 0


@dataclass(eq=False)
class _Row:
    """One generate() call: its inputs, where to deliver the result, and what it generated so far."""

    input_ids: list[int]
    sampling: SamplingParams
    max_new: int
    stop_ids: frozenset[int]
    generator: torch.Generator | None  # None for greedy rows
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Generation]
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    version: int = 0
    cancelled: bool = False


@dataclass(eq=False)
class _Update:
    state: Mapping[str, torch.Tensor] | None  # None: the source is the engine's own model (weights shared)
    version: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[None]


class LocalEngine:
    """transformers in-process, continuously batched. See the module docstring for the threading and batching model."""

    name = "local"

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        *,
        device: str = "cpu",
        dtype: torch.dtype | str = torch.float32,
        max_batch_size: int = 16,
        context_window: int | None = None,
        batch_wait_ms: float = 2.0,
        seed: int | None = None,
        prefill_chunk_tokens: int = 2048,
        max_pending: int = 4096,
        num_threads: int | None = None,
    ) -> None:
        from transformers import AutoModelForCausalLM

        if max_batch_size < 1 or prefill_chunk_tokens < 1 or max_pending < 1:
            raise ConfigError("max_batch_size, prefill_chunk_tokens and max_pending must be >= 1")
        self.model_path = validate_checkpoint_dir(Path(model_path))
        if num_threads is not None:
            torch.set_num_threads(num_threads)  # process-wide: torch has one intra-op pool
        self.dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        self.device = torch.device(device)
        self.model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=self.dtype).to(self.device).eval()
        self.vocab_size = int(self.model.config.get_text_config().vocab_size)
        self.eos_token_ids = _eos_ids(self.model)
        self._context_window = _context_window(self.model, context_window)
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_ms / 1000.0
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self.max_pending = max_pending
        self.seed = seed
        self._version = 0
        self._stats = EngineStats()
        self._calls: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._cond = threading.Condition()
        self._pending: collections.deque[_Row] = collections.deque()
        self._updates: collections.deque[_Update] = collections.deque()
        self._closed = False
        self._batch = _RunningBatch()
        self._thread = threading.Thread(target=self._run, name="agentrl-local-engine", daemon=True)
        self._thread.start()

    # ----------------------------------------------------------------------------------------------- public API
    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def context_window(self) -> int:
        return self._context_window

    @property
    def stats(self) -> EngineStats:
        with self._cond:
            return EngineStats(**vars(self._stats))

    async def generate(self, input_ids: list[int], sampling: SamplingParams, *, session_id: str) -> Generation:
        if self._closed:
            raise EngineUnavailableError("local engine is closed")
        ids = self._check_ids(input_ids)
        max_new = min(sampling.max_new_tokens, self._context_window - len(ids))
        if max_new <= 0:
            return Generation(output_ids=[], logprobs=[], finish_reason="length", weight_version=self._version)
        loop = asyncio.get_running_loop()
        row = _Row(
            input_ids=ids,
            sampling=sampling,
            max_new=max_new,
            stop_ids=frozenset(self.eos_token_ids) | frozenset(sampling.stop_token_ids),
            generator=None if sampling.greedy else self._generator(sampling, session_id),
            loop=loop,
            future=loop.create_future(),
        )
        self._submit(row)
        try:
            return await row.future
        except asyncio.CancelledError:
            row.cancelled = True  # the worker drops the row at its next step
            raise

    async def update_weights(self, source: Any, version: int) -> None:
        """Copy new weights in place (state dict, nn.Module or checkpoint dir) and tag later generations `version`.

        Waits until rows in flight have finished with the old weights (see module docstring), then applies.
        """
        state = await self._state_from(source)
        loop = asyncio.get_running_loop()
        update = _Update(state=state, version=version, loop=loop, future=loop.create_future())
        with self._cond:
            if self._closed:
                raise EngineUnavailableError("local engine is closed")
            self._updates.append(update)
            self._cond.notify()
        await update.future

    async def health(self) -> bool:
        return self._thread.is_alive() and not self._closed

    async def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        await asyncio.to_thread(self._thread.join)

    def info(self) -> dict[str, Any]:
        import transformers

        return {
            "engine": self.name,
            "model": str(self.model_path),
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
        }

    # ------------------------------------------------------------------------------------------ caller's side
    def _check_ids(self, input_ids: list[int]) -> list[int]:
        ids = [int(i) for i in input_ids]
        if not ids:
            raise ConfigError("generate: input_ids is empty; render at least one prompt token")
        if min(ids) < 0 or max(ids) >= self.vocab_size:
            raise ConfigError(f"generate: token id out of range [0, {self.vocab_size}) for model {self.model_path}")
        return ids

    def _generator(self, sampling: SamplingParams, session_id: str) -> torch.Generator:
        """A row's RNG, seeded from (engine seed, sampling.seed, session id, that session's call index)."""
        with self._cond:
            index = self._calls.pop(session_id, -1) + 1
            self._calls[session_id] = index
            if len(self._calls) > _MAX_SESSIONS:
                self._calls.popitem(last=False)
        if self.seed is None and sampling.seed is None:
            seed = secrets.randbits(63)
        else:
            key = f"{self.seed}|{sampling.seed}|{session_id}|{index}".encode()
            seed = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1
        return torch.Generator(device="cpu").manual_seed(seed)

    def _submit(self, row: _Row) -> None:
        with self._cond:  # held by the worker only for bookkeeping, never across a forward pass
            if self._closed:
                raise EngineUnavailableError("local engine is closed")
            if len(self._pending) >= self.max_pending:
                raise EngineUnavailableError(f"local engine queue is full (max_pending={self.max_pending})")
            self._pending.append(row)
            self._cond.notify()

    async def _state_from(self, source: Any) -> Mapping[str, torch.Tensor] | None:
        if source is self.model:
            return None
        if isinstance(source, torch.nn.Module):
            state: Mapping[str, torch.Tensor] = source.state_dict()
        elif isinstance(source, Mapping):
            state = source
        elif isinstance(source, (str, os.PathLike)):
            state = await asyncio.to_thread(self._load_checkpoint, Path(source))
        else:
            raise ConfigError(f"update_weights: source must be a state dict, nn.Module or checkpoint dir, not {source!r}")
        expected = set(self.model.state_dict())
        missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
        if missing or unexpected:
            raise ConfigError(
                f"update_weights: parameter names do not match {self.model_path.name} (missing {missing[:5]}, "
                f"unexpected {unexpected[:5]}); pass the unwrapped model (no DDP/PEFT wrapper) or merge adapters first"
            )
        return state

    def _load_checkpoint(self, path: Path) -> Mapping[str, torch.Tensor]:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(validate_checkpoint_dir(path), dtype=self.dtype).state_dict()

    # ------------------------------------------------------------------------------------------ worker thread
    def _run(self) -> None:
        try:
            while self._next_step():
                pass
        finally:
            self._fail_all(EngineUnavailableError("local engine is closed"))

    def _next_step(self) -> bool:
        """One iteration of the loop: wait for work, apply updates / admit / decode. False when closing."""
        admitted = self._wait_for_work()
        if admitted is None:
            return False
        with torch.inference_mode():
            try:
                if admitted:
                    self._prefill(admitted)
                self._drop_cancelled()
                if self._batch.rows:
                    self._decode()
            except Exception as exc:  # a failed forward fails its rows, never the loop
                failed = admitted + self._batch.rows
                self._batch = _RunningBatch()
                for row in failed:
                    _deliver(row, exception=EngineError(f"local engine step failed: {exc!r}"))
        return True

    def _wait_for_work(self) -> list[_Row] | None:
        """Block until there is something to do; apply a due weight update; return the rows to admit now."""
        with self._cond:
            while not self._closed and not self._pending and not self._updates and not self._batch.rows:
                self._cond.wait()
            if self._closed:
                return None
            if not self._batch.rows and self._pending and self.batch_wait_s > 0:
                self._gather_more()
        with self._cond:
            if self._updates and self._batch.rows:
                return []  # drain: no admission while an update waits
            updates = list(self._updates)
            self._updates.clear()
        self._apply_updates(updates)
        with self._cond:
            free = self.max_batch_size - len(self._batch.rows)
            rows: list[_Row] = []
            while self._pending and len(rows) < free:
                row = self._pending.popleft()
                if row.cancelled:
                    self._stats.cancelled += 1
                else:
                    rows.append(row)
            return rows

    def _gather_more(self) -> None:
        """Idle engine, first arrival: wait up to batch_wait_ms for more arrivals so they share a prefill."""
        deadline = time.monotonic() + self.batch_wait_s
        while len(self._pending) < self.max_batch_size and not self._closed:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._cond.wait(left)

    def _apply_updates(self, updates: list[_Update]) -> None:
        for update in updates:
            try:
                if update.state is not None:
                    with torch.no_grad():
                        self.model.load_state_dict(update.state, strict=True)
                self._version = update.version
                _settle(update.loop, update.future, None, None)
            except Exception as exc:
                _settle(update.loop, update.future, None, ConfigError(f"update_weights failed: {exc}"))

    def _prefill(self, rows: list[_Row]) -> None:
        """Run the prompts of `rows` (left-padded, in column chunks), sample their first token, merge them in."""
        for row in rows:
            row.version = self._version
        lengths = [len(r.input_ids) for r in rows]
        width = max(lengths)
        ids = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.bool)
        for i, row in enumerate(rows):
            ids[i, width - lengths[i] :] = torch.tensor(row.input_ids)
            mask[i, width - lengths[i] :] = True
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
        cache = _new_cache(self.model)
        chunk = max(1, self.prefill_chunk_tokens // len(rows))
        for start in range(0, width, chunk):
            end = min(width, start + chunk)
            out = self.model(
                input_ids=ids[:, start:end], attention_mask=mask[:, :end], position_ids=positions[:, start:end],
                cache=cache, use_cache=True, logits_to_keep=1,
            )
            self._count(prefill=True, rows=len(rows))
        fresh = _RunningBatch(rows=list(rows), cache=cache, mask=mask,
                              next_pos=torch.tensor(lengths, device=self.device))
        self._batch = self._batch.merge(fresh)
        self._sample_and_finish(out.logits[:, -1], first=len(self._batch.rows) - len(rows))

    def _decode(self) -> None:
        batch = self._batch
        last = torch.tensor([r.output_ids[-1] for r in batch.rows], device=self.device)
        batch.mask = torch.cat([batch.mask, batch.mask.new_ones((len(batch.rows), 1))], dim=1)
        out = self.model(
            input_ids=last[:, None], attention_mask=batch.mask, position_ids=batch.next_pos[:, None],
            cache=batch.cache, use_cache=True, logits_to_keep=1,
        )
        batch.next_pos = batch.next_pos + 1
        self._count(prefill=False, rows=len(batch.rows))
        self._sample_and_finish(out.logits[:, -1], first=0)

    def _sample_and_finish(self, logits: torch.Tensor, first: int) -> None:
        """Sample one token for rows[first:] (whose logits are `logits`), deliver finished rows, shrink the batch."""
        rows = self._batch.rows[first:]
        tokens, logprobs = sample(logits, [r.sampling for r in rows], [r.generator for r in rows])
        keep = list(range(first))
        for offset, (row, token, logprob) in enumerate(zip(rows, tokens.tolist(), logprobs.tolist())):
            row.output_ids.append(token)
            row.logprobs.append(logprob)
            if token in row.stop_ids or len(row.output_ids) >= row.max_new:
                self._finish(row, "stop" if token in row.stop_ids else "length")
            else:
                keep.append(first + offset)
        with self._cond:
            self._stats.generated_tokens += len(rows)
        if len(keep) < len(self._batch.rows):
            self._batch = self._batch.select(keep)

    def _drop_cancelled(self) -> None:
        keep = [i for i, r in enumerate(self._batch.rows) if not r.cancelled]
        if len(keep) < len(self._batch.rows):
            with self._cond:
                self._stats.cancelled += len(self._batch.rows) - len(keep)
            self._batch = self._batch.select(keep)

    def _finish(self, row: _Row, reason: str) -> None:
        generation = Generation(
            output_ids=row.output_ids, logprobs=row.logprobs, finish_reason=reason, weight_version=row.version
        )
        with self._cond:
            self._stats.finished += 1
        _deliver(row, result=generation)

    def _count(self, *, prefill: bool, rows: int) -> None:
        with self._cond:
            self._stats.forward_calls += 1
            self._stats.prefill_calls += prefill
            self._stats.decode_steps += not prefill
            self._stats.max_batch_rows = max(self._stats.max_batch_rows, rows)

    def _fail_all(self, exc: Exception) -> None:
        with self._cond:
            self._closed = True
            rows = list(self._pending) + self._batch.rows
            updates = list(self._updates)
            self._pending.clear()
            self._updates.clear()
            self._batch = _RunningBatch()
        for row in rows:
            _deliver(row, exception=exc)
        for update in updates:
            _settle(update.loop, update.future, None, exc)


@dataclass(eq=False)
class _RunningBatch:
    """The rows being decoded and their left-padded KV cache. All tensors share the batch order of `rows`."""

    rows: list[_Row] = field(default_factory=list)
    cache: Any = None  # transformers DynamicCache whose layers are `_SlotLayer`s: keys/values [B, H, T, D]
    mask: torch.Tensor | None = None  # [B, T] bool, False at left padding
    next_pos: torch.Tensor | None = None  # [B] position id of each row's next decode input

    def merge(self, other: _RunningBatch) -> _RunningBatch:
        """Concatenate on B after left-padding both caches to the same T. `other`'s rows come last."""
        parts = [b for b in (self, other) if b.rows]
        width = max(b.mask.shape[1] for b in parts)
        layers = zip(*[b.cache.layers for b in parts])
        cache = other.cache
        cache.layers = [_SlotLayer.concat([(l.keys, l.values) for l in group], width) for group in layers]
        mask = torch.cat([_pad_left(b.mask, width, 1) for b in parts])
        return _RunningBatch(rows=[r for b in parts for r in b.rows], cache=cache, mask=mask,
                             next_pos=torch.cat([b.next_pos for b in parts]))

    def select(self, keep: list[int]) -> _RunningBatch:
        """Keep only rows `keep` (in order) and cut the columns that are padding for every remaining row."""
        if not keep:
            return _RunningBatch()
        index = torch.tensor(keep, device=self.mask.device)
        mask = self.mask.index_select(0, index)
        start = int(mask.any(dim=0).long().argmax())  # first column some row still uses
        for layer in self.cache.layers:
            layer.select(index, start)
        return _RunningBatch(rows=[self.rows[i] for i in keep], cache=self.cache, mask=mask[:, start:],
                             next_pos=self.next_pos.index_select(0, index))


class _SlotLayer(_CacheLayerMixin):
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
    def concat(cls, parts: list[tuple[torch.Tensor, torch.Tensor]], width: int, spare: int = 0) -> _SlotLayer:
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

    @property
    def keys(self) -> torch.Tensor:
        return self.key_buf[:, :, : self.length]

    @property
    def values(self) -> torch.Tensor:
        return self.value_buf[:, :, : self.length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        new = key_states.shape[2]
        if self.length + new > self.key_buf.shape[2]:
            grown = _SlotLayer.concat([(self.keys, self.values)], self.length, spare=new)
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


def sample(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row of `logits` [B, V]; return (tokens [B], logprobs [B]).

    The logprob is log_softmax(logits / T) at the chosen token, before top-p/top-k filtering (T = 1 for greedy rows,
    which take the argmax). Sampled rows draw from the filtered distribution with their own generator.
    """
    logits = logits.float()
    temps = torch.tensor([p.temperature if not p.greedy else 1.0 for p in params], device=logits.device)
    scaled = logits / temps[:, None]
    tokens = scaled.argmax(dim=-1)
    for i, (p, generator) in enumerate(zip(params, generators)):
        if not p.greedy:
            tokens[i] = _sample_row(scaled[i], p, generator)
    logprobs = torch.log_softmax(scaled, dim=-1).gather(1, tokens[:, None]).squeeze(1)
    return tokens, logprobs


def _sample_row(scaled: torch.Tensor, p: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """Sample from softmax(scaled) restricted to the top-k tokens and the top-p nucleus (always keeps the best)."""
    if p.top_k == 0 and p.top_p >= 1.0:
        return _draw(torch.softmax(scaled, dim=-1), generator)
    values, order = _top_candidates(scaled, p)
    probs = torch.softmax(scaled, dim=-1)[order] if p.top_k == 0 else torch.softmax(values, dim=-1)
    if p.top_p < 1.0:
        outside = probs.cumsum(-1) - probs >= p.top_p  # the mass before this token already reaches top_p
        probs = probs.masked_fill(outside, 0.0)
    return order[_draw(probs, generator)]


def _draw(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Inverse-CDF draw of one index from unnormalised `probs` [V] with one uniform from `generator` (CPU)."""
    cdf = probs.double().cumsum(0).cpu()
    u = torch.rand((), generator=generator, dtype=torch.float64) * cdf[-1]
    index = torch.searchsorted(cdf, u, right=True).clamp(max=cdf.shape[0] - 1)
    return index.to(probs.device)


def _top_candidates(scaled: torch.Tensor, p: SamplingParams, first_try: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens that top-k / top-p may keep, best first: `topk` instead of a full sort whenever that is exact."""
    if p.top_k:
        return torch.topk(scaled, min(p.top_k, scaled.shape[-1]))
    if first_try < scaled.shape[-1]:
        values, order = torch.topk(scaled, first_try)
        if torch.softmax(scaled, dim=-1)[order].sum() >= p.top_p:  # the nucleus lies inside these candidates
            return values, order
    return scaled.sort(descending=True)


def _pad_left(t: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    missing = width - t.shape[dim]
    if missing == 0:
        return t
    pad = [0, 0] * (t.dim() - 1 - dim) + [missing, 0]
    return F.pad(t, pad)  # zeros / False: masked out, never attended


def _new_cache(model: Any) -> Any:
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache(config=model.config)
    if any(type(layer) is not DynamicLayer for layer in cache.layers):
        raise ConfigError(
            f"{type(model).__name__} uses sliding-window or other non-standard KV cache layers, which the local "
            f"engine's batching does not support; use a full-attention model or the sglang engine"
        )
    return cache


def _eos_ids(model: Any) -> list[int]:
    ids: list[int] = []
    for source in (model.generation_config.eos_token_id, model.config.get_text_config().eos_token_id):
        for i in source if isinstance(source, (list, tuple)) else [source]:
            if i is not None and int(i) not in ids:
                ids.append(int(i))
    return ids


def _context_window(model: Any, requested: int | None, cap: int = 8192) -> int:
    limit = int(getattr(model.config.get_text_config(), "max_position_embeddings", cap) or cap)
    if requested is None:
        return min(limit, cap)
    if requested < 2 or requested > limit:
        raise ConfigError(f"context_window={requested} must be in [2, {limit}] (the model's max_position_embeddings)")
    return requested


def _deliver(row: _Row, *, result: Generation | None = None, exception: Exception | None = None) -> None:
    _settle(row.loop, row.future, result, exception)


def _settle(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], result: Any, exc: Exception | None) -> None:
    """Resolve `future` on its own loop (thread-safe); a cancelled future or a closed loop is ignored."""

    def resolve() -> None:
        if future.done():
            return
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)

    try:
        loop.call_soon_threadsafe(resolve)
    except RuntimeError:  # the caller's loop is closed: nobody is waiting any more
        pass
