"""Stand-in vLLM server: the subset of vLLM 0.33.0's HTTP API that agentrl's `vllm` engine uses, over the LocalEngine.

The vLLM face of the one stand-in server (`core.StandInCore`, which owns the in-flight table, aborts, the
resume gate, weight labels, the request log, the TCP server and `serve`). Owns: the aiohttp routes that answer like
`VLLM_SERVER_DEV_MODE=1 vllm serve` (same paths, bodies, status codes, error shape {"error": {"message", "type",
"param", "code"}}), so the `vllm` engine and the weight-sync path are exercised on a CPU. Every `/v1/completions`
body is judged by vLLM's own request models (`vllm_contract.py`: CompletionRequest + SamplingParams verification)
before anything runs; the LoRA bodies by vLLM's own LoRA request models (`lora_contract.py`). Does not own
generation (LocalEngine) or the contract.

    POST /v1/completions        token-id prompt only, n=1, non-streamed; logprobs 0, return_token_ids,
                                return_tokens_as_token_ids, return_weight_versions; usage.prompt_tokens_details
    GET  /v1/models, /version, /health
    POST /pause?mode=abort|wait|keep, /resume; GET /is_paused    abort: in-flight requests end with finish "abort"
                                and the tokens they had; every mode holds new requests until /resume, then answers
                                them (200), as a real vLLM 0.32 does
    POST /collective_rpc        only {"method": "reload_weights", "kwargs": {"weights_path": ...}}; a refused reload
                                leaves the server unable to generate (500) until a reload succeeds, as a real vLLM
                                is left with meta tensors (it then dies; the stand-in only refuses)
    POST /reset_prefix_cache    {"success": false} while requests run
    POST /update_weight_version, GET /weight_info, POST /abort_requests
    POST /v1/load_lora_adapter, /v1/unload_lora_adapter   lora_name, lora_path (VLLM_ALLOW_RUNTIME_LORA_UPDATING):
                                the adapter applied to the engine; requests name it in `model`; /v1/models lists it
    GET  /agentrl/requests      this stand-in's request log (request_id, session, cached tokens, version, ...)

Differences from vLLM, on purpose: unknown request fields are refused (vLLM ignores them: see vllm_contract.py);
the prefix cache is per session (`session_id` / X-Session-ID) instead of global; sampling features the LocalEngine
lacks (penalties, min_p, stop strings, logit_bias...) are refused
with a 400 naming them rather than ignored; the engine applies one LoRA adapter at a time, so a request must name
the adapter loaded last (or the base model before any), else a 400 saying so.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

from aiohttp import web

from agentrl.engine.standin.core import StandInCore, StandInServer, json_object, serve_face
from agentrl.engine.standin.lora_contract import ControlValidator, vllm_lora_validator
from agentrl.engine.standin.vllm_contract import VLLM_VERSION, CompletionValidator, completion_validator
from agentrl.errors import ConfigError
from agentrl.types import Generation, SamplingParams

SESSION_HEADER = "X-Session-ID"
#: CompletionRequest fields the stand-in honours, with the values at which it can serve them (others: refused)
_NEUTRAL = {"n": 1, "echo": False, "stream": False, "min_p": 0.0, "repetition_penalty": 1.0,
            "presence_penalty": 0.0, "frequency_penalty": 0.0, "ignore_eos": False, "min_tokens": 0,
            "use_beam_search": False, "include_stop_str_in_output": False, "length_penalty": 1.0, "priority": 0,
            "skip_special_tokens": False, "add_special_tokens": False, "spaces_between_special_tokens": True}
_HONOURED = {"model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop_token_ids", "logprobs",
             "return_token_ids", "return_tokens_as_token_ids", "return_weight_versions", "request_id", "session_id",
             "stop", "bad_words", *_NEUTRAL}
_EMPTY_OK = {"stop": ([], None, ""), "bad_words": ([], None)}

__all__ = ["VLLMStandIn", "StandInServer", "serve"]


class VLLMStandIn(StandInCore):
    """The vLLM face. `engine` is a LocalEngine."""

    server = "vLLM"
    checked_path = "/v1/completions"

    def __init__(self, engine: Any, *, model_path: str | Path, validator: CompletionValidator, worker_id: str,
                 served_model: str | None = None, tokenizer: Any = None, context_window: int | None = None,
                 prompt_tokens_details: bool = True, max_log: int = 100_000,
                 lora_validator: ControlValidator | None = None) -> None:
        super().__init__(engine, model_path=model_path, validator=validator, worker_id=worker_id, tokenizer=tokenizer,
                         context_window=context_window, max_log=max_log)
        self.served_model = served_model or self.model_path
        self.prompt_tokens_details = prompt_tokens_details  # vLLM's --enable-prompt-tokens-details
        self._paused: str | None = None  # the pause mode while paused
        self._weights_broken: str | None = None  # a refused reload's error: no generation until a reload succeeds
        self.lora_validator = lora_validator or vllm_lora_validator()

    def routes(self, r: web.UrlDispatcher) -> None:
        r.add_post("/v1/completions", self.completions)
        r.add_get("/v1/models", self.models)
        r.add_get("/version", self.version)
        r.add_get("/health", self.health)
        r.add_post("/pause", self.pause)
        r.add_post("/resume", self.resume)
        r.add_get("/is_paused", self.is_paused)
        r.add_post("/collective_rpc", self.collective_rpc)
        r.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        r.add_post("/update_weight_version", self.update_weight_version)
        r.add_get("/weight_info", self.weight_info)
        r.add_post("/abort_requests", self.abort_requests)
        r.add_post("/v1/load_lora_adapter", self.load_lora_adapter)
        r.add_post("/v1/unload_lora_adapter", self.unload_lora_adapter)

    # ------------------------------------------------------------------------------------------- completions
    async def completions(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError as exc:
            return _error(f"the request body is not JSON: {exc}")
        verdict = self.validator.check(body, self.context_window)
        if verdict is not None:
            return _error(verdict[1], status=verdict[0])  # vLLM's own gate (+ unknown fields refused)
        try:
            ids, sampling = self._admit(body)
        except ValueError as exc:
            return _error(str(exc))
        model = body.get("model")
        if model is not None and model != self.served_model and model not in self.adapters:  # vLLM's check_model
            return _error(f"The model `{model}` does not exist.", status=404, err_type="NotFoundError")
        refusal = self._adapter_refusal(model if model in self.adapters else None)
        if refusal:
            return _error(refusal)
        await self._resumed.wait()  # every pause mode: held until /resume (vLLM 0.32 answers 200 afterwards)
        if self._weights_broken is not None:
            return _error(f"the model's parameters are meta tensors after a failed reload_weights "
                          f"({self._weights_broken})", status=500, err_type="InternalServerError")
        session = body.get("session_id") or request.headers.get(SESSION_HEADER) or uuid.uuid4().hex
        request_id = str(body.get("request_id") or uuid.uuid4().hex)
        try:
            gen, _ = await self._generate(request_id, ids, sampling, session)
        except Exception as exc:  # noqa: BLE001 - the engine's error, answered like vLLM
            return _error(str(exc), status=400 if isinstance(exc, ConfigError) else 500,
                          err_type="BadRequestError" if isinstance(exc, ConfigError) else "InternalServerError")
        return web.json_response(self._answer(body, request_id, session, ids, gen))

    def _admit(self, body: dict[str, Any]) -> tuple[list[int], SamplingParams]:
        """What the stand-in can serve, after vLLM's own checks passed."""
        refused = sorted(k for k in body if k not in _HONOURED)
        refused += sorted(k for k, v in _NEUTRAL.items() if body.get(k) not in (None, v))
        refused += sorted(k for k, ok in _EMPTY_OK.items() if body.get(k) not in ok)
        if refused:
            raise ValueError(f"the agentrl stand-in does not implement {refused}")
        prompt = body.get("prompt")
        if not isinstance(prompt, list) or not prompt or not all(isinstance(t, int) for t in prompt):
            raise ValueError("the stand-in takes one non-empty token-id prompt (a list of ints): token in only")
        if body.get("logprobs") not in (None, 0):
            raise ValueError("the stand-in returns the sampled token's logprob only: send logprobs=0")
        max_tokens = 16 if body.get("max_tokens") is None else int(body["max_tokens"])
        self._check_context(len(prompt), max_tokens)
        temperature = 1.0 if body.get("temperature") is None else float(body["temperature"])
        top_k = body.get("top_k") or 0
        return list(prompt), SamplingParams(
            temperature=0.0 if temperature < 1e-5 else temperature,
            top_p=1.0 if body.get("top_p") is None else float(body["top_p"]),
            top_k=0 if top_k in (0, -1) else int(top_k), max_new_tokens=max_tokens,
            stop_token_ids=list(body.get("stop_token_ids") or []), seed=body.get("seed"))

    def _check_context(self, n_prompt: int, max_tokens: int) -> None:
        """vLLM's messages (renderers/params.py) for a prompt that leaves no room for max_tokens."""
        ctx = self.context_window
        if n_prompt + max_tokens > ctx:
            raise ValueError(
                f"This model's maximum context length is {ctx} tokens. However, your prompt contains {n_prompt} "
                f"input tokens and you requested {max_tokens} output tokens. Please reduce the length of the input "
                "prompt or the number of requested output tokens.")

    def _answer(self, body: dict[str, Any], request_id: str, session: str, ids: list[int],
                gen: Generation) -> dict[str, Any]:
        label = self._label_of(gen.weight_version)
        out = list(gen.output_ids)
        choice: dict[str, Any] = {
            "index": 0, "text": self.tokenizer.decode(out) if self.tokenizer is not None and out else "",
            "finish_reason": gen.finish_reason,
            "stop_reason": out[-1] if gen.finish_reason == "stop" and out[-1] in (body.get("stop_token_ids") or [])
            else None,
            "logprobs": None, "prompt_logprobs": None,
            "token_ids": out if body.get("return_token_ids") else None,
            "prompt_token_ids": ids if body.get("return_token_ids") else None,
            "weight_versions": [{"version": label, "start": 0, "end": len(out)}] if body.get(
                "return_weight_versions") and out else ([] if body.get("return_weight_versions") else None),
        }
        if body.get("logprobs") is not None:
            as_ids = bool(body.get("return_tokens_as_token_ids"))
            tokens = [f"token_id:{t}" if as_ids or self.tokenizer is None else self.tokenizer.decode([t]) for t in out]
            choice["logprobs"] = {"text_offset": [], "token_logprobs": list(gen.logprobs), "tokens": tokens,
                                  "top_logprobs": [{tok: lp} for tok, lp in zip(tokens, gen.logprobs)]}
        usage: dict[str, Any] = {"prompt_tokens": len(ids), "completion_tokens": len(out),
                                 "total_tokens": len(ids) + len(out), "prompt_tokens_details": None}
        if self.prompt_tokens_details:
            usage["prompt_tokens_details"] = {"cached_tokens": gen.cached_tokens}
        self._record({"request_id": request_id, "session": session, "model": body.get("model"),
                      "prompt_tokens": len(ids),
                      "cached_tokens": gen.cached_tokens, "completion_tokens": len(gen.output_ids),
                      "finish": gen.finish_reason, "weight_version": label})
        return {"id": f"cmpl-{request_id}", "object": "text_completion", "created": int(time.time()),
                "model": self.served_model, "choices": [choice], "usage": usage}

    # ------------------------------------------------------------------------------------------- control
    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": VLLM_VERSION})

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def is_paused(self, request: web.Request) -> web.Response:
        return web.json_response({"is_paused": self._paused is not None})

    async def weight_info(self, request: web.Request) -> web.Response:
        return web.json_response({"weight_version": self.label})

    async def models(self, request: web.Request) -> web.Response:
        card = {"id": self.served_model, "object": "model", "created": int(time.time()), "owned_by": "vllm",
                "root": self.model_path, "parent": None, "max_model_len": self.context_window, "permission": []}
        loras = [{**card, "id": name, "root": path, "parent": self.served_model}
                 for name, path in self.adapters.items()]
        return web.json_response({"object": "list", "data": [card, *loras]})

    async def pause(self, request: web.Request) -> web.Response:
        mode = request.query.get("mode", "abort")
        if mode not in ("abort", "wait", "keep"):
            return _error(f"Invalid pause mode {mode!r}; expected one of abort, wait, keep")
        self._paused = mode
        self._resumed.clear()
        if mode == "abort":
            self._abort(None)
        elif mode == "wait":
            while self._inflight:
                await asyncio.wait({e.task for e in self._inflight.values()})
                await asyncio.sleep(0)
        return web.json_response({"status": "paused"})

    async def resume(self, request: web.Request) -> web.Response:
        self._paused = None
        self._resumed.set()
        return web.json_response({"status": "resumed"})

    async def abort_requests(self, request: web.Request) -> web.Response:
        ids = (await json_object(request)).get("request_ids") or None
        n = self._abort(set(ids) if ids else None)
        return web.json_response({"status": "aborted", "aborted": n})

    def _abort(self, request_ids: set[str] | None) -> int:
        return self._abort_where(lambda r: request_ids is None or r in request_ids)

    async def collective_rpc(self, request: web.Request) -> web.Response:
        body = await json_object(request)
        if body.get("method") != "reload_weights":
            return _error(f"the agentrl stand-in only serves collective_rpc method 'reload_weights', got "
                          f"{body.get('method')!r}")
        path = (body.get("kwargs") or {}).get("weights_path")
        if not isinstance(path, str):
            return _error("kwargs.weights_path (a string) is required")
        try:
            await self._load_weights(path)  # relabelled by /update_weight_version
        except Exception as exc:  # noqa: BLE001 - reported like vLLM: a 500 with the worker's error
            self._weights_broken = str(exc)
            return _error(f"Call to collective_rpc method failed: Worker failed with error '{exc}', please check the "
                          "stack trace above for the root cause", status=500, err_type="InternalServerError")
        self._weights_broken = None
        return web.json_response({"results": [None]})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        if self._inflight:
            return web.json_response({"success": False})
        await self._clear_prefix_cache()
        return web.json_response({"success": True})

    async def _lora_body(self, request: web.Request) -> tuple[dict[str, Any], web.Response | None]:
        """A LoRA call's body judged by vLLM's own request model: (body, None) or (_, the 400)."""
        try:
            body = await request.json()
        except ValueError as exc:
            return {}, _error(f"the request body is not JSON: {exc}")
        verdict = self.lora_validator.check(request.path, body)
        return body, (_error(verdict) if verdict is not None else None)

    async def load_lora_adapter(self, request: web.Request) -> web.Response:
        body, refused = await self._lora_body(request)
        if refused is not None:
            return refused
        name, path = body["lora_name"], body["lora_path"]
        if not name or not path:  # vLLM's own checks and texts (models/serving.py)
            return _error("Both 'lora_name' and 'lora_path' must be provided.", err_type="InvalidUserInput")
        if name == self.served_model:
            return _error(f"The lora adapter '{name}' conflicts with a base model name.", err_type="InvalidUserInput")
        if name in self.adapters and not body.get("load_inplace"):
            return _error(f"The lora adapter '{name}' has already been loaded. If you want to load the adapter in "
                          "place, set 'load_inplace' to True.", err_type="InvalidUserInput")
        try:
            await self._load_adapter(name, path)
        except Exception as exc:  # noqa: BLE001 - vLLM answers the engine's error as a 500
            return _error(str(exc), status=500, err_type="InternalServerError")
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def unload_lora_adapter(self, request: web.Request) -> web.Response:
        body, refused = await self._lora_body(request)
        if refused is not None:
            return refused
        name = body["lora_name"]
        if not name:
            return _error("'lora_name' needs to be provided to unload a LoRA adapter.", err_type="InvalidUserInput")
        if self.adapters.pop(name, None) is None:
            return _error(f"The lora adapter '{name}' cannot be found.", status=404, err_type="NotFoundError")
        if getattr(self.engine, "adapter", None) == name:  # a real server serves the base model next to adapters
            await self.engine.unload_adapter()
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")

    async def update_weight_version(self, request: web.Request) -> web.Response:
        new = (await json_object(request)).get("new_version")
        if not isinstance(new, str):
            return _error("new_version (a string) is required", status=422, err_type="UnprocessableEntityError")
        self.label = new
        self._labels[self.engine.weight_version] = new
        return web.json_response({"success": True, "new_version": new})


def _error(message: str, status: int = 400, err_type: str = "BadRequestError") -> web.Response:
    """vLLM's ErrorResponse."""
    return web.json_response({"error": {"message": message, "type": err_type, "param": None, "code": status}},
                             status=status)


async def serve(model: str | None, *, host: str = "127.0.0.1", port: int = 8000, worker_id: str | None = None,
                max_batch_size: int = 16, context_window: int | None = None, seed: int | None = None) -> None:
    """`agentrl engine serve --api vllm`: load the model, serve until cancelled, then close the engine."""
    await serve_face(VLLMStandIn, completion_validator, model, host=host, port=port, worker_id=worker_id,
                     max_batch_size=max_batch_size, context_window=context_window, seed=seed)
