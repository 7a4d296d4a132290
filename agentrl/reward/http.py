"""The `http` source: one POST per trajectory to an external reward-model service; protocol in docs/rewards.md.

Request (`RewardRequest`, JSON): built only from the stored trajectory's fields, never from model text, so the
policy cannot add or change a field: whatever it wrote is the *content* of a message / `completion_text`, JSON-encoded.
Response: `{"reward": <finite number>}` (other keys ignored).

Failures retry the scoring only, never the episode:
- connection errors, timeouts, HTTP 429 and 5xx are retried `retries` times with exponential backoff
  (`backoff_s * 2**k`); then, as for a 200 that is not `{"reward": <finite number>}`, `value` raises
  `RewardServiceError` (an `InfraError`): the trajectory is left unscored (`infra_error`, `reward_failed`).
- 400, 413 and 422 are about the trajectory's content when the service accepts other requests: `ContentRejected`,
  this component is 0 with the service's reason. Until the service has accepted a request, such a rejection is
  checked with a canary (the same request without anything the policy wrote); a canary rejected too, or any other
  4xx (401, 403, 404, ...), is a configuration error (`ConfigError`) that stops the run.

Limits: at most `max_concurrency` requests in flight (the connection pool is sized to match) and, if set, at most
`max_rate_per_s` requests started per second (aiolimiter). The HTTP session is created lazily on the event loop
that scores (the trainer scores on its background loop) and closed by `aclose`.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any, Literal

import aiohttp
from aiolimiter import AsyncLimiter
from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentrl.errors import ConfigError, InfraError
from agentrl.reward.base import ContentRejected, RewardSource, SourceOptions
from agentrl.reward.registry import register_reward
from agentrl.types import Trajectory

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
CONTENT_STATUSES = frozenset({400, 413, 422})  # may be about the trajectory's content (see the module docstring)
MAX_ERROR_BODY = 300


class RewardServiceError(InfraError):
    """The reward-model service could not be reached or answered something that is not a reward."""


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant", "tool"]
    content: str


class TestsReport(BaseModel):
    model_config = ConfigDict(extra="forbid")
    passed: int
    total: int
    error: str | None = None
    outcomes: list[dict[str, Any]] = Field(default_factory=list)  # [{"name", "passed", "message"}]


class RewardRequest(BaseModel):
    """The one JSON object POSTed per trajectory (the protocol; the reference server validates against it)."""

    model_config = ConfigDict(extra="forbid")
    protocol: Literal["agentrl.reward.v1"] = "agentrl.reward.v1"
    trajectory_id: str
    task_id: str
    env: str
    group_id: str
    sample_index: int
    step: int | None
    status: str
    messages: list[ChatMessage]  # task prompt, then per turn: assistant text, the env's observation ("tool")
    completion_text: str  # the model's text of every turn, in order, separated by blank lines
    tests: TestsReport | None  # the env's hidden-test report
    model_tokens: int
    num_turns: int


class HttpOptions(SourceOptions):
    url: str
    timeout_s: float = Field(default=30.0, gt=0)
    retries: int = Field(default=3, ge=0)
    backoff_s: float = Field(default=0.5, ge=0)
    max_concurrency: int = Field(default=16, ge=1)
    max_rate_per_s: float | None = Field(default=None, gt=0)

    @field_validator("url")
    @classmethod
    def _http(cls, url: str) -> str:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"{url!r} is not an http(s) URL, e.g. http://127.0.0.1:8088/score")
        return url


def build_request(traj: Trajectory, prompt: list[ChatMessage]) -> RewardRequest:
    """The request for `traj`: every field comes from the stored record (see the module docstring)."""
    messages = list(prompt)
    for turn in traj.turns:
        messages.append(ChatMessage(role="assistant", content=turn.text))
        if turn.observation:
            messages.append(ChatMessage(role="tool", content=turn.observation))
    tests = None
    if traj.tests is not None:
        tests = TestsReport(passed=traj.tests.passed, total=traj.tests.total, error=traj.tests.error,
                            outcomes=[o.model_dump() for o in traj.tests.outcomes])
    return RewardRequest(
        trajectory_id=traj.id, task_id=traj.task_id, env=traj.env, group_id=traj.group_id,
        sample_index=traj.sample_index, step=traj.step, status=traj.status.value, messages=messages,
        completion_text="\n\n".join(turn.text for turn in traj.turns), tests=tests,
        model_tokens=traj.num_model_tokens, num_turns=len(traj.turns))


def parse_reward(body: bytes, url: str) -> float:
    """The reward in a 200 answer; anything else is a `RewardServiceError` naming what came back."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise RewardServiceError(f"reward service {url} answered non-JSON: {body[:MAX_ERROR_BODY]!r}; "
                                 f'expected {{"reward": <number>}}') from None
    value = data.get("reward") if isinstance(data, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RewardServiceError(f"reward service {url} answered {str(data)[:MAX_ERROR_BODY]}; expected "
                                 f'{{"reward": <finite number>}}')
    return float(value)


@register_reward("http")
class HttpReward(RewardSource):
    """A reward-model service over HTTP: POST one JSON object per trajectory, read {"reward": float}."""

    Options = HttpOptions

    def __init__(self, options: SourceOptions, **kwargs: Any) -> None:
        super().__init__(options, **kwargs)
        self.opts: HttpOptions = options  # type: ignore[assignment]  # built from cls.Options
        self._session: aiohttp.ClientSession | None = None
        self._slots = asyncio.Semaphore(self.opts.max_concurrency)  # binds to a loop on first contended use
        self._limiter = AsyncLimiter(self.opts.max_rate_per_s, 1.0) if self.opts.max_rate_per_s else None
        self._accepts = False  # the service answered 200 at least once: a 400/413/422 is then about the content
        self._canary_lock = asyncio.Lock()

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            o = self.opts
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=o.max_concurrency, limit_per_host=o.max_concurrency),
                timeout=aiohttp.ClientTimeout(total=o.timeout_s))
        return self._session

    def payload(self, traj: Trajectory) -> dict[str, Any]:
        prompt = self.prompt_messages(traj) if self.prompt_messages is not None else []
        chat = [ChatMessage(role=m.role, content=m.content) for m in prompt]
        return build_request(traj, chat).model_dump(mode="json")

    async def value(self, traj: Trajectory) -> float | None:
        status, answer = await self._send(self.payload(traj), traj.id)
        if status == 200:
            self._accepts = True
            return parse_reward(answer, self.opts.url)
        last = f"HTTP {status}: {answer[:MAX_ERROR_BODY]!r}"
        if status not in CONTENT_STATUSES:
            raise ConfigError(f"reward service {self.opts.url} refused trajectory {traj.id} ({last}): that is not "
                              "about the trajectory's content; fix reward http.url or the service's configuration")
        if not self._accepts:
            await self._canary(traj, last)
        raise ContentRejected(f"reward service rejected the trajectory's content ({last})")

    async def _canary(self, traj: Trajectory, rejected: str) -> None:
        """Whether the service accepts anything: the same request with nothing the policy wrote (no turns, no test
        report). Accepted: the rejection was about the content. Rejected too: a configuration error."""
        async with self._canary_lock:
            if self._accepts:
                return
            probe = traj.model_copy(update={"turns": [], "tests": None, "completion_ids": [], "logprobs": [],
                                            "env_mask": []})
            status, answer = await self._send(self.payload(probe), f"{traj.id} (canary)")
            if status != 200:
                raise ConfigError(
                    f"reward service {self.opts.url} rejects every request: trajectory {traj.id} ({rejected}) and the "
                    f"same request without the policy's text (HTTP {status}: {answer[:MAX_ERROR_BODY]!r}); check "
                    "reward http.url and that the service speaks the agentrl.reward.v1 protocol (docs/rewards.md)")
            self._accepts = True

    async def _send(self, body: dict[str, Any], what: str) -> tuple[int, bytes]:
        """POST `body`, retrying connection errors, timeouts, 429 and 5xx; the first other answer (status, body)."""
        session = self._client()
        last = ""
        for attempt in range(self.opts.retries + 1):
            if attempt:
                await asyncio.sleep(self.opts.backoff_s * 2 ** (attempt - 1))
            try:
                status, answer = await self._post(session, body)
            except (aiohttp.ClientError, TimeoutError) as exc:
                last = f"{type(exc).__name__}: {exc}"
                continue
            if status not in RETRY_STATUSES:
                return status, answer
            last = f"HTTP {status}: {answer[:MAX_ERROR_BODY]!r}"
        raise RewardServiceError(f"reward service {self.opts.url} failed {self.opts.retries + 1} times for trajectory "
                                 f"{what} (last: {last}); start it or fix reward http.url")

    async def _post(self, session: aiohttp.ClientSession, body: dict[str, Any]) -> tuple[int, bytes]:
        async with self._slots:
            if self._limiter is not None:
                await self._limiter.acquire()
            async with session.post(self.opts.url, json=body) as resp:
                return resp.status, await resp.read()

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
