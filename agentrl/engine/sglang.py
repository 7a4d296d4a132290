"""SGLangEngine: the GenerationEngine for SGLang servers, token in / token out over SGLang's native HTTP API.

A thin face of `http_engine.HTTPEngine` (which owns the generate loop, retries, routing, the update gate and the
fan-out of control calls). Owns: the `/generate` request (exact SGLang 0.5.23 names, see `_body`), reading ids +
logprobs from `meta_info.output_token_logprobs`, the finish reason, weight version and cached tokens of every turn;
router mode (one sglang-router URL with `X-SMG-Routing-Key`, workers learnt from its GET /workers); and SGLang's
control endpoints (weight updates, pause/continue, flush, health), which always go to every worker directly
because the router does not proxy them. A 200 control answer with `success: false` is an SGLangHTTPError.
An abort (weight update, pause, abort_request) is re-submitted; 4xx is an SGLangHTTPError at once.

A generation whose `meta_info.weight_versions` spans two versions (possible with `pause_generation(mode="retract")`
on the server) is treated like an abort: every stored turn is produced by exactly one weight version.

Weight update (`update_weights(path, version)`), on every worker, while our new /generate calls wait locally:
    weight_update="pause":     /pause_generation {"mode": "abort"} -> /update_weights_from_disk -> (always, even
                               on failure) /continue_generation
    weight_update="abort_all": /update_weights_from_disk {"abort_all_requests": true}
then `/model_info` on every worker must report the new `weight_version`.

LoRA adapter update (`load_adapter(path, version)`, `weight_sync: adapter`; the server runs `--enable-lora` with
`--max-lora-rank` / `--lora-target-modules` covering the adapter), on every worker, behind the same gate:
    weight_update="pause":     /pause_generation {"mode": "abort"} -> /load_lora_adapter {"lora_name", "lora_path"}
                               -> /update_weight_version {"new_version", "abort_all_requests": false} -> (always)
                               /continue_generation
    weight_update="abort_all": /load_lora_adapter -> /update_weight_version {"abort_all_requests": true}
then `/model_info` must report the new `weight_version`, later /generate bodies carry `lora_path: <adapter name>`,
and the previous adapter is unloaded (/unload_lora_adapter {"lora_name"}). The radix cache keys by adapter, so no
flush is needed.

Seeds. A sampled request with `SamplingParams.seed` carries `sampling_params.sampling_seed`. With
`deterministic=True` it is that seed exactly (the runner derives one per turn, runner/seeds.py); otherwise a per-turn
seed mixed from (seed, session, context length). SGLang honours `sampling_seed` only when the server runs
`--enable-deterministic-inference` (batch-invariant kernels); `connect()` reads `enable_deterministic_inference`
from every worker's /server_info and warns when `deterministic=True` is asked of a server that does not run it.
Client-side timeouts and cancellation close the connection; SGLang aborts a request whose client disconnected.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from agentrl.engine.http import Errors, ServerHTTPError, TransientError
from agentrl.engine.http_engine import (
    DEFAULT_VERSION_LABEL,
    EngineStats,
    HTTPEngine,
    checkpoint_facts,
    clean_url,
    read_server_json,
    turn_seed,
)
from agentrl.errors import ConfigError, EngineError, EngineUnavailableError
from agentrl.types import FinishReason, Generation, SamplingParams

__all__ = ["SGLangEngine", "SGLangHTTPError", "SGLangTransientError", "checkpoint_facts", "read_tokenizer_path",
           "ROUTING_HEADER", "DEFAULT_VERSION_LABEL"]

ROUTING_HEADER = "X-SMG-Routing-Key"
SGLangStats = EngineStats


class SGLangHTTPError(ServerHTTPError):
    """SGLang answered and refused: `status`, the URL, and SGLang's own message."""

    server = "SGLang"


class SGLangTransientError(TransientError):
    """An SGLang request that may succeed if repeated (possibly on another worker)."""

    server = "SGLang"


