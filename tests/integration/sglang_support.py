"""Helpers for the SGLang client tests: stand-in servers (in-process and as `agentrl engine serve` subprocesses), the
SGLang contract, fault-injecting servers for the network edge, and the multi-turn rollout harness."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from agentrl.engine.local import LocalEngine
from agentrl.engine.sglang import SGLangEngine, checkpoint_facts
from agentrl.engine.standin.sglang_contract import GenerateValidator, fetch_contract, generate_validator
from agentrl.engine.standin.sglang import StandIn, StandInServer
from agentrl.errors import MissingDependencyError

REQUIRE_CONTRACT = os.environ.get("AGENTRL_REQUIRE_SGLANG_CONTRACT") == "1"


def contract_validator() -> GenerateValidator:
    """The real SGLang 0.5.23 contract (fetched once into the agentrl cache), or the fallback if it cannot be had."""
    validator = generate_validator()
    if not validator.is_real:
        with contextlib.suppress(MissingDependencyError):
            fetch_contract()
        validator = generate_validator()
    return validator


class RecordingValidator:
    """Wraps a validator and keeps every /generate body it judged."""

    def __init__(self, inner: GenerateValidator) -> None:
        self.inner = inner
        self.bodies: list[Any] = []

    def as_validator(self) -> GenerateValidator:
        def check(body: Any) -> str | None:
            self.bodies.append(body)
            return self.inner.check(body)

        return GenerateValidator(check, self.inner.source)


@contextlib.asynccontextmanager
async def running_standin(model: Path, *, worker_id: str = "w0", validator: GenerateValidator | None = None,
                          seed: int | None = 0, **standin_kw: Any) -> AsyncIterator[tuple[StandInServer, LocalEngine]]:
    engine = LocalEngine(model, seed=seed)
    server = StandInServer(StandIn(engine, model_path=model, validator=validator or contract_validator(),
                                   worker_id=worker_id, **standin_kw))
    await server.start()
    try:
        yield server, engine
    finally:
        await server.stop()
        await engine.close()


def sglang_engine(model: Path, urls: list[str] | None = None, **kw: Any) -> SGLangEngine:
    eos, window = checkpoint_facts(model)
    kw.setdefault("context_window", window)
    return SGLangEngine(urls=urls or [], eos_token_ids=eos, model_path=str(model), **kw)


class NeverFinishes:
    """Wraps a LocalEngine: its generations never finish (until cancelled, i.e. aborted by the stand-in)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def generate(self, *args: Any, **kwargs: Any) -> Any:
        await asyncio.Event().wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def request_log(url: str) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as s, s.get(f"{url}/agentrl/requests") as r:
        return list(await r.json())


async def wait_until(predicate: Any, timeout: float = 30.0, interval: float = 0.005) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(interval)


# -- a stand-in as its own process (for kill -9) ---------------------------------------------------------------------

@contextlib.contextmanager
def standin_process(model: Path, port: int, worker_id: str) -> Iterator[subprocess.Popen[bytes]]:
    cmd = [sys.executable, "-m", "agentrl.cli", "engine", "serve", "--model", str(model), "--port", str(port),
           "--worker-id", worker_id]
    with tempfile.TemporaryFile() as out:  # a file, not a pipe: a full pipe would block the server's logging
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            _wait_http(f"http://127.0.0.1:{port}/model_info", proc, out)
            yield proc
        finally:
            _stop(proc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _wait_http(url: str, proc: subprocess.Popen[bytes], out: Any, timeout: float = 120.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out.seek(0)
            raise RuntimeError(f"server exited with {proc.returncode}: {out.read().decode(errors='replace')[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up within {timeout}s")


# -- fault injection at the network edge ---------------------------------------------------------------------------

class FaultStandIn(StandIn):
    """Answers the metadata calls like a healthy SGLang worker; /generate misbehaves as `mode` says:
    "503" (overloaded), "slow" (answers only after `delay_s`), "400" (an SGLang contract error)."""

    def __init__(self, mode: str, delay_s: float = 30.0) -> None:
        super().__init__(None, model_path="fault", validator=GenerateValidator(lambda b: None, "none"),
                         worker_id="fault", echo=True, context_window=2048)
        self.mode, self.delay_s = mode, delay_s
        self.generate_hits = 0

    async def generate(self, request: web.Request) -> web.Response:
        self.generate_hits += 1
        if self.mode == "503":
            return web.json_response({"error": {"message": "Service overloaded, retry later"}}, status=503)
        if self.mode == "400":
            return web.json_response({"error": "unknown field `max_tokens`, expected one of `max_new_tokens`"},
                                     status=400)
        await asyncio.sleep(self.delay_s)
        return web.json_response({})


class ResetServer:
    """Answers GET /model_info and /server_info; resets (RST) every POST /generate connection without answering."""

    def __init__(self) -> None:
        self.resets = 0
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            if head.startswith(b"GET"):
                body = b'{"weight_version": "default", "context_length": 2048}'
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                             + str(len(body)).encode() + b"\r\n\r\n" + body)
                await writer.drain()
                continue
            self.resets += 1
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            writer.transport.abort()
            return

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


def new_session() -> str:
    return uuid.uuid4().hex


# -- multi-turn rollouts through the real runner -------------------------------------------------------------------

def every_reply_is_a_call(text: str, fmt: str, tools: Any, turn: int = 0) -> Any:
    """Parser patch: every model reply (random tiny model) becomes one tool call, so trajectories have several turns."""
    from agentrl.tools.parsers import ParseOutcome
    from agentrl.types import ToolCall

    return ParseOutcome(calls=[ToolCall(id=f"c{turn}", name="run_python", arguments={"code": "print(6*7)"})],
                        errors=[])


async def run_rollouts(engine: Any, tokenizer: Any, tasks: list[Any], *, group_size: int = 2, max_turns: int = 3,
                       max_new: int = 24, infra_retries: int = 0, max_trajectories: int = 4) -> list[Any]:
    """Greedy rollouts of `tasks` (code_tests) with real local sandboxes; returns every trajectory."""
    from agentrl.envs import get_env
    from agentrl.runner import Budgets, Rollout, Scheduler, SchedulerConfig
    from agentrl.sandbox import SandboxPool, SandboxSpec
    from agentrl.tools.render import ChatRenderer
    from agentrl.types import SamplingParams

    env = get_env("code_tests", source="easy")
    sampling = SamplingParams(temperature=0.0, max_new_tokens=max_new, stop_token_ids=list(engine.eos_token_ids),
                              seed=0)
    rollout = Rollout(env=env, engine=engine, renderer=ChatRenderer(tokenizer), sampling=sampling,
                      budgets=Budgets(max_turns=max_turns, max_completion_tokens=2048,
                                      context_window=engine.context_window))
    async with SandboxPool(backend="local", spec=SandboxSpec(default_timeout_s=10), warm=1,
                           max_sandboxes=max_trajectories, run_id=uuid.uuid4().hex[:8]) as pool:
        sched = Scheduler(rollout, pool, SchedulerConfig(group_size=group_size, max_trajectories=max_trajectories,
                                                         infra_retries=infra_retries))
        return [t for group in [g async for g in sched.run(tasks)] for t in group]


def code_tasks(n: int) -> list[Any]:
    from agentrl.envs import get_env

    return list(get_env("code_tests", source="easy").tasks())[:n]
