"""VLLMEngine: the GenerationEngine for vLLM servers, token in / token out over vLLM's OpenAI-compatible HTTP API.

A thin face of `http_engine.HTTPEngine` (which owns the generate loop, retries, sticky routing over several servers,
the update gate and the fan-out of control calls). Owns: the `/v1/completions` request (exact vLLM 0.33.0 names, see
`_body`), reading ids + logprobs + weight-version spans + finish reason + cached tokens of every turn, mapping
agentrl's SamplingParams onto vLLM's (refusing what vLLM would silently change), and vLLM's control endpoints
(weight reload from disk, pause/resume, weight-version label, prefix-cache reset, health), which go to every server.

Why `/v1/completions` and not TRL's `trl vllm-serve` (see docs/vllm.md): in TRL 1.16 `trl vllm-serve` only execs
`vllm serve` with RL flags; its `/generate/` and `/update_named_param/` endpoints are gone, and TRL's VLLMClient
itself generates through `/v1/completions` and pushes weights over NCCL (CUDA only, trainer joins the server's
process group). agentrl syncs from disk, so it uses vLLM's dev-mode control endpoints instead.

A generation that is aborted or spans two weight versions is re-submitted; a 503 is transient (retried); other 4xx
are a VLLMHTTPError at once, with vLLM's message. A real vLLM holds requests sent while it is paused and answers them
after /resume.

Servers differ by version (`vllm_server.ServerFacts`, read once per server at connect): 0.33 returns weight-version
spans; 0.32 does not, and then a turn's version is derived from agentrl's own update fences (a turn that straddled
an update is re-run). A CPU server whose chunked prefill would crash on a seeded request gets no seeds, and
`--deterministic` against it is refused up front.

Weight update (`update_weights(path, version)`), on every server, while our new requests wait locally:
    POST /pause?mode=abort|wait -> POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": path}}
    -> POST /reset_prefix_cache -> POST /update_weight_version {"new_version": "<version>"} -> (always, even on
    failure) POST /resume; then GET /weight_info on every server must report the new version.
These endpoints exist only with VLLM_SERVER_DEV_MODE=1 (vLLM 0.33.0: rl/online/api_router.py, serve/dev/...).
The checkpoint is checked first (`checkpoint_check`: complete files, config, shapes, dtypes). A reload the server
refuses is never retried: vLLM leaves meta tensors behind and would die on its next generation, so agentrl reloads
the last checkpoint that loaded (the served one at first) and raises an EngineError with the server's answer; if
that restore fails too, the engine refuses every later generate (the servers have no usable weights).

LoRA adapter update (`load_adapter(path, version)`, `weight_sync: adapter`; the server runs `--enable-lora
--max-lora-rank R` with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True), on every server, behind the same gate:
    POST /pause?mode=... -> POST /v1/load_lora_adapter {"lora_name", "lora_path"} -> POST /update_weight_version
    -> (always) POST /resume; then GET /weight_info must report the new version, later requests name the adapter in
    `model`, and the previous adapter is unloaded (POST /v1/unload_lora_adapter {"lora_name"}). vLLM's prefix cache
    keys by adapter, so no reset is needed.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from agentrl.engine.checkpoint_check import check_adapter, check_checkpoint
from agentrl.engine.http import Errors, ServerHTTPError, TransientError
from agentrl.engine.http_engine import (
    EngineStats,
    HTTPEngine,
    checkpoint_facts,
    read_server_json,
    turn_seed,
)
from agentrl.engine.vllm_server import SEED_FIX, ServerFacts, facts_from
from agentrl.errors import ConfigError, EngineError
from agentrl.types import Generation, SamplingParams

__all__ = ["VLLMEngine", "VLLMHTTPError", "VLLMUnavailableError", "vllm_sampling", "read_served_model",
           "checkpoint_facts"]

VLLM_VERSION = "0.33.0"  # the server version this client is written against (request names, endpoints)
SESSION_HEADER = "X-Session-ID"  # vLLM's own session header (generate/base/serving.py); body `session_id` wins
MIN_TEMPERATURE = 1e-2  # vLLM raises any 0 < T < 0.01 to 0.01 (sampling_params._MAX_TEMP); refused here
MAX_TEMPERATURE = 2.0  # vLLM 0.33 refuses T > 2 (SamplingParams._verify_args)


class VLLMHTTPError(ServerHTTPError):
    """The server answered and refused: `status`, the URL, and vLLM's own message. Retrying cannot help."""

    server = "vLLM"


