"""A reference reward-model service (`agentrl reward serve`): the `http` source's protocol with a deterministic
scorer, for tests, demos and as a template for a real one. Not a reward model.

    POST /score   body: RewardRequest (validated strictly: an unknown or missing field is HTTP 422)
                  answer: {"reward": r}, r = tests fraction / (1 + len(completion_text) / 1000), 0 without tests
    GET  /health  {"ok": true, "requests": N}

`fail_first` answers the first N scoring requests with HTTP 503 (to exercise the client's retries); `garbage`
answers every one with a body that is not a reward (to exercise its error path).
"""

from __future__ import annotations

import asyncio
import json
import logging

from aiohttp import web
from pydantic import ValidationError

from agentrl.reward.http import RewardRequest

log = logging.getLogger("agentrl.reward")


def reference_reward(req: RewardRequest) -> float:
    """The stand-in's deterministic score: correct and short is best."""
    if req.tests is None or req.tests.total == 0:
        return 0.0
    return (req.tests.passed / req.tests.total) / (1.0 + len(req.completion_text) / 1000.0)


class RewardServer:
    """The stand-in as an aiohttp app; `requests` keeps every validated request (tests read it in-process)."""

    def __init__(self, *, fail_first: int = 0, garbage: bool = False) -> None:
        self.fail_first = fail_first
        self.garbage = garbage
        self.requests: list[RewardRequest] = []
        self.received = 0
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/score", self._score)
        app.router.add_get("/health", self._health)
        return app

    async def _score(self, request: web.Request) -> web.Response:
        self.received += 1
        if self.received <= self.fail_first:
            return web.json_response({"error": "warming up"}, status=503)
        try:
            req = RewardRequest.model_validate_json(await request.read())
        except ValidationError as exc:
            return web.json_response({"error": json.loads(exc.json(include_url=False))}, status=422)
        self.requests.append(req)
        if self.garbage:
            return web.Response(text="<html>not a reward</html>", content_type="text/html")
        return web.json_response({"reward": reference_reward(req)})

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "requests": self.received})

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen; returns the scoring URL (the real port when `port` is 0)."""
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        bound = self._runner.addresses[0][1]
        return f"http://{host}:{bound}/score"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


async def serve(host: str, port: int, *, fail_first: int = 0, garbage: bool = False) -> int:
    """Run until cancelled; prints the scoring URL first (flushed) so callers can wait for it."""
    server = RewardServer(fail_first=fail_first, garbage=garbage)
    url = await server.start(host, port)
    print(f"agentrl reward serve: listening on {url}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await server.stop()
    return 0