class SGLangEngine(HTTPEngine):
    """See the module docstring. Either `urls` (workers; agentrl routes) or `router_url` (sglang-router routes;
    `urls`, if also given, are the workers for control calls, else they are read from the router's GET /workers)."""

    name = "sglang"
    server = "SGLang"
    no_urls = "give worker URLs (engine.urls / --engine-url) or engine.router_url"
    version_fix = "start the server with --weight-version 0 or the default"
    errors = Errors(SGLangHTTPError, SGLangTransientError)
    generate_path = "/generate"
    request_id_field = "rid"
    session_header = ROUTING_HEADER
    health_path = "/health_generate"  # a one-token generation

    def __init__(self, *, weight_update: Literal["pause", "abort_all"] = "pause", deterministic: bool = False,
                 **common: Any) -> None:
        self.weight_update = weight_update
        self.deterministic = deterministic
        super().__init__(**common)

    def _check_options(self) -> None:
        if self.weight_update not in ("pause", "abort_all"):
            raise ConfigError(f"engine.weight_update={self.weight_update!r}: use 'pause' or 'abort_all'")

    def info(self) -> dict[str, Any]:
        return {"engine": self.name, "model": self.model_path, "workers": list(self._workers),
                "router": self.router_url, **self._server}

    # ------------------------------------------------------------------------------------------- request/answer
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
            seed = sampling.seed if self.deterministic else turn_seed(sampling.seed, session_id, len(ids))
            params["sampling_seed"] = seed
        return {"input_ids": ids, "return_logprob": True, "logprob_start_len": -1, "sampling_params": params}

    def _parse(self, data: Any, url: str, fence: int = 0) -> Generation:
        """Read one non-streamed /generate answer into a Generation."""
        if not isinstance(data, dict) or not isinstance(data.get("meta_info"), dict):
            raise EngineError(f"SGLang {url}/generate: unexpected answer {str(data)[:300]!r}")
        meta = data["meta_info"]
        raw = (meta.get("finish_reason") or {}).get("type")
        if raw not in ("stop", "length", "abort"):
            raise EngineError(f"SGLang {url}/generate: unknown finish_reason {meta.get('finish_reason')!r}")
        reason: FinishReason = raw
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

    async def _load_adapter_everywhere(self, name: str, path: str, version: int) -> None:
        load = {"lora_name": name, "lora_path": path}
        label = {"new_version": str(version), "abort_all_requests": self.weight_update == "abort_all"}
        if self.weight_update == "abort_all":
            await self._on_workers("POST", "/load_lora_adapter", load)
            await self._on_workers("POST", "/update_weight_version", label)
            return
        try:
            await self._on_workers("POST", "/pause_generation", {"mode": "abort"})
            await self._on_workers("POST", "/load_lora_adapter", load)
            await self._on_workers("POST", "/update_weight_version", label)
        finally:
            await self._on_workers("POST", "/continue_generation", {})  # never leave a worker paused

    async def _unload_adapter_everywhere(self, name: str) -> None:
        await self._on_workers("POST", "/unload_lora_adapter", {"lora_name": name})

    def _adapter_fields(self, name: str) -> dict[str, Any]:
        return {"lora_path": name}  # GenerateReqInput.lora_path: the name of a loaded adapter

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

    async def model_infos(self) -> dict[str, dict[str, Any]]:
        await self.connect()
        return await self._on_workers("GET", "/model_info")

    def _control_answer(self, url: str, data: Any) -> Any:
        if isinstance(data, dict) and data.get("success") is False:
            raise SGLangHTTPError(url, 200, str(data.get("message")))
        return data

    # ------------------------------------------------------------------------------------------- connect
    async def _discover_workers(self) -> list[str]:
        try:
            data = await self._call("GET", f"{self.router_url}/workers")
        except ServerHTTPError as exc:
            raise ConfigError(f"sglang-router {self.router_url} does not list its workers (GET /workers: {exc}); "
                              "set engine.urls to the worker URLs for control calls") from None
        except TransientError as exc:
            raise EngineUnavailableError(f"cannot reach sglang-router: {exc}; check engine.router_url") from None
        urls = [w.get("url") for w in (data or {}).get("workers", []) if isinstance(w, dict) and w.get("url")]
        if not urls:
            raise ConfigError(f"sglang-router {self.router_url} has no workers (GET /workers); start workers and "
                              "register them (--worker-urls) or set engine.urls")
        return [clean_url(str(u), "GET /workers") for u in urls]

    async def _worker_info(self, url: str) -> dict[str, Any]:
        try:
            model, server = await asyncio.gather(self._call("GET", f"{url}/model_info"),
                                                 self._call("GET", f"{url}/server_info"))
        except TransientError as exc:
            raise self._unreachable(url, exc, "python -m sglang.launch_server ... or agentrl engine serve") from None
        return {"model": model if isinstance(model, dict) else {}, "server": server if isinstance(server, dict) else {}}

    def _adopt(self, infos: dict[str, dict[str, Any]]) -> None:
        """Take the context window and weight version the workers report."""
        self._adopt_window([i["server"].get("context_length") for i in infos.values()], "context_length")
        self._adopt_version({u: i["model"].get("weight_version") for u, i in infos.items()})
        first = next(iter(infos.values()))
        plain = [u for u, i in infos.items() if i["server"].get("enable_deterministic_inference") is not True]
        if self.deterministic and plain:
            self.log.warning("deterministic: true, but SGLang worker(s) %s do not run deterministic inference: their "
                        "outputs depend on batching and sampling_seed is ignored; restart them with "
                        "--enable-deterministic-inference (docs/determinism.md)", ", ".join(plain))
        self._server = {"served_model": first["model"].get("model_path"),
                        "server_version": first["server"].get("version"), "deterministic_inference": not plain}


def read_tokenizer_path(url: str, *, via_router: bool = False, timeout_s: float = 30.0) -> str:
    """The tokenizer path a server reports (/model_info; the router proxies /get_model_info). Blocking: start-up
    wiring only, never from async code."""
    endpoint, info = read_server_json(url, "/get_model_info" if via_router else "/model_info", server="SGLang",
                                      timeout_s=timeout_s)
    path = info.get("tokenizer_path") or info.get("model_path") if isinstance(info, dict) else None
    if not path:
        raise ConfigError(f"{endpoint} reports no tokenizer_path: pass --model (engine.model)")
    return str(path)
