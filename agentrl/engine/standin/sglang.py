"""Stand-in SGLang server: the subset of SGLang 0.5.23's native HTTP API that agentrl uses, over the LocalEngine.

The SGLang face of the one stand-in server (`core.StandInCore`, which owns the in-flight table, aborts, the
resume gate, weight labels, the request log, the TCP server and `serve`). Owns: the aiohttp routes that answer like
an SGLang worker (same paths, bodies, status codes and error texts), so the `sglang` engine, sglang-router and the
weight-sync path are exercised on a CPU. Every `/generate` body is judged by SGLang's own generated contract
(`sglang_contract.py`): a wrong field is the same HTTP 400 with the same text as on the real server; the LoRA and
weight-version bodies by SGLang's own io_struct request models (`lora_contract.py`). Does not own
generation (LocalEngine) or the contract itself.

    POST /generate                 input_ids only (token in), one sequence, non-streamed; return_logprob
    POST /update_weights_from_disk model_path, weight_version, abort_all_requests (LocalEngine drains the rest)
    POST /pause_generation         mode "abort" aborts in-flight requests; every mode holds new ones until continue
    POST /continue_generation
    POST /load_lora_adapter        lora_name, lora_path: the adapter applied to the engine (a new engine version)
    POST /unload_lora_adapter      lora_name
    POST /update_weight_version    new_version, abort_all_requests
    POST /abort_request            rid (prefix match) or abort_all
    GET|POST /flush_cache          400 while requests run, like SGLang
    GET  /health, /health_generate one greedy token, 503 on failure
    GET  /model_info, /get_model_info, /server_info, /get_server_info
    GET  /agentrl/requests         this stand-in's request log (rid, worker, routing key, cached tokens, ...)

Differences from SGLang, on purpose: the prefix cache is per routing key (X-SMG-Routing-Key, else per rid) instead
of a global radix tree; an aborted request returns no partial tokens; pause modes "retract"/"in_place" let running
requests finish; the engine applies one LoRA adapter at a time, so a request must name the adapter loaded last (or
none before any), else a 400 saying so. Sampling features the LocalEngine lacks (penalties, min_p, stop strings,
grammars...) are refused with a 400 naming them rather than ignored. `echo=True` (benchmarks only) answers every
admitted request with one token (the last input id) without a model, so a client's own overhead can be measured.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from agentrl.engine.standin.core import StandInCore, StandInServer, json_object, serve_face
from agentrl.engine.standin.lora_contract import ControlValidator, sglang_control_validator
from agentrl.engine.standin.sglang_contract import SGLANG_VERSION, GenerateValidator, generate_validator
from agentrl.errors import ConfigError
from agentrl.types import Generation, SamplingParams

__all__ = ["StandIn", "StandInServer", "serve"]

log = logging.getLogger("agentrl.engine.standin")

ROUTING_HEADER = "X-SMG-Routing-Key"
_TOP_K_OFF = 1 << 30
_DEFAULTS = {"min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0,
             "min_new_tokens": 0, "n": 1, "ignore_eos": False, "logit_bias": {}, "choice": []}
_UNSUPPORTED = ("stop", "stop_regex", "json_schema", "regex", "ebnf", "structural_tag", "custom_params",
                "beam_width", "watermark")
_FLUSHED = ("Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting "
            "requests, the operation will not be performed.)\n")


@dataclass
class _Request:
    """An admitted /generate body."""

    rid: str
    ids: list[int]
    sampling: SamplingParams
    return_logprob: bool
    routing_key: str | None
    stop_ids: list[int] = field(default_factory=list)
    lora_path: str | None = None  # the adapter the request names


class StandIn(StandInCore):
    """The SGLang face. `engine` is a LocalEngine (None only with `echo=True`)."""

    server = "SGLang"
    checked_path = "/generate"

    def __init__(self, engine: Any, *, model_path: str | Path, validator: GenerateValidator, worker_id: str,
                 weight_version: str = "default", tokenizer: Any = None, echo: bool = False,
                 context_window: int | None = None, max_log: int = 100_000,
                 control_validator: ControlValidator | None = None) -> None:
        if engine is None and not echo:
            raise ConfigError("stand-in: an engine is required unless echo=True")
        super().__init__(engine, model_path=model_path, validator=validator, worker_id=worker_id, tokenizer=tokenizer,
                         context_window=context_window, label=weight_version, max_log=max_log)
        self.echo = echo
        self._started = time.time()
        self.control_validator = control_validator or sglang_control_validator()

    def routes(self, r: web.UrlDispatcher) -> None:
        r.add_post("/generate", self.generate)
        r.add_put("/generate", self.generate)
        r.add_post("/update_weights_from_disk", self.update_weights_from_disk)
        r.add_post("/pause_generation", self.pause_generation)
        r.add_post("/continue_generation", self.continue_generation)
        r.add_post("/abort_request", self.abort_request)
        r.add_post("/load_lora_adapter", self.load_lora_adapter)
        r.add_post("/unload_lora_adapter", self.unload_lora_adapter)
        r.add_post("/update_weight_version", self.update_weight_version)
        r.add_route("*", "/flush_cache", self.flush_cache)
        for path in ("/health", "/health_generate"):
            r.add_get(path, self.health)
        for path in ("/model_info", "/get_model_info"):
            r.add_get(path, self.model_info)
        for path in ("/server_info", "/get_server_info"):
            r.add_get(path, self.server_info)

    # ------------------------------------------------------------------------------------------- /generate
    async def generate(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError as exc:
            return _error(f"the request body is not JSON: {exc}")
        contract_error = self.validator.check(body)
        if contract_error is not None:
            return web.json_response({"error": contract_error}, status=400)  # exactly SGLang's gate
        try:
            req = self._admit(body, request.headers.get(ROUTING_HEADER))
        except ValueError as exc:
            return _error(str(exc))
        await self._resumed.wait()
        t0 = time.time()
        if self.echo:
            gen = Generation(output_ids=[req.ids[-1]], logprobs=[-0.5], finish_reason="length",
                             weight_version=0)
            return web.json_response(self._answer(req, gen, None, t0))
        try:
            gen, aborted = await self._generate(req.rid, req.ids, req.sampling, req.routing_key or req.rid)
        except Exception as exc:  # noqa: BLE001 - the engine's error, answered like SGLang
            return _error(str(exc), status=400 if isinstance(exc, ConfigError) else 500)
        return web.json_response(self._answer(req, gen, (aborted or "Aborted") if gen.finish_reason == "abort"
                                              else None, t0))

    def _admit(self, body: dict[str, Any], routing_key: str | None) -> _Request:
        """What SGLang checks after the contract (GenerateReqInput, SamplingParams.verify, context length)."""
        ids = body.get("input_ids")
        if body.get("text") is not None or ids is None:
            raise ValueError("the stand-in takes input_ids only (token in); text/input_embeds are not supported")
        if not ids or isinstance(ids[0], list):
            raise ValueError("the stand-in serves one non-empty input_ids sequence per request (no batches)")
        if body.get("stream"):
            raise ValueError("the stand-in does not stream; send stream=false")
        params = body.get("sampling_params") or {}
        if isinstance(params, list):
            raise ValueError("the stand-in takes one sampling_params object, not a list")  # noqa: TRY004 - a 400
        sampling = self._sampling(params, len(ids))
        rid = body.get("rid") or uuid.uuid4().hex
        if not isinstance(rid, str):
            raise ValueError("the stand-in takes one rid string")  # noqa: TRY004 - answered as a 400, like SGLang
        if rid in self._inflight:
            raise ValueError(f"Duplicate request ID: {rid}")
        lora = body.get("lora_path")
        if lora is not None and not isinstance(lora, str):
            raise ValueError("the stand-in takes one lora_path string")  # noqa: TRY004 - answered as a 400
        if lora is not None and lora not in self.adapters:
            raise ValueError(f"Got LoRA adapter that has never been loaded: {lora}\n"  # SGLang's own text
                             f"All loaded adapters: {self.adapters.keys()}.")
        refusal = None if self.echo else self._adapter_refusal(lora)
        if refusal:
            raise ValueError(refusal)
        return _Request(rid=rid, ids=list(ids), sampling=sampling, routing_key=routing_key,
                        return_logprob=bool(body.get("return_logprob")), lora_path=lora)

    def _sampling(self, p: dict[str, Any], n_input: int) -> SamplingParams:
        refused = [k for k in _UNSUPPORTED if p.get(k) not in (None, [], "")]
        refused += [k for k, default in _DEFAULTS.items() if k in p and p[k] is not None and p[k] != default]
        if refused:
            raise ValueError(f"the stand-in does not implement sampling params {refused}")
        top_k = p.get("top_k")
        if top_k is not None and top_k != -1 and top_k < 1:
            raise ValueError(f"top_k must be -1 (disable), or at least 1, got {top_k}.")
        temperature = 1.0 if p.get("temperature") is None else float(p["temperature"])
        if temperature < 0:
            raise ValueError(f"temperature must be non-negative, got {temperature}.")
        max_new = 128 if p.get("max_new_tokens") is None else int(p["max_new_tokens"])
        self._check_context(n_input, max_new)
        return SamplingParams(
            temperature=0.0 if temperature < 1e-6 else temperature,
            top_p=1.0 if p.get("top_p") is None else float(p["top_p"]),
            top_k=0 if top_k in (None, -1) or top_k >= _TOP_K_OFF else int(top_k),
            max_new_tokens=max(1, max_new), stop_token_ids=list(p.get("stop_token_ids") or []),
            seed=p.get("sampling_seed"),
        )

    def _check_context(self, n_input: int, max_new: int) -> None:
        """SGLang's own messages (tokenizer_manager._validate_one_request, no auto-truncate)."""
        ctx = self.context_window
        if n_input >= ctx:
            raise ValueError(f"The input ({n_input} tokens) is longer than the model's context length ({ctx} tokens).")
        if max_new + n_input > ctx:
            raise ValueError(
                f"Requested token count exceeds the model's maximum context length of {ctx} tokens. You requested "
                f"a total of {max_new + n_input} tokens: {n_input} tokens from the input messages and {max_new} "
                "tokens for the completion. Please reduce the number of tokens in the input messages or the "
                "completion to fit within the limit.")

    def _answer(self, req: _Request, gen: Generation, abort: str | None, t0: float) -> dict[str, Any]:
        if gen.finish_reason == "stop":
            finish: dict[str, Any] = {"type": "stop", "matched": gen.output_ids[-1]}
        elif gen.finish_reason == "length":
            finish = {"type": "length", "length": len(gen.output_ids)}
        else:
            finish = {"type": "abort", "message": abort, "status_code": None, "err_type": None}
        label = self._label_of(gen.weight_version)
        meta: dict[str, Any] = {
            "id": req.rid, "finish_reason": finish, "prompt_tokens": len(req.ids),
            "completion_tokens": len(gen.output_ids), "cached_tokens": gen.cached_tokens, "reasoning_tokens": 0,
            "weight_version": label, "e2e_latency": time.time() - t0,
        }
        if req.return_logprob:
            meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(gen.logprobs, gen.output_ids)]
        self._log(req, gen, label)
        text = self.tokenizer.decode(gen.output_ids) if self.tokenizer is not None and gen.output_ids else ""
        return {"text": text, "output_ids": gen.output_ids, "meta_info": meta}

    def _log(self, req: _Request, gen: Generation, label: str) -> None:
        self._record({"rid": req.rid, "routing_key": req.routing_key, "lora_path": req.lora_path,
                      "prompt_tokens": len(req.ids),
                      "cached_tokens": gen.cached_tokens, "completion_tokens": len(gen.output_ids),
                      "finish": gen.finish_reason, "weight_version": label})
        log.info("generate rid=%s worker=%s key=%s prompt=%d cached=%d out=%d finish=%s version=%s", req.rid,
                 self.worker_id, req.routing_key, len(req.ids), gen.cached_tokens, len(gen.output_ids),
                 gen.finish_reason, label)

    # ------------------------------------------------------------------------------------------- control
    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        body = await json_object(request)
        if not isinstance(body.get("model_path"), str) or self.engine is None:
            return web.json_response({"success": False, "message": "model_path (a string) is required",
                                      "num_paused_requests": 0}, status=400)
        if body.get("abort_all_requests"):
            self._abort("", abort_all=True, message="Abort due to weight update")
        label = body.get("weight_version")
        try:
            version = await self._load_weights(body["model_path"])
        except Exception as exc:  # noqa: BLE001 - reported like SGLang: 400 with success=false, old weights kept
            return web.json_response({"success": False, "num_paused_requests": 0,
                                      "message": f"Failed to update weights: {exc}. Rolled back to the previous "
                                                 "weights."}, status=400)
        self.label = str(label) if label is not None else self.label
        self._labels[version] = self.label
        message = "Succeeded to update model weights."
        if label is not None:
            message += f" Weight version updated to {label}."
        return web.json_response({"success": True, "message": message, "num_paused_requests": 0})

    async def _control_body(self, request: web.Request) -> tuple[dict[str, Any], web.Response | None]:
        """The body of a control call judged by SGLang's own request model: (body, None) or (_, the 400)."""
        try:
            body = await request.json()
        except ValueError as exc:
            return {}, _error(f"the request body is not JSON: {exc}")
        verdict = self.control_validator.check(request.path, body)
        if verdict is not None:  # SGLang's RequestValidationError handler: 400, ErrorResponse shape
            return {}, web.json_response({"object": "error", "message": verdict, "type": "Bad Request",
                                          "param": None, "code": 400}, status=400)
        return body, None

    async def load_lora_adapter(self, request: web.Request) -> web.Response:
        body, refused = await self._control_body(request)
        if refused is not None:
            return refused
        name, path = body["lora_name"], body["lora_path"]
        if name in self.adapters:
            return _lora_result(f"Failed to load LoRA adapter {name}: an adapter with this name is already loaded",
                                self.adapters)
        if self.engine is None:
            return _lora_result("the echo stand-in has no model to apply an adapter to", self.adapters)
        try:
            await self._load_adapter(name, path)
        except Exception as exc:  # noqa: BLE001 - SGLang answers success=false, old weights kept
            return _lora_result(f"Failed to load LoRA adapter {name} from {path}: {exc}", self.adapters)
        return _lora_result(None, self.adapters)

    async def unload_lora_adapter(self, request: web.Request) -> web.Response:
        body, refused = await self._control_body(request)
        if refused is not None:
            return refused
        if self.adapters.pop(body["lora_name"], None) is None:
            return _lora_result(f"LoRA adapter {body['lora_name']} is not loaded", self.adapters)
        return _lora_result(None, self.adapters)

    async def update_weight_version(self, request: web.Request) -> web.Response:
        body, refused = await self._control_body(request)
        if refused is not None:
            return refused
        if body.get("abort_all_requests", True):  # UpdateWeightVersionReqInput's default
            self._abort("", abort_all=True, message="Abort due to weight version update")
        self.label = body["new_version"]
        self._labels[self.engine.weight_version if self.engine is not None else 0] = self.label
        return web.json_response({"success": True, "message": f"Weight version updated to {self.label}",
                                  "new_version": self.label})

    async def pause_generation(self, request: web.Request) -> web.Response:
        mode = (await json_object(request)).get("mode", "abort")
        if mode not in ("abort", "retract", "in_place"):
            return _error(f"invalid pause mode {mode!r}: use abort, retract or in_place")
        self._resumed.clear()
        if mode == "abort":
            self._abort("", abort_all=True, message="Abort due to pause_generation")
        return web.json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(self, request: web.Request) -> web.Response:
        self._resumed.set()
        return web.json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def abort_request(self, request: web.Request) -> web.Response:
        body = await json_object(request)
        self._abort(str(body.get("rid") or ""), abort_all=bool(body.get("abort_all")), message="Aborted by request")
        return web.Response(status=200)

    def _abort(self, rid: str, *, abort_all: bool, message: str) -> None:
        self._abort_where(lambda r: abort_all or bool(rid and r.startswith(rid)), message)  # SGLang: rid prefixes

    async def flush_cache(self, request: web.Request) -> web.Response:
        if self._inflight:
            return web.Response(status=400, text=f"Cache not flushed because there are pending requests. "
                                                 f"#queue-req: 0, #running-req: {len(self._inflight)}")
        await self._clear_prefix_cache()
        return web.Response(text=_FLUSHED)

    async def health(self, request: web.Request) -> web.Response:
        if self.engine is None or not self._resumed.is_set():
            return web.Response(status=200)
        try:
            async with asyncio.timeout(20):
                await self.engine.generate([0], SamplingParams(temperature=0.0, max_new_tokens=1),
                                           session_id=f"health-{uuid.uuid4().hex}")
        except Exception:  # noqa: BLE001 - any failure is "unhealthy"
            return web.Response(status=503)
        return web.Response(status=200)

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response({
            "model_path": self.model_path, "served_model_name": self.model_path, "tokenizer_path": self.model_path,
            "is_generation": True, "preferred_sampling_params": None, "weight_version": self.label,
            "load_format": "auto", "reasoning_parser": None, "tool_call_parser": None, "disaggregation_mode": "null",
            "has_image_understanding": False, "has_audio_understanding": False,
        })

    async def server_info(self, request: web.Request) -> web.Response:
        return web.json_response({
            "model_path": self.model_path, "context_length": self.context_window,
            "max_req_input_len": self.context_window - 6, "max_total_num_tokens": self.context_window,
            "weight_version": self.label, "version": SGLANG_VERSION, "frontend": "agentrl-standin",
            "worker_id": self.worker_id, "contract": self.validator.source, "startup_time": self._started,
            "enable_deterministic_inference": bool(getattr(self.engine, "deterministic", False)),
            "internal_states": [{}],
        })


def _lora_result(error: str | None, adapters: dict[str, str]) -> web.Response:
    """SGLang's LoRAUpdateOutput: 200 on success, 400 with success=false otherwise."""
    return web.json_response({"success": error is None, "error_message": error, "loaded_adapters": dict(adapters),
                              "rid": None, "http_worker_ipc": None}, status=200 if error is None else 400)


def _error(message: str, status: int = 400) -> web.Response:
    return web.json_response({"error": {"message": message}}, status=status)  # SGLang's _create_error_response


async def serve(model: str | None, *, host: str = "127.0.0.1", port: int = 30000, worker_id: str | None = None,
                max_batch_size: int = 16, context_window: int | None = None, seed: int | None = None,
                weight_version: str = "default", echo: bool = False, deterministic: bool = False) -> None:
    """`agentrl engine serve`: load the model, serve until cancelled (Ctrl-C / SIGTERM), then close the engine."""
    await serve_face(StandIn, generate_validator, model, host=host, port=port, worker_id=worker_id,
                     max_batch_size=max_batch_size, context_window=context_window, seed=seed,
                     deterministic=deterministic, echo=echo, weight_version=weight_version)
