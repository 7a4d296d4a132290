"""LocalEngine: in-process generation with `transformers`, continuously batched in one worker thread.

Owns: loading a checkpoint for generation, the batching loop, per-row sampling (temperature / top-p / top-k, seeded
per request), logprobs, stop / length handling, and in-place weight updates. Does not own tokenization or chat
templates (the runner renders text; this engine is token in, token out) nor resolving model names (`models.py`).

Threads. `generate()` runs on the caller's asyncio loop: it puts a `_Row` into a deque and awaits a future. One
daemon worker thread owns the model and the KV cache; torch releases the GIL, so the event loop keeps running while
it computes. Results go back with `loop.call_soon_threadsafe`. A cancelled `generate()` only flags its row; the
worker drops the row at the next step.

Continuous batching. The running batch (`batch_cache.RunningBatch`) is one left-padded KV cache (per layer keys /
values [B, H, T, D] in preallocated buffers) plus a bool mask [B, T] (False = padding) and each row's next position:

    step:  admit pending rows (up to max_batch_size) -> prefill them as their own left-padded batch (in column chunks
           of at most `prefill_chunk_tokens` tokens) -> sample their first token -> merge their cache into the running
           one (both left-padded to the longer T, concatenated on B) -> one decode forward for all rows ([B, 1]) ->
           sample -> finished / cancelled rows are removed (index_select on B) and all-padding columns trimmed on T.

Invariant: the cache holds every token of a row except its last sampled one, which is the next decode input; its
position id is the row's real-token count, so padding never shifts positions and the logits equal a single-sequence
forward pass (checked by the tests to 1e-4 in fp32).

Prefix cache. A finished row's keys/values are kept per session (`batch_cache.PrefixCache`, LRU, `prefix_cache_mb`),
so a trajectory's next turn (previous input + reply + tool tokens) prefills only its new tokens; `cached_tokens` in
the Generation says how many were reused. Cleared on every weight update.

Deterministic mode (`deterministic=True`, batch invariance). Continuous batching makes a row's numbers depend on
its batch: the gemm kernel BLAS picks follows the row count, and the left padding (set by the longest row) shifts the
reduction order of attention. So the model runs batch-invariant kernels (`invariant.py`: every Linear computes a
fixed row count, `max_batch_size`, zero-padded; a one-token query attends row by row over exactly its own keys),
each row is prefilled alone (chunked at `prefill_chunk_tokens`) and then decoded in the shared batch, its sampler
is seeded by the request's `SamplingParams.seed` alone, and the prefix cache is off (whether a turn hits it depends
on eviction, i.e. timing, and a reused prefix computed by decode steps differs in the last bits from a fresh
prefill). A row's ids and logprobs are then a function of its input ids, its seed, the weights, `max_batch_size`
and torch's thread count only. The cost: prefill one row at a time, every decode step computes `max_batch_size`
rows, and one attention call per row (BENCHMARKS.md).

LoRA adapters (`load_adapter(path, version)`): the adapter's deltas are added to the base weights of the layers it
adapts (the pre-adapter weights of those layers are kept), replacing the previous adapter; see `lora.py`.

Weight updates drain: `update_weights` (and `load_adapter`) stops admission, lets running rows finish with the old
weights, applies the new weights between steps and resumes. Every Generation is produced by exactly one weight
version and tagged with it.
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

from agentrl.engine.batch_cache import PrefixCache, RunningBatch, cache_from_prefixes, new_prefill_cache
from agentrl.engine.invariant import fix_linear_rows, use_rowwise_attention
from agentrl.engine.models import resolve_model, validate_checkpoint_dir
from agentrl.engine.sampling import sample
from agentrl.errors import ConfigError, EngineError, EngineUnavailableError
from agentrl.types import Generation, SamplingParams

# transformers' from_pretrained is not thread-safe: concurrent loads in one process can leave tied weights (lm_head)
# uninitialised. One process-wide lock serialises checkpoint loads (the deliberate exception to "no globals").
_LOAD_LOCK = threading.Lock()
_MAX_SESSIONS = 100_000  # per-session call counters kept for seeding (oldest forgotten first)


@dataclass
class EngineStats:
    """Counters of the batching loop (a snapshot; see `LocalEngine.stats`)."""

    forward_calls: int = 0  # model forward passes (prefill chunks + decode steps)
    prefill_calls: int = 0
    prefill_tokens: int = 0  # prompt tokens computed
    cached_tokens: int = 0  # prompt tokens reused from the prefix cache instead
    decode_steps: int = 0
    max_batch_rows: int = 0  # the most rows any one forward pass carried
    generated_tokens: int = 0
    finished: int = 0
    cancelled: int = 0


@dataclass(eq=False)
class _Row:
    """One generate() call: its inputs, where to deliver the result, and what it generated so far."""

    input_ids: list[int]
    session_id: str
    sampling: SamplingParams
    max_new: int
    stop_ids: frozenset[int]
    generator: torch.Generator | None  # None for greedy rows
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Generation]
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    version: int = 0
    cached: int = 0  # leading input tokens whose keys/values came from the prefix cache
    cancelled: bool = False


@dataclass(eq=False)
class _Update:
    state: Mapping[str, torch.Tensor] | None  # None: the source is the engine's own model (weights shared)
    version: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[None]
    deltas: Mapping[str, torch.Tensor] | None = None  # a LoRA adapter: weight = base weight + delta
    adapter: str | None = None


class LocalEngine:
    """transformers in-process, continuously batched. See the module docstring for the threading and batching model.

    `model_path`: a Hugging Face checkpoint dir (`models.resolve_model` turns "smollm2" into one). `max_batch_size`:
    rows decoded together. `context_window`: prompt + new tokens per sequence (default: the model's
    max_position_embeddings, capped at 8192). `batch_wait_ms`: how long an idle engine waits after a first arrival
    for more to share its prefill. `seed`: with it (or `SamplingParams.seed`) sampling is reproducible per
    (session_id, call index). `num_threads`: sets torch's process-wide intra-op threads (default: torch's choice).
    `prefix_cache_mb`: memory for per-session KV reuse across turns (0 turns it off). `deterministic`: the
    batch-invariant path of the module docstring (invariant kernels, rows prefilled alone, request-seeded, no prefix
    cache).
    `engine.model` is the live module (colocated trainers may share it; see `update_weights`).
    """

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
        prefix_cache_mb: int = 1024,
        deterministic: bool = False,
    ) -> None:
        from transformers import AutoModelForCausalLM

        if max_batch_size < 1 or prefill_chunk_tokens < 1 or max_pending < 1 or prefix_cache_mb < 0:
            raise ConfigError("max_batch_size, prefill_chunk_tokens, max_pending must be >= 1, prefix_cache_mb >= 0")
        self.model_path = resolve_model(model_path)  # a checkpoint dir, or "smollm2" for the embedded model
        if num_threads is not None:
            torch.set_num_threads(num_threads)  # process-wide: torch has one intra-op pool
        self.dtype = _dtype(dtype)
        self.device = torch.device(device)
        with _LOAD_LOCK:
            self.model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=self.dtype).to(self.device).eval()
        if deterministic:
            use_rowwise_attention(self.model)
            fix_linear_rows(self.model, max_batch_size)
        self.vocab_size = int(self.model.config.get_text_config().vocab_size)
        self.eos_token_ids = _eos_ids(self.model)
        self._context_window = _context_window(self.model, context_window)
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_ms / 1000.0
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self.max_pending = max_pending
        self.seed = seed
        self.deterministic = deterministic
        self._version = 0
        self._adapter: str | None = None
        self._adapter_base: dict[str, torch.Tensor] = {}  # the pre-adapter weights of the layers adapters touch
        self._stats = EngineStats()
        self._calls: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._cond = threading.Condition()
        self._pending: collections.deque[_Row] = collections.deque()
        self._updates: collections.deque[_Update] = collections.deque()
        self._closed = False
        self._batch = RunningBatch()
        self._prefix = PrefixCache(0 if deterministic else prefix_cache_mb * 2**20)
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

    async def generate(self, input_ids: list[int], sampling: SamplingParams, *, session_id: str,
                       partial: dict[str, Any] | None = None) -> Generation:
        """`partial` (the stand-in servers): on cancellation it gets the tokens generated so far ("output_ids",
        "logprobs", "version"), which a server returns with an aborted request."""
        if self._closed:
            raise EngineUnavailableError("local engine is closed")
        ids = self._check_ids(input_ids)
        max_new = min(sampling.max_new_tokens, self._context_window - len(ids))
        if max_new <= 0:
            return Generation(output_ids=[], logprobs=[], finish_reason="length", weight_version=self._version)
        loop = asyncio.get_running_loop()
        row = _Row(
            input_ids=ids,
            session_id=session_id,
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
            if partial is not None:  # copies under the GIL; the two lists may differ by the token being appended
                partial.update(output_ids=list(row.output_ids), logprobs=list(row.logprobs), version=row.version)
            raise

    async def update_weights(self, source: Any, version: int) -> None:
        """Copy new weights in place (state dict, nn.Module or checkpoint dir) and tag later generations `version`.

        Waits until rows in flight have finished with the old weights (see module docstring), then applies. Passing
        `engine.model` itself (a trainer that trains the shared module in place) only moves the version; such a
        trainer must not step its optimizer while generations are in flight.
        """
        state = await self._state_from(source)
        loop = asyncio.get_running_loop()
        update = _Update(state=state, version=version, loop=loop, future=loop.create_future())
        await self._apply(update)

    async def load_adapter(self, path: str | os.PathLike[str], version: int, *, name: str | None = None) -> None:
        """Apply the PEFT LoRA adapter saved at `path` on top of the base weights and tag later generations `version`.

        The base is the weights the engine held before its first adapter (kept for the adapted layers only); each
        adapter replaces the previous one: weight = base + (B @ A) * scaling, computed like peft's merge, so the
        engine computes exactly what the trainer's merged model computes. Drains like `update_weights`. A later
        `update_weights` (full weights) becomes the new base.
        """
        from agentrl.engine.lora import adapter_deltas

        deltas = await asyncio.to_thread(adapter_deltas, path)
        params = dict(self.model.named_parameters())
        wrong = {k: tuple(v.shape) for k, v in deltas.items() if k not in params or params[k].shape != v.shape}
        if wrong:
            raise ConfigError(f"load_adapter: {path} does not fit {self.model_path.name}: "
                              f"{dict(list(wrong.items())[:5])} (not in the model or of another shape); was it "
                              "trained on this base model?")
        loop = asyncio.get_running_loop()
        update = _Update(state=None, version=version, loop=loop, future=loop.create_future(), deltas=deltas,
                         adapter=name or str(path))
        await self._apply(update)

    async def unload_adapter(self) -> None:
        """Back to the base weights (the stand-ins' /v1/unload_lora_adapter of the adapter applied now); the weight
        version is kept. Drains like `update_weights`."""
        loop = asyncio.get_running_loop()
        await self._apply(_Update(state=None, version=self._version, loop=loop, future=loop.create_future(),
                                  deltas={}, adapter=None))

    async def _apply(self, update: _Update) -> None:
        """Queue a weight update for the worker (it drains rows in flight first) and wait until it is applied."""
        with self._cond:
            if self._closed:
                raise EngineUnavailableError("local engine is closed")
            self._updates.append(update)
            self._cond.notify()
        await update.future

    @property
    def adapter(self) -> str | None:
        """The adapter applied now (its name or path), None for plain weights."""
        return self._adapter

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
            "deterministic": self.deterministic,
            "max_batch_size": self.max_batch_size,  # deterministic mode: the fixed row count of every Linear
            "threads": torch.get_num_threads(),
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
        """A row's RNG, seeded from (engine seed, sampling.seed, session id, that session's call index); in
        deterministic mode from the request's `sampling.seed` alone (the runner derives one per turn)."""
        if self.deterministic and sampling.seed is not None:
            return torch.Generator(device="cpu").manual_seed(sampling.seed)
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
            raise ConfigError("update_weights: source must be a state dict, nn.Module or checkpoint dir, "
                              f"not {source!r}")
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

        with _LOAD_LOCK:
            return AutoModelForCausalLM.from_pretrained(validate_checkpoint_dir(path), dtype=self.dtype).state_dict()

    # ------------------------------------------------------------------------------------------ worker thread
    def _run(self) -> None:
        reason = EngineUnavailableError("local engine is closed")
        try:
            while self._next_step():
                pass
        except BaseException as exc:  # a bug in the loop itself: callers get an error instead of hanging
            reason = EngineUnavailableError(f"local engine worker stopped: {exc!r}")
            raise
        finally:
            self._fail_all(reason)

    def _next_step(self) -> bool:
        """One iteration of the loop: wait for work, apply updates / admit / decode. False when closing."""
        admitted = self._wait_for_work()
        if admitted is None:
            return False
        with torch.inference_mode():
            try:
                if admitted:
                    self._prefill(admitted)
                self._batch = self._drop_cancelled(self._batch)
                if self._batch.rows:
                    self._batch = self._decode(self._batch)
            except Exception as exc:  # noqa: BLE001 - a failed forward (OOM, bad input) fails its rows, never the loop
                failed = list(dict.fromkeys(admitted + self._rows()))
                self._batch = RunningBatch()
                for row in failed:
                    _deliver(row, exception=EngineError(f"local engine step failed: {exc!r}"))
        return True

    def _wait_for_work(self) -> list[_Row] | None:
        """Block until there is something to do; apply a due weight update; return the rows to admit now."""
        with self._cond:
            while not self._closed and not self._pending and not self._updates and not self._rows():
                self._cond.wait()
            if self._closed:
                return None
            if not self._rows() and self._pending and self.batch_wait_s > 0:
                self._gather_more()
        with self._cond:
            if self._updates and self._rows():
                return []  # drain: no admission while an update waits
            updates = list(self._updates)
            self._updates.clear()
        self._apply_updates(updates)
        with self._cond:
            free = self.max_batch_size - len(self._rows())
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
        if updates:
            self._prefix.clear()  # keys/values computed by the old weights are stale
        for update in updates:
            try:
                if update.deltas is not None:
                    self._apply_adapter(update.deltas)
                    self._adapter = update.adapter
                elif update.state is not None:
                    with torch.no_grad():
                        self.model.load_state_dict(update.state, strict=True)
                    self._adapter_base.clear()  # the new full weights are the base of a later adapter
                    self._adapter = None
                self._version = update.version
                _settle(update.loop, update.future, None, None)
            except Exception as exc:  # noqa: BLE001 - reported to the caller of update_weights
                _settle(update.loop, update.future, None, ConfigError(f"update_weights failed: {exc}"))

    @torch.no_grad()
    def _apply_adapter(self, deltas: Mapping[str, torch.Tensor]) -> None:
        """weight = base + delta for the adapter's layers; layers only a previous adapter touched get their base."""
        params = dict(self.model.named_parameters())
        for name in deltas:
            if name not in self._adapter_base:
                self._adapter_base[name] = params[name].detach().clone()
        for name, base in self._adapter_base.items():
            params[name].copy_(base + deltas[name].to(base.device, base.dtype) if name in deltas else base)

    def _rows(self) -> list[_Row]:
        """Every row being decoded."""
        return self._batch.rows

    def _prefill(self, rows: list[_Row]) -> None:
        """Admit `rows`: take their sessions' cached prefixes, then prefill cache hits and misses as two groups
        (deterministic mode: every row alone, then into the shared batch)."""
        if self.deterministic:
            for row in rows:
                self._batch = self._prefill_group([row], [[]], [0], into=self._batch)
            return
        taken = [self._prefix.take(r.session_id, r.input_ids) for r in rows]
        for hit in (False, True):
            group = [i for i, (_, n) in enumerate(taken) if bool(n) == hit]
            if group:
                self._batch = self._prefill_group([rows[i] for i in group], [taken[i][0] for i in group],
                                                  [taken[i][1] for i in group], into=self._batch)

    def _prefill_group(self, rows: list[_Row], prefixes: list[Any], cached: list[int],
                       into: RunningBatch) -> RunningBatch:
        """Compute the uncached input tokens of `rows` (right-aligned, in column chunks), sample, merge them into
        `into`; returns the merged batch without the rows that already finished.

        Columns: [0, past) hold reused keys/values, [past, past + suffix) are computed here. Row i's tokens are the
        last len(input_ids) columns; it reuses reuse[i] <= cached[i] stored tokens (fewer when another row of the
        group needs more suffix columns: those tokens are simply recomputed)."""
        lengths = [len(r.input_ids) for r in rows]
        suffix = max(n - c for n, c in zip(lengths, cached))
        reuse = [max(0, n - suffix) for n in lengths]
        past = max(reuse)
        ids = torch.zeros((len(rows), suffix), dtype=torch.long)
        mask = torch.zeros((len(rows), past + suffix), dtype=torch.bool)
        for i, row in enumerate(rows):
            row.version, row.cached = self._version, reuse[i]
            todo = row.input_ids[reuse[i] :]
            ids[i, suffix - len(todo) :] = torch.tensor(todo)
            mask[i, past + suffix - lengths[i] :] = True
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)[:, past:]
        cache = cache_from_prefixes(self.model, prefixes, reuse) if past else new_prefill_cache(self.model)
        chunk = max(1, self.prefill_chunk_tokens // len(rows))
        for start in range(0, suffix, chunk):
            end = min(suffix, start + chunk)
            out = self.model(
                input_ids=ids[:, start:end], attention_mask=mask[:, : past + end],
                position_ids=positions[:, start:end], cache=cache, use_cache=True, logits_to_keep=1,
            )
            self._count(prefill=True, rows=len(rows))
        with self._cond:
            self._stats.prefill_tokens += sum(lengths) - sum(reuse)
            self._stats.cached_tokens += sum(reuse)
        fresh = RunningBatch(rows=list(rows), cache=cache, mask=mask,
                             next_pos=torch.tensor(lengths, device=self.device))
        merged = into.merge(fresh)
        return self._sample_and_finish(merged, out.logits[:, -1], first=len(merged.rows) - len(rows))

    def _decode(self, batch: RunningBatch) -> RunningBatch:
        last = torch.tensor([r.output_ids[-1] for r in batch.rows], device=self.device)
        batch.mask = torch.cat([batch.mask, batch.mask.new_ones((len(batch.rows), 1))], dim=1)
        out = self.model(
            input_ids=last[:, None], attention_mask=batch.mask, position_ids=batch.next_pos[:, None],
            cache=batch.cache, use_cache=True, logits_to_keep=1,
        )
        batch.next_pos = batch.next_pos + 1
        self._count(prefill=False, rows=len(batch.rows))
        return self._sample_and_finish(batch, out.logits[:, -1], first=0)

    def _sample_and_finish(self, batch: RunningBatch, logits: torch.Tensor, first: int) -> RunningBatch:
        """Sample one token for rows[first:] (whose logits are `logits`), deliver finished rows; returns the batch
        without them."""
        rows = batch.rows[first:]
        tokens, logprobs = sample(logits, [r.sampling for r in rows], [r.generator for r in rows])
        with self._cond:  # counted before any result is delivered, so a caller's snapshot includes its tokens
            self._stats.generated_tokens += len(rows)
        keep = list(range(first))
        for offset, (row, token, logprob) in enumerate(zip(rows, tokens.tolist(), logprobs.tolist())):
            row.output_ids.append(token)
            row.logprobs.append(logprob)
            if token in row.stop_ids or len(row.output_ids) >= row.max_new:
                self._finish(batch, row, "stop" if token in row.stop_ids else "length", first + offset)
            else:
                keep.append(first + offset)
        return batch.select(keep) if len(keep) < len(batch.rows) else batch

    def _drop_cancelled(self, batch: RunningBatch) -> RunningBatch:
        keep = [i for i, r in enumerate(batch.rows) if not r.cancelled]
        if len(keep) == len(batch.rows):
            return batch
        with self._cond:
            self._stats.cancelled += len(batch.rows) - len(keep)
        return batch.select(keep)

    def _finish(self, batch: RunningBatch, row: _Row, reason: str, index: int) -> None:
        """Deliver row `index` of the batch and keep its keys/values for the session's next turn."""
        if self._prefix.max_bytes:
            length = len(row.input_ids) + len(row.output_ids) - 1  # the last sampled token was never fed
            tokens = (row.input_ids + row.output_ids)[:length]
            self._prefix.put(row.session_id, tokens, batch.row_kv(index, length))
        generation = Generation(
            output_ids=row.output_ids, logprobs=row.logprobs, finish_reason=reason, weight_version=row.version,
            cached_tokens=row.cached,
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
            rows = list(self._pending) + self._rows()
            updates = list(self._updates)
            self._pending.clear()
            self._updates.clear()
            self._batch = RunningBatch()
        for row in rows:
            _deliver(row, exception=exc)
        for update in updates:
            _settle(update.loop, update.future, None, exc)


def _dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    value = getattr(torch, str(dtype), None)
    if not isinstance(value, torch.dtype):
        raise ConfigError(f"dtype={dtype!r} is not a torch dtype: use 'float32' or 'bfloat16'")
    return value


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
