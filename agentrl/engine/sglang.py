"""SGLangEngine: the GenerationEngine for SGLang servers, token in / token out over SGLang's native HTTP API.

Owns: the `/generate` request (exact SGLang 0.5.23 names, see `_body`), reading ids + logprobs from
`meta_info.output_token_logprobs`, the finish reason, weight version and cached tokens of every turn; clamping
`max_new_tokens` to the context window; retries; routing (agentrl's own sticky router over worker URLs, or one
sglang-router URL with `X-SMG-Routing-Key`); and the control calls (weight updates, pause/continue, flush, health),
which always go to every worker directly because the router does not proxy them. Does not own tokenization (the
runner's), the HTTP details (`sglang_http.py`) or the per-session worker choice (`sglang_routing.py`).

One generate call, by attempt:

    wait while our own weight update runs -> pick a worker (sticky) -> POST /generate with a fresh rid
      ok, finish stop|length      -> Generation (tagged with the server's weight_version and cached_tokens)
      ok, finish abort            -> re-submit (the server aborted it: weight update, pause, abort_request)
      transient (refused, reset, timeout, 408/429/5xx) -> cool the worker down, unpin the session, back off, retry
      4xx                         -> SGLangHTTPError at once, with SGLang's message
    after `retries` re-submissions: an abort is returned as finish_reason "abort" (the runner never stores it as a
    turn: it raises EngineError and the trajectory is retried as infra_error); a transient failure raises
    EngineUnavailableError.

A generation whose `meta_info.weight_versions` spans two versions (possible with `pause_generation(mode="retract")`
on the server) is treated like an abort: every stored turn is produced by exactly one weight version.

Weight update (`update_weights(path, version)`), on every worker, while our new /generate calls wait locally:
    weight_update="pause":     /pause_generation {"mode": "abort"} -> /update_weights_from_disk -> (always, even
                               on failure) /continue_generation
    weight_update="abort_all": /update_weights_from_disk {"abort_all_requests": true}
then `/model_info` on every worker must report the new `weight_version`.

Seeds. A sampled request with `SamplingParams.seed` carries `sampling_params.sampling_seed`. With
`deterministic=True` it is that seed exactly (the runner derives one per turn, runner/seeds.py); otherwise a per-turn
seed mixed from (seed, session, context length). SGLang honours `sampling_seed` only when the server runs
`--enable-deterministic-inference` (batch-invariant kernels); `connect()` reads `enable_deterministic_inference`
from every worker's /server_info and warns when `deterministic=True` is asked of a server that does not run it.
Client-side timeouts and cancellation close the connection; SGLang aborts a request whose client disconnected.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from agentrl.engine.sglang_http import Limits, SGLangHTTPError, TransientError, Transport
from agentrl.engine.sglang_routing import WorkerRouter
from agentrl.engine.server_weights import ServerWeights
from agentrl.errors import ConfigError, EngineError, EngineUnavailableError
from agentrl.types import Generation, SamplingParams

log = logging.getLogger("agentrl.engine.sglang")

ROUTING_HEADER = "X-SMG-Routing-Key"
DEFAULT_VERSION_LABEL = "default"  # what SGLang reports before any update (`--weight-version default`)


@dataclass
class SGLangStats:
    requests: int = 0  # /generate requests sent (attempts)
    retried_transient: int = 0
    retried_aborted: int = 0
    returned_aborted: int = 0
    weight_updates: int = 0


class SGLangEngine(ServerWeights):
    """See the module docstring. Either `urls` (workers; agentrl routes) or `router_url` (sglang-router routes;
    `urls`, if also given, are the workers for control calls, else they are read from the router's GET /workers)."""

    name = "sglang"

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
        weight_update: Literal["pause", "abort_all"] = "pause",
        max_sessions: int = 100_000,
        initial_weight_version: int = 0,
        deterministic: bool = False,
    ) -> None:
        self._static_workers = [_clean_url(u, "engine.urls") for u in urls]
        self.router_url = _clean_url(router_url, "engine.router_url") if router_url else None
        if not self._static_workers and self.router_url is None:
            raise ConfigError("sglang engine: give worker URLs (engine.urls / --engine-url) or engine.router_url")
        if weight_update not in ("pause", "abort_all"):
            raise ConfigError(f"engine.weight_update={weight_update!r}: use 'pause' or 'abort_all'")
        if retries < 0 or request_timeout_s <= 0 or max_connections < 1:
            raise ConfigError("sglang engine: retries >= 0, request_timeout_s > 0 and max_connections >= 1 required")
        self.eos_token_ids = [int(i) for i in eos_token_ids]
        self.model_path = model_path
        self.request_timeout_s = request_timeout_s
        self.control_timeout_s = control_timeout_s
        self.retries = retries
        self.retry_backoff_s = retry_backoff_s
        self.weight_update = weight_update
        self.deterministic = deterministic
        self.stats = SGLangStats()
        self._context_window = context_window
        self._version = initial_weight_version
        self._initial_version = initial_weight_version
        self._transport = Transport(Limits(max_connections=max_connections, connect_timeout_s=connect_timeout_s,
                                           request_timeout_s=request_timeout_s))
        self._router = None if self.router_url else WorkerRouter(self._static_workers, max_sessions=max_sessions)
        self._workers: list[str] = list(self._static_workers)
        self._init_server_state()

    # ------------------------------------------------------------------------------------------- properties
    @property
    def in_flight(self) -> dict[str, int]:
        """/generate requests in flight per worker (direct routing only)."""
        return dict(self._router.in_flight) if self._router else {}

    def worker_of(self, session_id: str) -> str | None:
        """The worker a session is pinned to (direct routing only)."""
        return self._router.worker_of(session_id) if self._router else None

    # ------------------------------------------------------------------------------------------- lifecycle
    async def connect(self) -> None:
        """Learn the workers (router: GET /workers), read /model_info and /server_info of each: context window,
        current weight version. Idempotent; `generate` and the control calls run it on first use."""
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
        return {"engine": self.name, "model": self.model_path, "workers": list(self._workers),
                "router": self.router_url, **self._server}

    # ------------------------------------------------------------------------------------------- generate
    async def generate(self, input_ids: list[int], sampling: SamplingParams, *, session_id: str) -> Generation:
        ids = input_ids if type(input_ids) is list else list(input_ids)  # sent as is: no per-token copy on the hot path
        if not ids:
            raise ConfigError("generate: input_ids is empty; render at least one prompt token")
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
            await self._wait_gate()
            url = self._pick(session_id)
            try:
                gen = await self._generate_once(url, body, session_id)
            except TransientError as exc:
                log.warning("sglang /generate attempt %d/%d failed: %s", attempt + 1, self.retries + 1, exc)
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
        raise EngineUnavailableError(f"sglang /generate failed {self.retries + 1} times (retries={self.retries}); "
                                     f"last: {last}")

    def _body(self, ids: list[int], sampling: SamplingParams, max_new: int, session_id: str) -> dict[str, Any]:
        """The /generate body with SGLang's exact names (unknown sampling keys are a 400 on the server and are
        silently dropped by sglang-router). Ids and logprobs keep the stop token (`no_stop_trim` only concerns
        `text`). `rid` is added per attempt."""
        stops = list(dict.fromkeys([*sampling.stop_token_ids, *self.eos_token_ids]))
        params: dict[str, Any] = {
            "max_new_tokens": max_new, "temperature": sampling.temperature, "top_p": sampling.top_p,
            "top_k": sampling.top_k if sampling.top_k > 0 else -1, "stop_token_ids": stops,
            "no_stop_trim": True, "skip_special_tokens": False,
        }
        if sampling.seed is not None and not sampling.greedy:  # honoured by --enable-deterministic-inference
            seed = sampling.seed if self.deterministic else _turn_seed(sampling.seed, session_id, len(ids))
            params["sampling_seed"] = seed
        return {"input_ids": ids, "return_logprob": True, "logprob_start_len": -1, "sampling_params": params}

    async def _generate_once(self, url: str, body: dict[str, Any], session_id: str) -> Generation:
        payload = {**body, "rid": uuid.uuid4().hex}
        self.stats.requests += 1
        if self._router is None:
            data = await self._post_generate(url, payload, session_id)
        else:
            with self._router.track(url):
                data = await self._post_generate(url, payload, session_id)
        return self._parse(data, url)

    async def _post_generate(self, url: str, payload: dict[str, Any], session_id: str) -> Any:
        return await self._transport.request("POST", f"{url}/generate", body=payload,
                                             headers={ROUTING_HEADER: session_id})

    def _parse(self, data: Any, url: str) -> Generation:
        """Read one non-streamed /generate answer into a Generation."""
        if not isinstance(data, dict) or not isinstance(data.get("meta_info"), dict):
            raise EngineError(f"SGLang {url}/generate: unexpected answer {str(data)[:300]!r}")
        meta = data["meta_info"]
        reason = (meta.get("finish_reason") or {}).get("type")
        if reason not in ("stop", "length", "abort"):
            raise EngineError(f"SGLang {url}/generate: unknown finish_reason {meta.get('finish_reason')!r}")
        entries = meta.get("output_token_logprobs") or []  # [[logprob, token_id, text|None], ...]
        ids = [int(e[1]) for e in entries]
        logprobs = [float("nan") if e[0] is None else float(e[0]) for e in entries]
        if reason != "abort":
            if data.get("output_ids") is not None and list(data["output_ids"]) != ids:
                raise EngineError(f"SGLang {url}/generate: output_ids and output_token_logprobs disagree")
            if any(e[0] is None for e in entries):
                raise EngineError(f"SGLang {url}/generate: a logprob is null (was return_logprob dropped?)")
            if len({s.get("version") for s in meta.get("weight_versions") or []}) > 1:
                reason = "abort"  # weights changed mid-generation (retract mode): never stored as one turn
        return Generation(output_ids=ids, logprobs=logprobs, finish_reason=reason,
                          weight_version=self._parse_version(meta.get("weight_version"), url),
                          cached_tokens=int(meta.get("cached_tokens") or 0),
                          worker=url if self._router is not None else None)

    def _pick(self, session_id: str) -> str:
        if self._router is None:
            return self.router_url  # type: ignore[return-value]
        return self._router.pick(session_id)

    # ------------------------------------------------------------------------------------------- control
    async def _load_everywhere(self, path: str, version: int) -> None:
        body: dict[str, Any] = {"model_path": path, "weight_version": str(version), "flush_cache": True}
        if self.weight_update == "abort_all":
            await self._on_workers("POST", "/update_weights_from_disk", {**body, "abort_all_requests": True})
            return
        try:
            await self._on_workers("POST", "/pause_generation", {"mode": "abort"})
            await self._on_workers("POST", "/update_weights_from_disk", body)
        finally:
            await self._on_workers("POST", "/continue_generation", {})  # never leave a worker paused

    async def _verify_version(self, version: int) -> None:
        infos = await self._on_workers("GET", "/model_info")
        wrong = {u: i.get("weight_version") for u, i in infos.items() if str(i.get("weight_version")) != str(version)}
        if wrong:
            raise EngineError(f"weight update to version {version} did not land: /model_info reports {wrong}")

    async def pause(self, mode: Literal["abort", "retract", "in_place"] = "abort") -> None:
        await self.connect()
        await self._on_workers("POST", "/pause_generation", {"mode": mode})

    async def resume(self) -> None:
        await self.connect()
        await self._on_workers("POST", "/continue_generation", {})

    async def flush_cache(self) -> None:
        await self.connect()
        await self._on_workers("POST", "/flush_cache")

    async def abort_all(self) -> None:
        await self.connect()
        await self._on_workers("POST", "/abort_request", {"abort_all": True})

    async def health(self) -> bool:
        """True when every worker answers /health_generate (a one-token generation) with 200."""
        try:
            await self.connect()
            await self._on_workers("GET", "/health_generate", retries=0, timeout_s=30.0)
        except EngineError as exc:
            log.warning("sglang health check failed: %s", exc)
            return False
        return True

    async def model_infos(self) -> dict[str, dict[str, Any]]:
        await self.connect()
        return await self._on_workers("GET", "/model_info")

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
            raise cls(f"{method} {path} failed on {len(failed)}/{len(urls)} workers: {detail}")
        return {u: r for u, r in zip(urls, results)}

    async def _call(self, method: str, url: str, body: Any = None, *, retries: int | None = None,
                    timeout_s: float | None = None) -> Any:
        """One control/metadata request with bounded retries on transient failures; checks `success` bodies."""
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
            if isinstance(data, dict) and data.get("success") is False:
                raise SGLangHTTPError(url, 200, str(data.get("message")))
            return data
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------------------------------- connect
    async def _discover_workers(self) -> list[str]:
        try:
            data = await self._call("GET", f"{self.router_url}/workers")
        except SGLangHTTPError as exc:
            raise ConfigError(f"sglang-router {self.router_url} does not list its workers (GET /workers: {exc}); "
                              "set engine.urls to the worker URLs for control calls") from None
        except TransientError as exc:
            raise EngineUnavailableError(f"cannot reach sglang-router: {exc}; check engine.router_url") from None
        urls = [w.get("url") for w in (data or {}).get("workers", []) if isinstance(w, dict) and w.get("url")]
        if not urls:
            raise ConfigError(f"sglang-router {self.router_url} has no workers (GET /workers); start workers and "
                              "register them (--worker-urls) or set engine.urls")
        return [_clean_url(u, "GET /workers") for u in urls]

    async def _worker_info(self, url: str) -> dict[str, Any]:
        try:
            model, server = await asyncio.gather(self._call("GET", f"{url}/model_info"),
                                                 self._call("GET", f"{url}/server_info"))
        except TransientError as exc:
            raise EngineUnavailableError(
                f"cannot reach SGLang worker {url} ({exc.reason}) after {self.retries + 1} attempts: start it "
                "(python -m sglang.launch_server ... or agentrl engine serve) or fix engine.urls") from None
        return {"model": model if isinstance(model, dict) else {}, "server": server if isinstance(server, dict) else {}}

    def _adopt(self, infos: dict[str, dict[str, Any]]) -> None:
        """Take the context window and weight version the workers report."""
        windows = [i["server"].get("context_length") for i in infos.values()]
        windows = [int(w) for w in windows if isinstance(w, int) and w > 0]
        if windows:
            server_window = min(windows)
            if self._context_window is not None and self._context_window > server_window:
                log.warning("engine.context_window=%d exceeds the servers' context_length %d; using %d",
                            self._context_window, server_window, server_window)
            self._context_window = min(self._context_window or server_window, server_window)
        versions = {u: i["model"].get("weight_version") for u, i in infos.items()}
        parsed = {u: self._parse_version(v, u) for u, v in versions.items()}
        if len(set(parsed.values())) > 1:
            log.warning("sglang workers report different weight versions %s: a worker may have restarted with "
                        "stale weights; the next update_weights brings them in line", versions)
        self._version = max(parsed.values())
        first = next(iter(infos.values()))
        plain = [u for u, i in infos.items() if i["server"].get("enable_deterministic_inference") is not True]
        if self.deterministic and plain:
            log.warning("deterministic: true, but SGLang worker(s) %s do not run deterministic inference: their "
                        "outputs depend on batching and sampling_seed is ignored; restart them with "
                        "--enable-deterministic-inference (docs/determinism.md)", ", ".join(plain))
        self._server = {"served_model": first["model"].get("model_path"),
                        "server_version": first["server"].get("version"), "deterministic_inference": not plain}

    def _parse_version(self, value: Any, url: str) -> int:
        if value is None or value == DEFAULT_VERSION_LABEL:
            return self._initial_version
        try:
            return int(value)
        except (TypeError, ValueError):
            raise EngineError(f"SGLang {url} reports weight_version {value!r}, not an integer: agentrl tags turns with "
                              "integer versions (start the server with --weight-version 0 or the default)") from None


