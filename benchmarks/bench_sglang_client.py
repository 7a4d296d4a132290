"""Client overhead of agentrl's `sglang` engine vs a bare aiohttp POST, at 256 concurrent /generate requests.

Both clients talk to the same stand-in SGLang server, started as its own process in `--echo` mode: it parses and
contract-checks every body like a real SGLang worker but answers one token without running a model, so what is
measured is the client (body building, rid, routing, JSON, parsing into a Generation) plus the shared HTTP/server
cost. The bare client posts the identical body (fresh rid, same headers) with `json=` and reads `resp.json()` through
an aiohttp session with the same connection limit. Rounds alternate between the clients; each round sends
`--requests` requests with at most `--concurrency` in flight. Prints the median and best per-request wall time of
each client and their ratio (target: agentrl within 5% of bare). CPU numbers on a shared machine are noisy: the load
average is printed; compare the ratio, not the absolute times.

agentrl encodes/decodes JSON with orjson when it is installed (the bare client uses aiohttp's default, the standard
library); `--stdlib-json` makes agentrl use the standard library too, to compare the clients' own work like for like.

    python benchmarks/bench_sglang_client.py [--concurrency 256] [--requests 4096] [--rounds 8] [--prompt-tokens 512]
                                             [--stdlib-json]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import aiohttp

from agentrl.engine import http as engine_http
from agentrl.engine.sglang import ROUTING_HEADER, SGLangEngine
from agentrl.types import SamplingParams

SAMPLING = SamplingParams(temperature=0.0, max_new_tokens=1)


def start_server(port: int, model_dir: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "agentrl.cli", "engine", "serve", "--echo", "--model", str(model_dir), "--port",
           str(port), "--context-window", "32768"]
    log = tempfile.NamedTemporaryFile(prefix="agentrl-bench-standin-", suffix=".log", delete=False)  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)  # never a pipe: nobody drains it
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"stand-in exited, see {log.name}: {Path(log.name).read_text()[-2000:]}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/model_info", timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("stand-in did not start")


def echo_model_dir() -> Path:
    """--echo needs no weights, only a directory that looks like a checkpoint."""
    d = Path(tempfile.mkdtemp(prefix="agentrl-bench-echo-"))
    (d / "config.json").write_text('{"max_position_embeddings": 32768}')
    return d


async def bounded(n: int, concurrency: int, one: Any) -> tuple[float, float]:
    """Run `one(i)` for i < n with at most `concurrency` in flight: (wall seconds, this process's CPU seconds)."""
    sem = asyncio.Semaphore(concurrency)

    async def run(i: int) -> None:
        async with sem:
            await one(i)

    wall, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(run(i) for i in range(n)))
    return time.perf_counter() - wall, time.process_time() - cpu


async def agentrl_round(engine: SGLangEngine, prompt: list[int], n: int, concurrency: int) -> tuple[float, float]:
    async def one(i: int) -> None:
        gen = await engine.generate(prompt, SAMPLING, session_id=f"s{i % 1024}")
        assert len(gen.output_ids) == 1

    return await bounded(n, concurrency, one)


async def bare_round(session: aiohttp.ClientSession, url: str, body: dict[str, Any], n: int,
                     concurrency: int) -> tuple[float, float]:
    async def one(i: int) -> None:
        payload = {**body, "rid": uuid.uuid4().hex}
        async with session.post(f"{url}/generate", json=payload, headers={ROUTING_HEADER: f"s{i % 1024}"}) as r:
            data = await r.json()
        assert len(data["meta_info"]["output_token_logprobs"]) == 1

    return await bounded(n, concurrency, one)


