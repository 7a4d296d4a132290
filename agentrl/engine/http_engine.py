"""HTTPEngine: the GenerationEngine over HTTP inference servers; `SGLangEngine` and `VLLMEngine` are its two faces.

Owns what every HTTP client does the same way: the constructor checks and state (worker URLs, timeouts, retries, the
pooled transport `http.Transport`, the sticky per-trajectory router `routing.WorkerRouter`, stats), `connect()`
(learn the workers, read each one's facts once, adopt the context window and weight version they report), the
generate loop, control calls fanned out to every worker with bounded retries, weight updates behind the gate
(`weight_gate.WeightGate`), and reading weight-version labels. A subclass owns its server's face only:

    _body(ids, sampling, max_new, session_id)   agentrl's request -> the server's request body
    _parse(data, url)                           the server's answer -> Generation (finish, ids, logprobs, version)
    _worker_info(url) / _adopt(infos)           which endpoints tell the window, version and served model
    _load_everywhere(path, v) / _verify_version(v)   the server's weight-update endpoints
    _load_adapter_everywhere(name, path, v) / _unload_adapter_everywhere(name) / _adapter_fields(name)
                                                the server's LoRA endpoints and how a request names the adapter
    generate_path, request_id_field, session_header, health_path, errors (its HTTP error classes), and its
    control calls (pause, resume, flush, ...)

One generate call, by attempt:

    wait while our own weight update runs -> pick a worker (sticky) -> POST generate_path with a fresh request id
      ok, finish stop|length               -> Generation (tagged with the server's weight version, cached tokens)
      ok, finish abort (or two versions)   -> re-submit (the whole turn is generated again)
      transient (refused, reset, timeout, 408/429/5xx) -> cool the worker down, unpin the session, back off, retry
      other 4xx                            -> the client's HTTP error at once, with the server's own message
    after `retries` re-submissions: an abort is returned as finish_reason "abort" (the runner never stores it as a
    turn: the trajectory becomes infra_error and is retried); a transient failure raises EngineUnavailableError.

Weight update (`update_weights(path, version)`): with the gate closed, `_load_everywhere` on every worker, then
`_verify_version` on every worker, then later turns are tagged `version`. Client-side timeouts and cancellation
close the connection; the servers abort a request whose client disconnected.

LoRA adapter update (`load_adapter(path, version)`, `weight_sync: adapter`): the same gate, but only the adapter dir
(adapter_model.safetensors + adapter_config.json) travels: `_load_adapter_everywhere` loads it on every worker under
a new name `<adapter_prefix>-v<version>` and sets the weight-version label, `_verify_version` checks the label, then
every later request names the new adapter (added per attempt, after the gate, so a re-submitted request never names
an old one) and the previous adapter is unloaded. Turns are tagged exactly as with full weights.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import random
import urllib.error
import urllib.request
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.engine.http import Errors, Limits, TransientError, Transport
from agentrl.engine.routing import WorkerRouter
from agentrl.engine.weight_gate import WeightGate
from agentrl.errors import ConfigError, EngineError, EngineUnavailableError
from agentrl.types import Generation, SamplingParams

MAX_BACKOFF_S = 10.0
DEFAULT_VERSION_LABEL = "default"  # the weight-version label SGLang and vLLM report before any update


@dataclass
class EngineStats:
    requests: int = 0  # generate requests sent (attempts)
    retried_transient: int = 0
    retried_aborted: int = 0  # aborted or straddling generations re-submitted
    returned_aborted: int = 0
    weight_updates: int = 0


class HTTPEngine:
    """See the module docstring. `urls`: the workers (agentrl routes each trajectory to one); `router_url`: one URL
    that routes by itself (then `urls`, if given, are the workers for control calls, else `_discover_workers`)."""

    name: str  # "sglang", "vllm": trajectory meta, logger agentrl.engine.<name>
    server: str  # "SGLang", "vLLM": in messages
    worker_noun = "workers"
    no_urls = "give the server URLs (engine.urls / --engine-url)"
    version_fix = "start the server with the default weight version"
    errors = Errors()
    generate_path: str
    request_id_field: str
    session_header: str
    health_path: str

    def __init__(
        self,
        *,
        urls: Sequence[str] = (),
        router_url: str | None = None,
        eos_token_ids: Sequence[int] = (),
        context_window: int | None = None,
        model_path: str | None = None,
        max_connections: int = 256,
        request_timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
        control_timeout_s: float = 600.0,
        retries: int = 3,
        retry_backoff_s: float = 0.5,
        max_sessions: int = 100_000,
        initial_weight_version: int = 0,
    ) -> None:
        self._static_workers = [clean_url(u, "engine.urls") for u in urls]
        self.router_url = clean_url(router_url, "engine.router_url") if router_url else None
        if not self._static_workers and self.router_url is None:
            raise ConfigError(f"{self.name} engine: {self.no_urls}")
        self._check_options()
        if retries < 0 or request_timeout_s <= 0 or max_connections < 1:
            raise ConfigError(f"{self.name} engine: retries >= 0, request_timeout_s > 0 and max_connections >= 1 "
                              "required")
        self.eos_token_ids = [int(i) for i in eos_token_ids]
        self.model_path = model_path
        self.request_timeout_s = request_timeout_s
        self.control_timeout_s = control_timeout_s
        self.retries = retries
        self.retry_backoff_s = retry_backoff_s
        self.stats = EngineStats()
        self.log = logging.getLogger(f"agentrl.engine.{self.name}")
        self._context_window = context_window
        self._version = initial_weight_version
        self._initial_version = initial_weight_version
        self._transport = Transport(Limits(max_connections=max_connections, connect_timeout_s=connect_timeout_s,
                                           request_timeout_s=request_timeout_s), self.errors)
        self._router = None if self.router_url else WorkerRouter(self._static_workers, max_sessions=max_sessions)
        self._workers: list[str] = list(self._static_workers)
        self._server: dict[str, Any] = {}
        self._connected = False
        self._connect_lock: asyncio.Lock | None = None
        self._gate = WeightGate()
        self._fence = 0  # +1 when one of our weight updates starts and +1 when it ends (versions without spans)
        self._broken: str | None = None  # why the servers cannot generate (a failed load left no usable weights)
        self.adapter_prefix = f"agentrl-{uuid.uuid4().hex[:8]}"  # adapter names of this client: unique per run
        self._adapter: str | None = None  # the LoRA adapter later requests name (None: the base model)
        self._stale_adapters: list[str] = []  # adapters whose unload failed (retried on the next update)

    def _check_options(self) -> None:
        """The subclass's own option checks (run before the common ones)."""

    # ------------------------------------------------------------------------------------------- properties
    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def context_window(self) -> int:
        if self._context_window is None:
            raise EngineError(f"{self.name} engine: context window unknown; await engine.connect() or set "
                              "engine.context_window")
        return self._context_window

    @property
    def adapter(self) -> str | None:
        """The name of the LoRA adapter requests carry now (None: the base model)."""
        return self._adapter

    @property
    def workers(self) -> list[str]:
        """The worker URLs control calls go to (known after `connect()` in router mode)."""
        return list(self._workers)

    @property
    def in_flight(self) -> dict[str, int]:
        """Generate requests in flight per worker (direct routing only)."""
        return dict(self._router.in_flight) if self._router else {}

    def worker_of(self, session_id: str) -> str | None:
        """The worker a session is pinned to (direct routing only)."""
        return self._router.worker_of(session_id) if self._router else None

    # ------------------------------------------------------------------------------------------- lifecycle
    async def connect(self) -> None:
        """Learn the workers, read each one's facts (`_worker_info`) and adopt them (`_adopt`). Idempotent;
        `generate` and the control calls run it on first use."""
        if self._connected:  # the hot path: no lock round trip per generate call
            return
        if self._connect_lock is None:
            self._connect_lock = asyncio.Lock()
        async with self._connect_lock:
            if self._connected:
                return
            if not self._workers:
                self._workers = await self._discover_workers()
            infos = await asyncio.gather(*(self._worker_info(u) for u in self._workers))
            self._adopt(dict(zip(self._workers, infos)))
            self._connected = True

    async def close(self) -> None:
        await self._transport.close()

    def end_session(self, session_id: str) -> None:
        """The trajectory is over: forget its sticky worker (otherwise dropped least-recently-used)."""
        if self._router is not None:
            self._router.forget(session_id)

    def info(self) -> dict[str, Any]:
        return {"engine": self.name, "model": self.model_path, "workers": list(self._workers), **self._server}

    async def health(self) -> bool:
        """True when every worker answers `health_path` with 200."""
        try:
            await self.connect()
            await self._on_workers("GET", self.health_path, retries=0, timeout_s=30.0)
        except EngineError as exc:
            self.log.warning("%s health check failed: %s", self.name, exc)
            return False
        return True

    # ------------------------------------------------------------------------------------------- generate
    async def generate(self, input_ids: list[int], sampling: SamplingParams, *, session_id: str) -> Generation:
        ids = input_ids if type(input_ids) is list else list(input_ids)  # sent as is: no per-token copy on the hot path
        if not ids:
            raise ConfigError("generate: input_ids is empty; render at least one prompt token")
        if self._broken is not None:
            raise EngineError(self._broken)
        if not self._connected:
            await self.connect()
        max_new = min(sampling.max_new_tokens, self.context_window - len(ids))
        if max_new <= 0:
            return Generation(output_ids=[], logprobs=[], finish_reason="length", weight_version=self._version)
        body = self._body(ids, sampling, max_new, session_id)
        last: Generation | TransientError | None = None
        for attempt in range(self.retries + 1):
            if isinstance(last, TransientError):
                self.stats.retried_transient += 1
                await asyncio.sleep(self._backoff(attempt))
            elif isinstance(last, Generation):
                self.stats.retried_aborted += 1
            await self._gate.wait()
            url = self._pick(session_id)
            try:
                gen = await self._generate_once(url, body, session_id)
            except TransientError as exc:
                self.log.warning("%s %s attempt %d/%d failed: %s", self.name, self.generate_path, attempt + 1,
                                 self.retries + 1, exc)
                if self._router is not None:
                    self._router.failed(url, session_id)
                last = exc
                continue
            if gen.finish_reason != "abort":
                return gen
            last = gen
        if isinstance(last, Generation):
            self.stats.returned_aborted += 1
            return last
        raise EngineUnavailableError(f"{self.name} {self.generate_path} failed {self.retries + 1} times "
                                     f"(retries={self.retries}); last: {last}")

    async def _generate_once(self, url: str, body: dict[str, Any], session_id: str) -> Generation:
        fence = self._fence  # read after the gate opened: which of our updates this request may have straddled
        payload = {**body, self.request_id_field: uuid.uuid4().hex}
        if self._adapter is not None:  # read per attempt, after the gate: never an adapter that was replaced
            payload.update(self._adapter_fields(self._adapter))
        headers = {self.session_header: session_id}
        self.stats.requests += 1
        if self._router is None:
            data = await self._transport.request("POST", f"{url}{self.generate_path}", body=payload, headers=headers)
        else:
            with self._router.track(url):
                data = await self._transport.request("POST", f"{url}{self.generate_path}", body=payload,
                                                     headers=headers)
        return self._parse(data, url, fence)

    def _fenced_version(self, fence: int) -> int | None:
        """The weight version of an answer to a request sent at `fence`: ours when no update of ours started since
        (the servers' weights are written only by us), None when one did (the answer may straddle it: re-run)."""
        return self._version if fence == self._fence else None

    def _pick(self, session_id: str) -> str:
        if self._router is None:
            return self.router_url  # type: ignore[return-value]
        return self._router.pick(session_id)

    def _body(self, ids: list[int], sampling: SamplingParams, max_new: int, session_id: str) -> dict[str, Any]:
        raise NotImplementedError  # pragma: no cover - the subclass's request mapping

    def _parse(self, data: Any, url: str, fence: int = 0) -> Generation:
        raise NotImplementedError  # pragma: no cover - the subclass's answer mapping

    # ------------------------------------------------------------------------------------------- weights
    async def update_weights(self, source: Any, version: int) -> None:
        """Load the checkpoint dir `source` (visible to every worker) on every worker, tagged `version`."""
        if not isinstance(source, (str, os.PathLike)):
            raise ConfigError(f"{self.name} engine: update_weights needs a checkpoint directory saved with "
                              f"save_pretrained (got {type(source).__name__}); use weight_sync: disk")
        await self.connect()
        async with self._gate.closed(), self._fenced():
            await self._load_everywhere(os.fspath(source), version)
            await self._verify_version(version)
            self._version = version
            self._broken = None  # a complete load repairs servers a failed one had broken
            self.stats.weight_updates += 1
            if self._adapter is not None:  # full weights replace the adapter: later requests go to the new base
                self._stale_adapters.append(self._adapter)
                self._adapter = None
            await self._unload_stale()

    async def load_adapter(self, path: str | os.PathLike[str], version: int) -> None:
        """Load the LoRA adapter dir `path` (visible to every worker) on every worker, tagged `version`; later
        requests name it and the previous adapter is unloaded."""
        if not isinstance(path, (str, os.PathLike)):
            raise ConfigError(f"{self.name} engine: load_adapter needs an adapter directory saved with peft's "
                              f"save_pretrained (got {type(path).__name__})")
        await self.connect()
        name = f"{self.adapter_prefix}-v{version}"
        async with self._gate.closed(), self._fenced():
            await self._load_adapter_everywhere(name, os.fspath(path), version)
            await self._verify_version(version)
            if self._adapter is not None and self._adapter != name:
                self._stale_adapters.append(self._adapter)
            self._adapter, self._version = name, version
            self.stats.weight_updates += 1
            await self._unload_stale()

    @contextlib.asynccontextmanager
    async def _fenced(self) -> Any:
        """Mark one weight update of ours: every request in flight across it is re-run by servers without spans."""
        self._fence += 1
        try:
            yield
        finally:
            self._fence += 1

    async def _unload_stale(self) -> None:
        """Unload the adapters no request names any more; one that fails stays listed for the next update."""
        for stale in list(self._stale_adapters):
            try:
                await self._unload_adapter_everywhere(stale)
            except EngineError as exc:  # the new weights serve; an old adapter left loaded only costs memory
                self.log.warning("%s: unloading LoRA adapter %s failed (retried on the next update): %s",
                                 self.name, stale, exc)
            else:
                self._stale_adapters.remove(stale)

    async def _load_everywhere(self, path: str, version: int) -> None:
        raise NotImplementedError  # pragma: no cover - the subclass's update endpoints

    async def _load_adapter_everywhere(self, name: str, path: str, version: int) -> None:
        raise ConfigError(f"{self.name} engine: no LoRA adapter loading; use weight_sync: disk")  # pragma: no cover

    async def _unload_adapter_everywhere(self, name: str) -> None:
        raise NotImplementedError  # pragma: no cover - the subclass's unload endpoint

    def _adapter_fields(self, name: str) -> dict[str, Any]:
        raise NotImplementedError  # pragma: no cover - how the subclass's requests name an adapter

    async def _verify_version(self, version: int) -> None:
        raise NotImplementedError  # pragma: no cover - the subclass's version endpoint

    def _parse_version(self, value: Any, url: str) -> int:
        if value is None or value == DEFAULT_VERSION_LABEL:
            return self._initial_version
        try:
            return int(value)
        except (TypeError, ValueError):
            raise EngineError(f"{self.server} {url} reports weight version {value!r}, not an integer: agentrl tags "
                              f"turns with integer versions ({self.version_fix})") from None

    # ------------------------------------------------------------------------------------------- control
    async def _on_workers(self, method: str, path: str, body: Any = None, *, retries: int | None = None,
                          timeout_s: float | None = None) -> dict[str, Any]:
        """Call `path` on every worker concurrently; wait for all, then raise one error naming each failure."""
        urls = list(self._workers)
        results = await asyncio.gather(
            *(self._call(method, f"{u}{path}", body, retries=retries, timeout_s=timeout_s) for u in urls),
            return_exceptions=True)
        failed = {u: r for u, r in zip(urls, results) if isinstance(r, BaseException)}
        for r in failed.values():
            if not isinstance(r, Exception):
                raise r  # cancellation and the like
        if failed:
            detail = "; ".join(f"{u}: {e}" for u, e in failed.items())
            cls = EngineUnavailableError if all(isinstance(e, TransientError) for e in failed.values()) else EngineError
            raise cls(f"{method} {path} failed on {len(failed)}/{len(urls)} {self.worker_noun}: {detail}"
                      f"{self._failure_hint(failed)}")
        return {u: r for u, r in zip(urls, results)}

    def _failure_hint(self, failed: dict[str, BaseException]) -> str:
        """A fix appended to a failed fan-out's message (none by default)."""
        return ""

    async def _call(self, method: str, url: str, body: Any = None, *, retries: int | None = None,
                    timeout_s: float | None = None) -> Any:
        """One control/metadata request with bounded retries on transient failures; `_control_answer` judges it."""
        budget = self.retries if retries is None else retries
        for attempt in range(budget + 1):
            try:
                data = await self._transport.request(method, url, body=body,
                                                     timeout_s=timeout_s or self.control_timeout_s)
            except TransientError:
                if attempt >= budget:
                    raise
                await asyncio.sleep(self._backoff(attempt + 1))
                continue
            return self._control_answer(url, data)
        raise AssertionError("unreachable")

    def _control_answer(self, url: str, data: Any) -> Any:
        """A control call's answer (a subclass may refuse a 200 that reports failure)."""
        return data

    def _backoff(self, attempt: int) -> float:
        return min(self.retry_backoff_s * 2 ** (attempt - 1), MAX_BACKOFF_S) * random.uniform(0.5, 1.0)

    # ------------------------------------------------------------------------------------------- connect
    async def _discover_workers(self) -> list[str]:
        raise ConfigError(f"{self.name} engine: give the worker URLs (engine.urls)")  # pragma: no cover

    async def _worker_info(self, url: str) -> dict[str, Any]:
        raise NotImplementedError  # pragma: no cover - the subclass's metadata endpoints

    def _adopt(self, infos: dict[str, dict[str, Any]]) -> None:
        raise NotImplementedError  # pragma: no cover

    def _adopt_window(self, windows: list[Any], field: str) -> None:
        """Take the smallest context window the workers report in `field` (never more than the configured one)."""
        known = [int(w) for w in windows if isinstance(w, int) and w > 0]
        if known:
            server_window = min(known)
            if self._context_window is not None and self._context_window > server_window:
                self.log.warning("engine.context_window=%d exceeds the servers' %s %d; using %d",
                                 self._context_window, field, server_window, server_window)
            self._context_window = min(self._context_window or server_window, server_window)

    def _adopt_version(self, labels: dict[str, Any]) -> None:
        """Take the newest weight version the workers report (their labels by URL); warn when they disagree."""
        parsed = {u: self._parse_version(v, u) for u, v in labels.items()}
        if len(set(parsed.values())) > 1:
            self.log.warning("%s %s report different weight versions %s: one may have restarted with stale "
                             "weights; the next update_weights brings them in line", self.name, self.worker_noun,
                             labels)
        self._version = max(parsed.values())

    def _unreachable(self, url: str, exc: TransientError, start: str) -> EngineUnavailableError:
        return EngineUnavailableError(
            f"cannot reach {self.server} {self.worker_noun[:-1]} {url} ({exc.reason}) after {self.retries + 1} "
            f"attempts: start it ({start}) or fix engine.urls")


