"""The one stand-in server behind both API faces (`sglang.StandIn`: SGLang's native API; `vllm.VLLMStandIn`:
vLLM's /v1/completions and dev control endpoints), over the LocalEngine.

Owns what both faces do alike: the state (engine, request log, in-flight table, the resume gate, weight-version
labels by engine version, loaded LoRA adapters), running one generation as a cancellable in-flight task (a client
that goes away stops it; an abort ends it with finish "abort"), aborting in-flight requests, loading weights or a
LoRA adapter under a new engine version, clearing the prefix cache, the `/agentrl/requests` log endpoint, the TCP
server (`StandInServer`) and `serve_face()` behind `agentrl engine serve [--api sglang|vllm]`. A face owns its
paths, request admission, answer shapes and error texts (those of the server it imitates) and its contract
validators (generate bodies; LoRA control bodies: `lora_contract.py`).
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from aiohttp import web

from agentrl.types import Generation, SamplingParams

log = logging.getLogger("agentrl.engine.standin")


@dataclass(eq=False)
class InFlight:
    request_id: str
    task: asyncio.Task[Generation]
    abort_message: str | None = None

    @property
    def rid(self) -> str:  # SGLang's name for the request id
        return self.request_id


class StandInCore:
    """The state and behaviour both faces share. `engine` is a LocalEngine (None only for the SGLang echo mode)."""

    server: ClassVar[str]  # "SGLang", "vLLM": the banner
    checked_path: ClassVar[str]  # the generate path whose bodies the validator judges

    def __init__(self, engine: Any, *, model_path: str | Path, validator: Any, worker_id: str, tokenizer: Any = None,
                 context_window: int | None = None, label: str = "default", max_log: int = 100_000) -> None:
        self.engine = engine
        self._partial_of: tuple[Any, bool] = (None, False)  # (engine, takes partial=): read once per engine
        self.model_path = str(model_path)
        self.validator = validator
        self.worker_id = worker_id
        self.tokenizer = tokenizer
        self.context_window = context_window or (engine.context_window if engine is not None else 4096)
        self.request_log: collections.deque[dict[str, Any]] = collections.deque(maxlen=max_log)
        self.label = label  # the weight-version label reported now
        self._labels: dict[int, str] = {engine.weight_version if engine is not None else 0: label}
        self._inflight: dict[str, InFlight] = {}
        self.adapters: dict[str, str] = {}  # loaded LoRA adapters: name -> path
        self._resumed = asyncio.Event()
        self._resumed.set()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=512 * 2**20)
        self.routes(app.router)
        app.router.add_get("/agentrl/requests", self.requests)
        return app

    def routes(self, router: web.UrlDispatcher) -> None:
        raise NotImplementedError  # pragma: no cover - the face's paths

    @property
    def in_flight(self) -> int:
        return len(self._inflight)

    async def _generate(self, request_id: str, ids: list[int], sampling: SamplingParams,
                        session: str) -> tuple[Generation, str | None]:
        """Run one generation as an in-flight task. Returns (generation, abort message); an aborted one has finish
        "abort" and the tokens (and logprobs) generated before the abort, as the real servers return them. The
        engine's own error is raised."""
        partial: dict[str, Any] = {}
        if self._partial_of[0] is not self.engine:  # a test may swap the engine behind the server
            self._partial_of = (self.engine, _takes_partial(self.engine))
        extra = {"partial": partial} if self._partial_of[1] else {}  # LocalEngine; fakes may not
        entry = InFlight(request_id, asyncio.ensure_future(
            self.engine.generate(ids, sampling, session_id=session, **extra)))
        self._inflight[request_id] = entry
        try:
            await asyncio.wait({entry.task})
        finally:
            self._inflight.pop(request_id, None)
            if not entry.task.done():  # the client went away: stop generating for it (both servers do the same)
                entry.task.cancel()
        if entry.task.cancelled():
            out, lps = list(partial.get("output_ids", [])), list(partial.get("logprobs", []))
            n = min(len(out), len(lps))
            return Generation(output_ids=out[:n], logprobs=lps[:n], finish_reason="abort",
                              weight_version=partial.get("version", self.engine.weight_version)), entry.abort_message
        return entry.task.result(), None

    def _abort_where(self, matches: Any, message: str | None = None) -> int:
        """Abort every in-flight request whose id `matches`; how many."""
        n = 0
        for entry in list(self._inflight.values()):
            if matches(entry.request_id):
                entry.abort_message = message
                entry.task.cancel()
                n += 1
        return n

    def _label_of(self, weight_version: int) -> str:
        return self._labels.get(weight_version, self.label)

    async def _load_weights(self, path: str) -> int:
        """Load `path` into the engine under a new engine version (labelled with the current label); that version."""
        version = max(self._labels) + 1
        await self.engine.update_weights(path, version)
        self._labels[version] = self.label
        return version

    async def _load_adapter(self, name: str, path: str) -> int:
        """Apply the LoRA adapter at `path` to the engine under a new engine version (labelled with the current
        label) and register it as `name`; that version. The engine applies one adapter at a time: requests must name
        the one it serves (`_adapter_refusal`)."""
        version = max(self._labels) + 1
        await self.engine.load_adapter(path, version, name=name)
        self._labels[version] = self.label
        self.adapters[name] = path
        return version

    def _adapter_refusal(self, named: str | None) -> str | None:
        """Why a request naming adapter `named` (None: the base model) cannot be served by this stand-in, or None.
        (The real servers hold several adapters next to the base model; the stand-in's engine holds one.)"""
        # engines without adapter support (a scripted or simulated engine behind the stand-in) serve the base model
        serving = getattr(self.engine, "adapter", None) if self.engine is not None else None
        if named == serving:
            return None
        if named is None:
            return (f"the agentrl stand-in serves LoRA adapter {serving!r} now, not the base model: name the adapter "
                    "in the request")
        if named not in self.adapters:
            return None  # unknown: the face answers with its server's own error
        return f"the agentrl stand-in serves only its newest LoRA adapter ({serving!r}), not {named!r}"

    async def _clear_prefix_cache(self) -> None:
        if self.engine is not None:  # passing the engine its own model only clears the prefix cache
            await self.engine.update_weights(self.engine.model, self.engine.weight_version)

    def _record(self, entry: dict[str, Any]) -> None:
        self.request_log.append({**entry, "worker": self.worker_id})

    async def requests(self, request: web.Request) -> web.Response:
        return web.json_response(list(self.request_log))


