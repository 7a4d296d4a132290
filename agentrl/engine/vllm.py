"""VLLMEngine: the GenerationEngine for vLLM servers, token in / token out over vLLM's OpenAI-compatible HTTP API.

Owns: the `/v1/completions` request (exact vLLM 0.33.0 names, see `_body`), reading ids + logprobs + weight-version
spans + finish reason + cached tokens of every turn, mapping agentrl's SamplingParams onto vLLM's (refusing what vLLM
would silently change), clamping `max_tokens` to the context window, retries, sticky per-trajectory routing over
several servers (the SGLang client's `WorkerRouter`), and the control calls (weight reload from disk, pause/resume,
weight-version label, prefix-cache reset, health), which go to every server. Does not own tokenization (the
runner's), the HTTP pool (`sglang_http.Transport`, shared) or the worker choice (`sglang_routing.WorkerRouter`).

Why `/v1/completions` and not TRL's `trl vllm-serve` (see docs/vllm.md): in TRL 1.16 `trl vllm-serve` only execs
`vllm serve` with RL flags; its `/generate/` and `/update_named_param/` endpoints are gone, and TRL's VLLMClient
itself generates through `/v1/completions` and pushes weights over NCCL (CUDA only, trainer joins the server's
process group). agentrl syncs from disk, so it uses vLLM's dev-mode control endpoints instead.

One generate call, by attempt:

    wait while our own weight update runs -> pick a server (sticky) -> POST /v1/completions, fresh request_id
      ok, finish stop|length, one weight version  -> Generation (tagged with that version, cached tokens)
      ok, finish abort, or spans of two versions  -> re-submit (the whole turn is generated again)
      transient (refused, reset, timeout, 408/429/5xx, incl. 503 while the server is paused) -> unpin, back off, retry
      other 4xx                                   -> VLLMHTTPError at once, with vLLM's message
    after `retries` re-submissions: an abort is returned as finish_reason "abort" (the runner never stores it as a
    turn: the trajectory becomes infra_error and is retried); a transient failure raises EngineUnavailableError.

Weight update (`update_weights(path, version)`), on every server, while our new requests wait locally:
    POST /pause?mode=abort|wait -> POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": path}}
    -> POST /reset_prefix_cache -> POST /update_weight_version {"new_version": "<version>"} -> (always, even on
    failure) POST /resume; then GET /weight_info on every server must report the new version.
These endpoints exist only with VLLM_SERVER_DEV_MODE=1 (vLLM 0.33.0: rl/online/api_router.py, serve/dev/...).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from agentrl.engine.sglang import checkpoint_facts  # noqa: F401 - re-exported: the same checkpoint rule applies
from agentrl.engine.sglang import _clean_url, _turn_seed
from agentrl.engine.sglang_http import Limits, SGLangHTTPError, TransientError, Transport
from agentrl.engine.sglang_routing import WorkerRouter
from agentrl.engine.server_weights import ServerWeights
from agentrl.errors import ConfigError, EngineError, EngineUnavailableError
from agentrl.types import Generation, SamplingParams

log = logging.getLogger("agentrl.engine.vllm")

VLLM_VERSION = "0.33.0"  # the server version this client is written against (request names, endpoints)
SESSION_HEADER = "X-Session-ID"  # vLLM's own session header (generate/base/serving.py); body `session_id` wins
DEFAULT_VERSION_LABEL = "default"  # vLLM's weight-version label before any update (v1/engine/core.py)
MIN_TEMPERATURE = 1e-2  # vLLM raises any 0 < T < 0.01 to 0.01 (sampling_params._MAX_TEMP); refused here
MAX_TEMPERATURE = 2.0  # vLLM 0.33 refuses T > 2 (SamplingParams._verify_args)


class VLLMHTTPError(EngineError):
    """The server answered and refused: `status`, the URL, and vLLM's own message. Retrying cannot help."""

    def __init__(self, url: str, status: int, message: str) -> None:
        self.url, self.status, self.message = url, status, message
        super().__init__(f"vLLM {url} answered HTTP {status}: {message}")


class VLLMUnavailableError(EngineUnavailableError):
    """Transient: refused / reset / timeout / 408, 429, 5xx (incl. 503 while paused). May succeed if repeated."""

    def __init__(self, url: str, reason: str, status: int | None = None) -> None:
        self.url, self.reason, self.status = url, reason, status
        super().__init__(f"vLLM {url}: {reason}")