def clean_url(url: str, field: str) -> str:
    url = str(url).strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"{field}: {url!r} is not an http(s) URL (e.g. http://127.0.0.1:30000)")
    return url


def turn_seed(seed: int, session_id: str, context_len: int) -> int:
    """A per-turn seed: the context length grows every turn, so (seed, session, length) never repeats in a run."""
    key = f"{seed}|{session_id}|{context_len}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1


def checkpoint_facts(path: str | os.PathLike[str]) -> tuple[list[int], int | None]:
    """End-of-sequence ids (generation_config.json, then config.json: the LocalEngine's rule) and the
    max_position_embeddings of a checkpoint dir, read from its JSON files."""

    def read(name: str) -> dict[str, Any]:
        f = Path(path) / name
        return json.loads(f.read_text()) if f.is_file() else {}

    config, generation = read("config.json"), read("generation_config.json")
    text = config.get("text_config") or config
    eos: list[int] = []
    for source in (generation.get("eos_token_id"), text.get("eos_token_id")):
        for i in source if isinstance(source, list) else [source]:
            if i is not None and int(i) not in eos:
                eos.append(int(i))
    window = text.get("max_position_embeddings")
    return eos, int(window) if window else None


def read_server_json(url: str, path: str, *, server: str, timeout_s: float = 30.0) -> tuple[str, Any]:
    """(endpoint, its JSON) for GET `url` + `path`. Blocking: start-up wiring only, never from async code."""
    endpoint = f"{clean_url(url, 'engine URL')}{path}"
    try:
        with urllib.request.urlopen(endpoint, timeout=timeout_s) as resp:
            return endpoint, json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise EngineUnavailableError(f"cannot read {endpoint} ({exc}): is the {server} server up? Or pass --model "
                                     "with a local copy of the served checkpoint") from None