async def main(a: argparse.Namespace) -> None:
    if a.stdlib_json:
        engine_http.orjson = None  # read at every call: agentrl's transport falls back to the json module
    port = a.port
    proc = start_server(port, echo_model_dir())
    url = f"http://127.0.0.1:{port}"
    prompt = [(7 * i) % 30000 + 1 for i in range(a.prompt_tokens)]
    engine = SGLangEngine(urls=[url], eos_token_ids=[2], context_window=32768, max_connections=a.concurrency)
    body = engine._body(prompt, SAMPLING, 1, "s0")
    connector = aiohttp.TCPConnector(limit=a.concurrency, limit_per_host=a.concurrency)
    times: dict[str, list[tuple[float, float]]] = {"agentrl": [], "bare": []}
    try:
        async with aiohttp.ClientSession(connector=connector) as session:
            await agentrl_round(engine, prompt, a.concurrency, a.concurrency)  # warm both pools
            await bare_round(session, url, body, a.concurrency, a.concurrency)
            for r in range(a.rounds):  # alternate which client goes first
                order = ("bare", "agentrl") if r % 2 == 0 else ("agentrl", "bare")
                for name in order:
                    if name == "bare":
                        times[name].append(await bare_round(session, url, body, a.requests, a.concurrency))
                    else:
                        times[name].append(await agentrl_round(engine, prompt, a.requests, a.concurrency))
    finally:
        await engine.close()
        proc.terminate()
        proc.wait()
    report(times, a)
    extra = await pure_overhead(prompt, a.pure_calls)
    print(f"pure client cost without HTTP (sequential, {a.pure_calls} calls): agentrl {extra:.2f} us/call more than "
          "building the bare body and reading a dict")


def report(times: dict[str, list[tuple[float, float]]], a: argparse.Namespace) -> None:
    wall = {k: [w / a.requests * 1e6 for w, _ in v] for k, v in times.items()}
    cpu = {k: [c / a.requests * 1e6 for _, c in v] for k, v in times.items()}
    codec = "json (stdlib)" if engine_http.orjson is None else "orjson"
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; {a.rounds} rounds x {a.requests} requests, "
          f"{a.concurrency} in flight, {a.prompt_tokens}-token prompts, stand-in --echo; agentrl JSON: {codec}\n")
    print("| client | wall us/request (median) | wall (best) | client CPU us/request (median) | CPU (best) |")
    print("| --- | --- | --- | --- | --- |")
    for name in ("bare", "agentrl"):
        print(f"| {name} | {statistics.median(wall[name]):.1f} | {min(wall[name]):.1f} | "
              f"{statistics.median(cpu[name]):.1f} | {min(cpu[name]):.1f} |")
    print()
    for label, d in (("wall", wall), ("client CPU", cpu)):
        paired = statistics.median(x / y for x, y in zip(d["agentrl"], d["bare"]))  # back-to-back rounds: drift cancels
        print(f"agentrl / bare, {label}: {paired:.3f} (median of paired rounds), "
              f"{min(d['agentrl']) / min(d['bare']):.3f} (best vs best)  [target <= 1.05]")


async def pure_overhead(prompt: list[int], n: int) -> float:
    """The engine's own work per call (body, rid, routing, parsing into a Generation) with the HTTP exchange replaced
    by returning a canned SGLang answer, minus the same for a bare client (body copy + rid + header dict)."""
    answer = {"text": "", "output_ids": [5], "meta_info": {
        "id": "x", "finish_reason": {"type": "length", "length": 1}, "prompt_tokens": len(prompt),
        "completion_tokens": 1, "cached_tokens": 0, "weight_version": "default",
        "output_token_logprobs": [[-0.5, 5, None]]}}

    async def canned(*args: Any, **kwargs: Any) -> Any:
        return answer

    engine = SGLangEngine(urls=["http://127.0.0.1:9"], eos_token_ids=[2], context_window=32768)
    engine._connected = True
    engine._transport.request = canned  # type: ignore[method-assign]
    body = engine._body(prompt, SAMPLING, 1, "s0")
    start = time.perf_counter()
    for i in range(n):
        await engine.generate(prompt, SAMPLING, session_id=f"s{i % 1024}")
    ours = time.perf_counter() - start
    start = time.perf_counter()
    for i in range(n):
        payload = {**body, "rid": uuid.uuid4().hex}
        data = await canned("POST", "u", body=payload, headers={ROUTING_HEADER: f"s{i % 1024}"})
        assert len(data["meta_info"]["output_token_logprobs"]) == 1
    bare = time.perf_counter() - start
    return (ours - bare) / n * 1e6


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--requests", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--port", type=int, default=31987)
    p.add_argument("--pure-calls", type=int, default=20000)
    p.add_argument("--stdlib-json", action="store_true", help="agentrl without orjson (like the bare client)")
    asyncio.run(main(p.parse_args()))