class StandInServer:
    """Runs a stand-in app (any object with `.app()`) on a TCP socket: `url = await server.start()`, `await
    server.stop()`."""

    def __init__(self, standin: Any, host: str = "127.0.0.1", port: int = 0) -> None:
        self.standin, self.host, self.port = standin, host, port
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        self._runner = web.AppRunner(self.standin.app(), handler_cancellation=True, access_log=None)
        await self._runner.setup()
        await web.SockSite(self._runner, sock).start()
        return self.url

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


async def json_object(request: web.Request) -> dict[str, Any]:
    """The request's JSON object body, {} when there is none or it is not an object."""
    if not request.can_read_body:
        return {}
    try:
        body = await request.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


async def serve_face(face: type[StandInCore], validator_factory: Any, model: str | None, *, host: str, port: int,
                     worker_id: str | None = None, max_batch_size: int = 16, context_window: int | None = None,
                     seed: int | None = None, deterministic: bool = False, echo: bool = False,
                     **face_kw: Any) -> None:
    """`agentrl engine serve`: load the model, serve `face` until cancelled (Ctrl-C / SIGTERM), close the engine."""
    from agentrl.engine.models import resolve_model

    path = resolve_model(model)
    validator = await asyncio.to_thread(validator_factory)
    if not validator.is_real:
        log.warning("%s stand-in: %s; %s bodies are checked by a hand-written subset of the contract", face.server,
                    validator.source, face.checked_path)
    engine = None
    if not echo:
        from agentrl.engine.local import LocalEngine

        engine = await asyncio.to_thread(LocalEngine, path, max_batch_size=max_batch_size,
                                         context_window=context_window, seed=seed, deterministic=deterministic)
    tokenizer = None if echo else await asyncio.to_thread(_load_tokenizer, path)
    if echo:
        face_kw["echo"] = True
    standin = face(engine, model_path=path, validator=validator, worker_id=worker_id or f"{host}:{port}",
                   tokenizer=tokenizer, context_window=context_window, **face_kw)
    server = StandInServer(standin, host, port)
    try:
        url = await server.start()
        print(f"agentrl stand-in {face.server} server on {url} (worker {standin.worker_id}, model {path}, "
              f"{face.checked_path} checked by {validator.source})", flush=True)
        await asyncio.Event().wait()
    finally:
        await server.stop()
        if engine is not None:
            await engine.close()


def _load_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def _takes_partial(engine: Any) -> bool:
    """Whether `engine.generate` reports the tokens of an aborted call (the `partial` keyword of LocalEngine)."""
    try:
        return "partial" in inspect.signature(engine.generate).parameters
    except (AttributeError, TypeError, ValueError):  # no engine (the echo mode), or no signature to read
        return False