@dataclass
class VLLMStats:
    requests: int = 0  # /v1/completions requests sent (attempts)
    retried_transient: int = 0
    retried_aborted: int = 0  # aborted or straddling generations re-submitted
    returned_aborted: int = 0
    weight_updates: int = 0


def vllm_sampling(sampling: SamplingParams) -> dict[str, Any]:
    """agentrl SamplingParams -> vLLM 0.33 CompletionRequest sampling fields, every one explicit.

    Explicit because vLLM fills a field the request leaves null from the served model's generation_config.json
    (`--generation-config auto`, the default): a checkpoint with `repetition_penalty: 1.1` would otherwise change
    sampling without any sign in the request. Raises ConfigError for what vLLM would alter silently (0 < T < 0.01 is
    raised to 0.01) or refuse (T > 2). top_k: agentrl's 0 = off = vLLM's 0 (vLLM also accepts -1)."""
    t = sampling.temperature
    if 0.0 < t < MIN_TEMPERATURE:
        raise ConfigError(f"sampling.temperature={t}: vLLM silently raises temperatures below {MIN_TEMPERATURE} to "
                          f"{MIN_TEMPERATURE}; use 0 (greedy) or >= {MIN_TEMPERATURE}")
    if t > MAX_TEMPERATURE:
        raise ConfigError(f"sampling.temperature={t}: vLLM {VLLM_VERSION} accepts temperatures in [0, 2]")
    return {"temperature": t, "top_p": sampling.top_p, "top_k": sampling.top_k, "min_p": 0.0,
            "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}


class VLLMEngine(ServerWeights):
    """See the module docstring. `urls`: vLLM servers (`vllm serve`, VLLM_SERVER_DEV_MODE=1 for weight updates);
    agentrl pins each trajectory to one of them."""

    name = "vllm"

    def __init__(
        self,
        *,
        urls: Sequence[str],
        eos_token_ids: Sequence[int] = (),
        context_window: int | None = None,
        model_path: str | None = None,
        served_model: str | None = None,
        max_connections: int = 256,
        request_timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
        control_timeout_s: float = 600.0,
        retries: int = 3,
        retry_backoff_s: float = 0.5,
        pause_mode: Literal["abort", "wait"] = "abort",
        max_sessions: int = 100_000,
        initial_weight_version: int = 0,
    ) -> None:
        self._workers = [_clean_url(u, "engine.urls") for u in urls]
        if not self._workers:
            raise ConfigError("vllm engine: give the server URLs (engine.urls / --engine-url)")
        if pause_mode not in ("abort", "wait"):
            raise ConfigError(f"engine.pause_mode={pause_mode!r}: use 'abort' or 'wait'")
        if retries < 0 or request_timeout_s <= 0 or max_connections < 1:
            raise ConfigError("vllm engine: retries >= 0, request_timeout_s > 0 and max_connections >= 1 required")
        self.eos_token_ids = [int(i) for i in eos_token_ids]
        self.model_path = model_path
        self.served_model = served_model
        self.control_timeout_s = control_timeout_s
        self.retries = retries
        self.retry_backoff_s = retry_backoff_s
        self.pause_mode = pause_mode
        self.stats = VLLMStats()
        self._context_window = context_window
        self._version = initial_weight_version
        self._initial_version = initial_weight_version
        self._transport = Transport(Limits(max_connections=max_connections, connect_timeout_s=connect_timeout_s,
                                           request_timeout_s=request_timeout_s))
        self._router = WorkerRouter(self._workers, max_sessions=max_sessions)
        self._init_server_state()

    # ------------------------------------------------------------------------------------------- properties
    @property
    def in_flight(self) -> dict[str, int]:
        return dict(self._router.in_flight)

    def worker_of(self, session_id: str) -> str | None:
        return self._router.worker_of(session_id)

    # ------------------------------------------------------------------------------------------- lifecycle
    async def connect(self) -> None:
        """Read GET /v1/models (served name, max_model_len), /version and /weight_info of every server.
        Idempotent; `generate` and the control calls run it on first use."""
        if self._connected:
            return
        if self._connect_lock is None:
            self._connect_lock = asyncio.Lock()
        async with self._connect_lock:
            if self._connected:
                return
            infos = await asyncio.gather(*(self._worker_info(u) for u in self._workers))
            self._adopt(dict(zip(self._workers, infos)))
            self._connected = True

    async def close(self) -> None:
        await self._transport.close()

    def end_session(self, session_id: str) -> None:
        """The trajectory is over: forget its sticky server (otherwise dropped least-recently-used)."""
        self._router.forget(session_id)

    def info(self) -> dict[str, Any]:
        return {"engine": self.name, "model": self.model_path, "workers": list(self._workers), **self._server}

    # ------------------------------------------------------------------------------------------- generate
    async def generate(self, input_ids: list[int], sampling: SamplingParams, *, session_id: str) -> Generation:
        ids = input_ids if type(input_ids) is list else list(input_ids)
        if not ids:
            raise ConfigError("generate: input_ids is empty; render at least one prompt token")
        if not self._connected:
            await self.connect()
        max_new = min(sampling.max_new_tokens, self.context_window - len(ids))
        if max_new <= 0:
            return Generation(output_ids=[], logprobs=[], finish_reason="length", weight_version=self._version)
        body = self._body(ids, sampling, max_new, session_id)
        last: Generation | VLLMUnavailableError | None = None
        for attempt in range(self.retries + 1):
            if isinstance(last, VLLMUnavailableError):
                self.stats.retried_transient += 1
                await asyncio.sleep(self._backoff(attempt))
            elif isinstance(last, Generation):
                self.stats.retried_aborted += 1
            await self._wait_gate()
            url = self._router.pick(session_id)
            try:
                gen = await self._generate_once(url, body, session_id)
            except VLLMUnavailableError as exc:
                log.warning("vllm /v1/completions attempt %d/%d failed: %s", attempt + 1, self.retries + 1, exc)
                self._router.failed(url, session_id)
                last = exc
                continue
            if gen.finish_reason != "abort":
                return gen
            last = gen
        if isinstance(last, Generation):
            self.stats.returned_aborted += 1
            return last
        raise EngineUnavailableError(f"vllm /v1/completions failed {self.retries + 1} times (retries={self.retries});"
                                     f" last: {last}")

    def _body(self, ids: list[int], sampling: SamplingParams, max_new: int, session_id: str) -> dict[str, Any]:
        """The /v1/completions body with vLLM 0.33's exact names (an unknown name is IGNORED by vLLM, so a typo
        would change sampling silently: the stand-in refuses unknown names). Ids come back in `token_ids`
        (`return_token_ids`), logprobs of the sampled tokens only (`logprobs: 0`) keyed "token_id:<id>"
        (`return_tokens_as_token_ids`), with the weight-version spans of the output (`return_weight_versions`).
        `request_id` is set per attempt."""
        stops = list(dict.fromkeys([*sampling.stop_token_ids, *self.eos_token_ids]))
        body: dict[str, Any] = {
            "prompt": ids, "max_tokens": max_new, **vllm_sampling(sampling), "stop_token_ids": stops,
            "logprobs": 0, "return_token_ids": True, "return_tokens_as_token_ids": True,
            "return_weight_versions": True, "skip_special_tokens": False, "add_special_tokens": False,
            "session_id": session_id,
        }
        if self.served_model:
            body["model"] = self.served_model
        if sampling.seed is not None and not sampling.greedy:  # vLLM seeds a per-request generator
            body["seed"] = _turn_seed(sampling.seed, session_id, len(ids))
        return body

    async def _generate_once(self, url: str, body: dict[str, Any], session_id: str) -> Generation:
        payload = {**body, "request_id": uuid.uuid4().hex}
        self.stats.requests += 1
        with self._router.track(url):
            data = await self._request("POST", f"{url}/v1/completions", body=payload,
                                       headers={SESSION_HEADER: session_id}, timeout_s=None)
        return self._parse(data, url)

    def _parse(self, data: Any, url: str) -> Generation:
        """Read one non-streamed /v1/completions answer (one choice) into a Generation."""
        choices = data.get("choices") if isinstance(data, dict) else None
        if not choices or not isinstance(choices[0], dict):
            raise EngineError(f"vLLM {url}/v1/completions: unexpected answer {str(data)[:300]!r}")
        choice = choices[0]
        reason = choice.get("finish_reason")
        if reason not in ("stop", "length", "abort"):
            raise EngineError(f"vLLM {url}/v1/completions: unexpected finish_reason {reason!r}")
        ids = [int(i) for i in choice.get("token_ids") or []]
        logprobs = self._logprobs(choice, ids, url) if reason != "abort" else [float("nan")] * len(ids)
        spans = choice.get("weight_versions")
        if reason != "abort" and ids and not spans:
            raise EngineError(f"vLLM {url} returned no weight_versions: agentrl needs a vLLM with "
                              f"return_weight_versions ({VLLM_VERSION} has it) to tag every turn with its weights")
        labels = list(dict.fromkeys(str(s.get("version")) for s in spans or []))
        if len(labels) > 1:
            reason = "abort"  # weights changed mid-generation: never stored as one turn, re-run
        version = self._parse_version(labels[0], url) if labels else self._version
        usage = data.get("usage") or {}
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        return Generation(output_ids=ids, logprobs=logprobs, finish_reason=reason, weight_version=version,
                          cached_tokens=int(cached), worker=url)

    @staticmethod
    def _logprobs(choice: dict[str, Any], ids: list[int], url: str) -> list[float]:
        lp = choice.get("logprobs") or {}
        tokens, values = lp.get("tokens") or [], lp.get("token_logprobs") or []
        if [t.removeprefix("token_id:") for t in tokens] != [str(i) for i in ids]:
            raise EngineError(f"vLLM {url}: logprobs.tokens and token_ids disagree (was return_tokens_as_token_ids "
                              "dropped?)")
        if len(values) != len(ids) or any(v is None for v in values):
            raise EngineError(f"vLLM {url}: a logprob is missing or null (was logprobs dropped?)")
        return [float(v) for v in values]

    # ------------------------------------------------------------------------------------------- control
    async def _load_everywhere(self, path: str, version: int) -> None:
        try:
            await self._on_workers("POST", f"/pause?mode={self.pause_mode}")
            await self._on_workers("POST", "/collective_rpc",
                                   {"method": "reload_weights", "kwargs": {"weights_path": path}})
            reset = await self._on_workers("POST", "/reset_prefix_cache")
            stale = [u for u, r in reset.items() if isinstance(r, dict) and r.get("success") is False]
            if stale:
                raise EngineError(f"/reset_prefix_cache failed on {stale}: KV computed by the old weights would be "
                                  "reused")
            await self._on_workers("POST", "/update_weight_version", {"new_version": str(version)})
        finally:
            await self._on_workers("POST", "/resume")  # never leave a server paused

    async def _verify_version(self, version: int) -> None:
        infos = await self._on_workers("GET", "/weight_info")
        wrong = {u: (i or {}).get("weight_version") for u, i in infos.items()
                 if str((i or {}).get("weight_version")) != str(version)}
        if wrong:
            raise EngineError(f"weight update to version {version} did not land: /weight_info reports {wrong}")

    async def pause(self, mode: Literal["abort", "wait", "keep"] = "abort") -> None:
        await self.connect()
        await self._on_workers("POST", f"/pause?mode={mode}")

    async def resume(self) -> None:
        await self.connect()
        await self._on_workers("POST", "/resume")

    async def health(self) -> bool:
        """True when every server answers GET /health with 200."""
        try:
            await self.connect()
            await self._on_workers("GET", "/health", retries=0, timeout_s=30.0)
        except EngineError as exc:
            log.warning("vllm health check failed: %s", exc)
            return False
        return True

    async def weight_infos(self) -> dict[str, Any]:
        await self.connect()
        return await self._on_workers("GET", "/weight_info")

    async def _on_workers(self, method: str, path: str, body: Any = None, *, retries: int | None = None,
                          timeout_s: float | None = None) -> dict[str, Any]:
        """Call `path` on every server concurrently; wait for all, then raise one error naming each failure."""
        urls = list(self._workers)
        results = await asyncio.gather(
            *(self._call(method, f"{u}{path}", body, retries=retries, timeout_s=timeout_s) for u in urls),
            return_exceptions=True)
        failed = {u: r for u, r in zip(urls, results) if isinstance(r, BaseException)}
        for r in failed.values():
            if not isinstance(r, Exception):
                raise r
        if failed:
            detail = "; ".join(f"{u}: {e}" for u, e in failed.items())
            hint = " (404: start vLLM with VLLM_SERVER_DEV_MODE=1)" if any(
                isinstance(e, VLLMHTTPError) and e.status == 404 for e in failed.values()) else ""
            cls = EngineUnavailableError if all(isinstance(e, VLLMUnavailableError) for e in failed.values()) \
                else EngineError
            raise cls(f"{method} {path} failed on {len(failed)}/{len(urls)} servers: {detail}{hint}")
        return {u: r for u, r in zip(urls, results)}

    async def _call(self, method: str, url: str, body: Any = None, *, retries: int | None = None,
                    timeout_s: float | None = None) -> Any:
        """One control/metadata request with bounded retries on transient failures."""
        budget = self.retries if retries is None else retries
        for attempt in range(budget + 1):
            try:
                return await self._request(method, url, body=body, timeout_s=timeout_s or self.control_timeout_s)
            except VLLMUnavailableError:
                if attempt >= budget:
                    raise
                await asyncio.sleep(self._backoff(attempt + 1))
        raise AssertionError("unreachable")

    async def _request(self, method: str, url: str, *, body: Any = None, headers: dict[str, str] | None = None,
                       timeout_s: float | None) -> Any:
        """The shared transport, its errors relabelled for vLLM."""
        try:
            return await self._transport.request(method, url, body=body, headers=headers, timeout_s=timeout_s)
        except TransientError as exc:
            raise VLLMUnavailableError(url, exc.reason, exc.status) from None
        except SGLangHTTPError as exc:
            raise VLLMHTTPError(url, exc.status, exc.message) from None

    # ------------------------------------------------------------------------------------------- connect
    async def _worker_info(self, url: str) -> dict[str, Any]:
        try:
            models, version = await asyncio.gather(self._call("GET", f"{url}/v1/models"),
                                                   self._call("GET", f"{url}/version"))
            weight = await self._call("GET", f"{url}/weight_info")
        except VLLMUnavailableError as exc:
            raise EngineUnavailableError(
                f"cannot reach vLLM server {url} ({exc.reason}) after {self.retries + 1} attempts: start it "
                "(VLLM_SERVER_DEV_MODE=1 vllm serve ... or agentrl engine serve --api vllm) or fix engine.urls") \
                from None
        except VLLMHTTPError as exc:
            if exc.status == 404 and exc.url.endswith("/weight_info"):
                raise ConfigError(f"vLLM server {url} has no /weight_info: start it with VLLM_SERVER_DEV_MODE=1 "
                                  f"(vLLM >= {VLLM_VERSION}); agentrl needs the dev endpoints for weight sync") \
                    from None
            raise
        cards = (models or {}).get("data") or [] if isinstance(models, dict) else []
        card = cards[0] if cards and isinstance(cards[0], dict) else {}
        return {"card": card, "version": (version or {}).get("version") if isinstance(version, dict) else None,
                "weight": (weight or {}).get("weight_version") if isinstance(weight, dict) else None}

    def _adopt(self, infos: dict[str, dict[str, Any]]) -> None:
        """Take the context window, served model name and weight version the servers report."""
        windows = [i["card"].get("max_model_len") for i in infos.values()]
        windows = [int(w) for w in windows if isinstance(w, int) and w > 0]
        if windows:
            server_window = min(windows)
            if self._context_window is not None and self._context_window > server_window:
                log.warning("engine.context_window=%d exceeds the servers' max_model_len %d; using %d",
                            self._context_window, server_window, server_window)
            self._context_window = min(self._context_window or server_window, server_window)
        names = {i["card"].get("id") for i in infos.values()}
        if self.served_model is None and len(names) == 1:
            self.served_model = next(iter(names))
        parsed = {u: self._parse_version(i["weight"], u) for u, i in infos.items()}
        if len(set(parsed.values())) > 1:
            log.warning("vllm servers report different weight versions %s: a server may have restarted with stale "
                        "weights; the next update_weights brings them in line", parsed)
        self._version = max(parsed.values())
        first = next(iter(infos.values()))
        self._server = {"served_model": self.served_model, "server_version": first["version"]}
        if first["version"] and first["version"] != VLLM_VERSION:
            log.warning("vLLM server version %s; agentrl's vllm client is written against %s", first["version"],
                        VLLM_VERSION)

    def _parse_version(self, value: Any, url: str) -> int:
        if value is None or value == DEFAULT_VERSION_LABEL:
            return self._initial_version
        try:
            return int(value)
        except (TypeError, ValueError):
            raise EngineError(f"vLLM {url} reports weight version {value!r}, not an integer: agentrl labels weights "
                              "with integer versions (POST /update_weight_version to reset it)") from None


def read_served_model(url: str, *, timeout_s: float = 30.0) -> tuple[str, str | None]:
    """(served model id, root path) from GET /v1/models. Blocking: start-up wiring only, never from async code."""
    import json
    import urllib.error
    import urllib.request

    endpoint = f"{_clean_url(url, 'engine URL')}/v1/models"
    try:
        with urllib.request.urlopen(endpoint, timeout=timeout_s) as resp:
            data = json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise EngineUnavailableError(f"cannot read {endpoint} ({exc}): is the vLLM server up? Or pass --model "
                                     "with a local copy of the served checkpoint") from None
    cards = data.get("data") if isinstance(data, dict) else None
    if not cards:
        raise ConfigError(f"{endpoint} lists no model: pass --model (engine.model)")
    return str(cards[0].get("id")), cards[0].get("root")