def _clean_url(url: str, field: str) -> str:
    url = str(url).strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"{field}: {url!r} is not an http(s) URL (e.g. http://127.0.0.1:30000)")
    return url


def _turn_seed(seed: int, session_id: str, context_len: int) -> int:
    """A per-turn seed: the context length grows every turn, so (seed, session, length) never repeats in a run."""
    key = f"{seed}|{session_id}|{context_len}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1


def checkpoint_facts(path: str | os.PathLike[str]) -> tuple[list[int], int | None]:
    """End-of-sequence ids (generation_config.json, then config.json: the LocalEngine's rule) and the
    max_position_embeddings of a checkpoint dir, read from its JSON files."""
    import json
    from pathlib import Path

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


def read_tokenizer_path(url: str, *, via_router: bool = False, timeout_s: float = 30.0) -> str:
    """The tokenizer path a server reports (/model_info; the router proxies /get_model_info). Blocking: start-up
    wiring only, never from async code."""
    import json
    import urllib.error
    import urllib.request

    endpoint = f"{_clean_url(url, 'engine URL')}/{'get_model_info' if via_router else 'model_info'}"
    try:
        with urllib.request.urlopen(endpoint, timeout=timeout_s) as resp:
            info = json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise EngineUnavailableError(f"cannot read {endpoint} ({exc}): is the SGLang server up? Or pass --model "
                                     "with a local copy of the served checkpoint") from None
    path = info.get("tokenizer_path") or info.get("model_path") if isinstance(info, dict) else None
    if not path:
        raise ConfigError(f"{endpoint} reports no tokenizer_path: pass --model (engine.model)")
    return str(path)
