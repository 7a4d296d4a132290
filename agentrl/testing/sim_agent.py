"""A simulated in-sandbox agent: one process that answers the agent's HTTP protocol for thousands of simulated pods.

A test utility for the Kubernetes scale harness (benchmarks/bench_k8s_scale.py), where sandbox pods run on kubemark
hollow nodes: their containers are fakes, so no real agent listens in them. Every hollow pod reports this server's
address as its pod IP, so the kubelet's TCP readiness probe and agentrl's own client (`sandbox/client.py`: keep-alive
HTTP, the same requests as against a real agent) reach it. Only the agent's side is simulated:

    GET  /health     the real agent's fields (uid and resources separated, seccomp notify)
    POST /exec       `echo WORDS` prints WORDS; any command takes the agent's own latency (lognormal, median
                     `agent_p50_ms`, p99 `agent_p99_ms`: the real agent's round trip measured on the dev cluster)
                     plus the command's run time (lognormal, median `command_p50_s`, sigma 1.5: "tens of seconds" at
                     p99, the seed workload's tool calls)
    POST /kill_all   {killed: 0}
    PUT/GET /file    accepted and dropped / an empty file

The bearer token is not checked (the server does not hold the pods' key). Counters (requests by route, connections)
are printed as one JSON line on SIGTERM/SIGINT and on `GET /stats`.

    python -m agentrl.testing.sim_agent --host 127.0.0.1 --port 18765 [--agent-p50-ms 2.5 --agent-p99-ms 8]
        [--command-p50-s 0.05] [--seed 0]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import resource
import signal
from collections import Counter
from typing import Any

from agentrl.sandbox.agent.protocol import EXEC, FILE, FILE_DONE, HEALTH, KILL_ALL, VERSION

COMMAND_SIGMA = 1.5  # p99 / p50 ~ 33, as agentrl.testing.simulated


class SimAgent:
    def __init__(self, *, agent_p50_ms: float, agent_p99_ms: float, command_p50_s: float, seed: int = 0) -> None:
        self.agent_p50_s = agent_p50_ms / 1000
        # lognormal: p99 = p50 * exp(2.326 sigma)
        self.agent_sigma = math.log(max(agent_p99_ms, agent_p50_ms * 1.0001) / agent_p50_ms) / 2.326
        self.command_p50_s = command_p50_s
        self.rng = random.Random(seed)
        self.counts: Counter[str] = Counter()

    def _agent_s(self) -> float:
        return self.agent_p50_s * math.exp(self.rng.gauss(0.0, self.agent_sigma))

    def _command_s(self) -> float:
        return self.command_p50_s * math.exp(self.rng.gauss(0.0, COMMAND_SIGMA)) if self.command_p50_s > 0 else 0.0

    async def answer(self, method: str, path: str, body: bytes) -> tuple[int, bytes, str]:
        route = path.split("?", 1)[0]
        self.counts[f"{method} {route}"] += 1
        if route == "/stats":
            return 200, json.dumps(self.stats()).encode(), "application/json"
        await asyncio.sleep(self._agent_s())
        if method == "GET" and route == HEALTH:
            obj: dict[str, Any] = {"ok": True, "pid": 1, "version": VERSION, "workspace": "/workspace",
                                   "writable": ["/workspace", "/tmp"], "uid_separated": True, "command_uid": 1000,
                                   "resources_separated": True, "commands_apart": True, "judge_python": None,
                                   "seccomp": "notify"}
        elif method == "POST" and route == EXEC:
            req = json.loads(body or b"{}")
            cmd = req.get("cmd")
            cmd = " ".join(cmd) if isinstance(cmd, list) else str(cmd)
            run_s = self._command_s()
            timeout = float(req.get("timeout") or 30)
            if run_s > timeout:
                await asyncio.sleep(timeout)
                obj = {"exit_code": None, "stdout": "", "stderr": "", "timed_out": True, "truncated": False,
                       "duration_s": timeout, "probes": {}, "resources": {}}
            else:
                await asyncio.sleep(run_s)
                out = cmd[5:] + "\n" if cmd.startswith("echo ") else ""
                obj = {"exit_code": 0, "stdout": out, "stderr": "", "timed_out": False, "truncated": False,
                       "duration_s": run_s, "probes": {}, "resources": {}}
        elif method == "POST" and route == KILL_ALL:
            obj = {"killed": 0, "probes": {}}
        elif method == "PUT" and route == FILE:
            obj = {"ok": True, "bytes": len(body)}
        elif method == "GET" and route == FILE:
            return 200, FILE_DONE, "application/octet-stream"
        else:
            return 404, json.dumps({"error": f"no route {method} {route}", "kind": "no_route"}).encode(), \
                "application/json"
        return 200, json.dumps(obj).encode(), "application/json"

    def stats(self) -> dict[str, Any]:
        return {**self.counts, "open_fds": len(os.listdir("/proc/self/fd"))}


class Connection(asyncio.Protocol):
    """One client connection, as a protocol (no task, no stream objects): a TCP readiness probe (connect, close)
    costs an accept and a close; a request gets a task only while it is answered. Requests on one connection are
    answered in order, one at a time (as the real agent's keep-alive connections)."""

    def __init__(self, agent: SimAgent) -> None:
        self.agent = agent
        self.buf = bytearray()
        self.busy = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.agent.counts["connections"] += 1

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self._next()

    def _next(self) -> None:
        end = self.buf.find(b"\r\n\r\n")
        if self.busy or end < 0 or self.transport is None:
            return
        lines = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        if len(self.buf) < end + 4 + length:
            return
        body = bytes(self.buf[end + 4:end + 4 + length])
        del self.buf[:end + 4 + length]
        method, path, _ = lines[0].split(" ", 2)
        self.busy = True
        asyncio.get_running_loop().create_task(self._answer(method, path, body))

    async def _answer(self, method: str, path: str, body: bytes) -> None:
        status, payload, ctype = await self.agent.answer(method, path, body)
        if self.transport is None:
            return
        self.transport.write(f"HTTP/1.1 {status} X\r\nContent-Type: {ctype}\r\nContent-Length: {len(payload)}\r\n"
                             f"\r\n".encode() + payload)
        self.busy = False
        self._next()

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


async def serve(host: str, port: int, agent: SimAgent) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Connection(agent), host, port, backlog=4096, reuse_address=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"sim-agent listening on {host}:{port}", flush=True)
    async with server:
        await stop.wait()
    print(json.dumps(agent.stats()), flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m agentrl.testing.sim_agent", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=18765)
    p.add_argument("--agent-p50-ms", type=float, default=2.5)
    p.add_argument("--agent-p99-ms", type=float, default=8.0)
    p.add_argument("--command-p50-s", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # one connection per probe and per client
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    agent = SimAgent(agent_p50_ms=a.agent_p50_ms, agent_p99_ms=a.agent_p99_ms, command_p50_s=a.command_p50_s,
                     seed=a.seed)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(a.host, a.port, agent))


if __name__ == "__main__":
    main()