class VLLMUnavailableError(TransientError):
    """Transient: refused / reset / timeout / 408, 429, 5xx (incl. 503 while paused). May succeed if repeated."""

    server = "vLLM"


VLLMStats = EngineStats


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


class VLLMEngine(HTTPEngine):
    """See the module docstring. `urls`: vLLM servers (`vllm serve`, VLLM_SERVER_DEV_MODE=1 for weight updates);
    agentrl pins each trajectory to one of them."""

    name = "vllm"
    server = "vLLM"
    worker_noun = "servers"
    version_fix = "POST /update_weight_version to reset it"
    errors = Errors(VLLMHTTPError, VLLMUnavailableError)
    generate_path = "/v1/completions"
    request_id_field = "request_id"
    session_header = SESSION_HEADER
    health_path = "/health"

    def __init__(self, *, urls: Any, served_model: str | None = None,
                 pause_mode: Literal["abort", "wait"] = "abort", deterministic: bool = False, **common: Any) -> None:
        self.served_model = served_model
        self.pause_mode = pause_mode
        self.deterministic = deterministic
        self.facts: dict[str, ServerFacts] = {}  # per server, read at connect
        self._send_seed = True  # False when a server would crash on a seeded chunked prefill
        self._last_good: str | None = None  # the last checkpoint every server loaded (None: the served one)
        super().__init__(urls=urls, **common)

    def _check_options(self) -> None:
        if self.router_url is not None:
            raise ConfigError("vllm engine: no router_url; give the server URLs (engine.urls), agentrl routes")
        if self.pause_mode not in ("abort", "wait"):
            raise ConfigError(f"engine.pause_mode={self.pause_mode!r}: use 'abort' or 'wait'")

    # ------------------------------------------------------------------------------------------- request/answer
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
        if sampling.seed is not None and not sampling.greedy and self._send_seed:  # a per-request generator
            body["seed"] = turn_seed(sampling.seed, session_id, len(ids))
        return body

    def _parse(self, data: Any, url: str, fence: int = 0) -> Generation:
        """Read one non-streamed /v1/completions answer (one choice) into a Generation. `fence`: the update fence
        when the request was sent (for a server without spans)."""
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
        facts = self.facts.get(url)
        if spans is None and (facts is None or facts.spans == "fenced"):
            derived = self._fenced_version(fence)  # vLLM 0.32: no spans; agentrl's own fences decide
            if derived is None:
                reason = "abort"  # an agentrl update ran while this request was out: re-run it
            version = self._version if derived is None else derived
            return self._generation(data, ids, logprobs, reason, version, url)
        if reason != "abort" and ids and not spans:
            raise EngineError(f"vLLM {url} ({facts.version if facts else '?'}) returned no weight_versions: agentrl "
                              "needs return_weight_versions (vLLM >= 0.33) to tag every turn with its weights")
        labels = list(dict.fromkeys(str(s.get("version")) for s in spans or []))
        if len(labels) > 1:
            reason = "abort"  # weights changed mid-generation: never stored as one turn, re-run
        version = self._parse_version(labels[0], url) if labels else self._version
        return self._generation(data, ids, logprobs, reason, version, url)

    @staticmethod
    def _generation(data: dict[str, Any], ids: list[int], logprobs: list[float], reason: Any, version: int,
                    url: str) -> Generation:
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
        reference = self._last_good or self.model_path
        await asyncio.to_thread(check_checkpoint, path, reference)  # before the server can be broken by it
        try:
            await self._on_workers("POST", f"/pause?mode={self.pause_mode}")
            await self._reload(path, failed=lambda exc: self._restore(path, exc))
            await self._reset_prefix_cache()
            await self._on_workers("POST", "/update_weight_version", {"new_version": str(version)})
        finally:
            await self._on_workers("POST", "/resume")  # never leave a server paused
        self._last_good = path

    async def _reload(self, path: str, *, failed: Any = None) -> None:
        """POST /collective_rpc reload_weights on every server, never retried: a refused reload leaves a real vLLM
        with meta tensors, so `failed(exc)` builds the error to raise (after trying to repair the servers)."""
        try:
            await self._on_workers("POST", "/collective_rpc",
                                   {"method": "reload_weights", "kwargs": {"weights_path": path}}, retries=0)
        except EngineError as exc:
            raise (await failed(exc) if failed else exc) from None

    async def _reset_prefix_cache(self) -> None:
        reset = await self._on_workers("POST", "/reset_prefix_cache")
        stale = [u for u, r in reset.items() if isinstance(r, dict) and r.get("success") is False]
        if stale:
            raise EngineError(f"/reset_prefix_cache failed on {stale}: KV computed by the old weights would be reused")

    async def _restore(self, path: str, exc: EngineError) -> EngineError:
        """A reload failed: load the last good checkpoint again. The error to raise (the run must stop either way:
        the new weights are not on the servers)."""
        good = self._last_good or self._served_root() or self.model_path
        said = f"vLLM refused to load {path}: {exc}"
        try:
            if good is None:
                raise EngineError("no earlier checkpoint is known")
            await self._reload(good)
            await self._reset_prefix_cache()
        except EngineError as again:
            self._broken = (f"{said}. Restoring {good} failed too ({again}): the servers have no usable weights "
                            "(vLLM leaves meta tensors after a failed reload); restart them")
            return EngineError(self._broken)
        return EngineError(f"{said}. The servers were restored to {good} (weight version {self._version} kept); "
                           "fix the checkpoint and resume the run")

    def _served_root(self) -> str | None:
        roots = {f.served_root for f in self.facts.values()}
        return next(iter(roots)) if len(roots) == 1 else None

    async def _load_adapter_everywhere(self, name: str, path: str, version: int) -> None:
        ranks = [f.max_lora_rank for f in self.facts.values() if f.max_lora_rank is not None]
        await asyncio.to_thread(check_adapter, path, max_rank=min(ranks) if ranks else None)
        try:
            await self._on_workers("POST", f"/pause?mode={self.pause_mode}")
            try:  # never retried: a 500 here is the server's verdict on the adapter, not a transient fault
                await self._on_workers("POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path},
                                       retries=0)
            except EngineError as exc:
                raise EngineError(f"vLLM refused to load the LoRA adapter {path}: {exc}") from None
            await self._on_workers("POST", "/update_weight_version", {"new_version": str(version)})
        finally:
            await self._on_workers("POST", "/resume")  # never leave a server paused

    async def _unload_adapter_everywhere(self, name: str) -> None:
        await self._on_workers("POST", "/v1/unload_lora_adapter", {"lora_name": name})

    def _adapter_fields(self, name: str) -> dict[str, Any]:
        return {"model": name}  # vLLM serves a loaded LoRA adapter under its name as a model

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

    async def weight_infos(self) -> dict[str, Any]:
        await self.connect()
        return await self._on_workers("GET", "/weight_info")

    def _failure_hint(self, failed: dict[str, BaseException]) -> str:
        missing = [e for e in failed.values() if isinstance(e, VLLMHTTPError) and e.status == 404]
        if any(e.url.endswith("/v1/load_lora_adapter") for e in missing):
            return " (404: start vLLM with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)"
        return " (404: start vLLM with VLLM_SERVER_DEV_MODE=1)" if missing else ""

    # ------------------------------------------------------------------------------------------- connect
    async def _worker_info(self, url: str) -> dict[str, Any]:
        try:
            models, version = await asyncio.gather(self._call("GET", f"{url}/v1/models"),
                                                   self._call("GET", f"{url}/version"))
            weight = await self._call("GET", f"{url}/weight_info")
            info = await self._optional(f"{url}/server_info?config_format=json")
        except VLLMUnavailableError as exc:
            raise self._unreachable(url, exc, "VLLM_SERVER_DEV_MODE=1 vllm serve ... or agentrl engine serve --api "
                                              "vllm") from None
        except VLLMHTTPError as exc:
            if exc.status == 404 and exc.url.endswith("/weight_info"):
                raise ConfigError(f"vLLM server {url} has no /weight_info: start it with VLLM_SERVER_DEV_MODE=1 "
                                  f"(vLLM >= {VLLM_VERSION}); agentrl needs the dev endpoints for weight sync") \
                    from None
            raise
        cards = (models or {}).get("data") or [] if isinstance(models, dict) else []
        card = cards[0] if cards and isinstance(cards[0], dict) else {}
        self.facts[url] = facts_from(url, version=version, models=models, weight=weight, info=info)
        return {"card": card, "version": (version or {}).get("version") if isinstance(version, dict) else None,
                "weight": (weight or {}).get("weight_version") if isinstance(weight, dict) else None}

    async def _optional(self, url: str) -> Any:
        """A GET whose absence is a fact, not an error (None)."""
        try:
            return await self._call("GET", url, retries=1)
        except EngineError:
            return None

    def _check_seeds(self) -> None:
        """vLLM-CPU dies on a seeded request whose prompt chunked prefill splits (its bug): refuse --deterministic
        against such a server, and otherwise send no seeds."""
        risky = [u for u, f in self.facts.items() if f.seeded_prefill_crashes]
        if not risky:
            return
        if self.deterministic:
            raise ConfigError(f"--deterministic against vLLM {risky}: on CPU, a seeded request whose prompt chunked "
                              f"prefill splits kills vLLM's engine (a vLLM bug). Restart the server with {SEED_FIX}")
        self._send_seed = False
        self.log.warning("vLLM %s would crash on seeded requests split by chunked prefill (a vLLM-CPU bug): sending "
                         "no seeds, so sampling is not reproducible; restart it with %s", risky, SEED_FIX)

    def _adopt(self, infos: dict[str, dict[str, Any]]) -> None:
        """Take the context window, served model name and weight version the servers report."""
        self._adopt_window([i["card"].get("max_model_len") for i in infos.values()], "max_model_len")
        names = {i["card"].get("id") for i in infos.values()}
        if self.served_model is None and len(names) == 1:
            self.served_model = next(iter(names))
        self._adopt_version({u: i["weight"] for u, i in infos.items()})
        first = next(iter(infos.values()))
        self._server = {"served_model": self.served_model, "server_version": first["version"],
                        "weight_version_spans": sorted({f.spans for f in self.facts.values()})}
        self._check_seeds()
        fenced = [u for u, f in self.facts.items() if f.spans == "fenced"]
        if fenced:
            self.log.info("vLLM %s returns no weight-version spans (< 0.33): turn versions come from agentrl's own "
                          "update fences", fenced)


def read_served_model(url: str, *, timeout_s: float = 30.0) -> tuple[str, str | None]:
    """(served model id, root path) from GET /v1/models. Blocking: start-up wiring only, never from async code."""
    endpoint, data = read_server_json(url, "/v1/models", server="vLLM", timeout_s=timeout_s)
    cards = data.get("data") if isinstance(data, dict) else None
    if not cards:
        raise ConfigError(f"{endpoint} lists no model: pass --model (engine.model)")
    return str(cards[0].get("id")), cards[0].get("root")
