"""The records passed between stages. Imports nothing of ours.

A `Trajectory` is the one record between rollout and everything downstream (store, reward, trainer, replay).
It is written as one JSON line and carries `schema_version`; readers refuse versions from the future and upgrade
older ones in memory (version 1 records had no `reward_components`: they read as `{}`).

Token layout of a trajectory (shapes are per trajectory, not batched):

    prompt_ids      [P]   the rendered system + user prompt, exactly what the engine saw first
    completion_ids  [C]   every token after the prompt: model turns and tool/env turns concatenated in order
    logprobs        [C]   engine's sampling logprob at model tokens, 0.0 at tool tokens
    env_mask        [C]   1 = model token (trained on), 0 = tool/env token (masked from the loss)

Turn i owns completion_ids[start : start + model_len] (model tokens) followed by
completion_ids[start + model_len : start + model_len + env_len] (its tool observation tokens, possibly 0).
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

SCHEMA_VERSION = 3  # 2: reward_components, error_kind; 3: integrity signals, tool-call test reports
# The deepest nesting of policy-produced data (a tool call's JSON) a record holds: the parsers refuse deeper calls
# as a format error, and the store writes anything deeper than this (plus the record's own levels) as a marker.
MAX_DATA_DEPTH = 512


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Status(str, Enum):
    """How a trajectory ended. Only `infra_error` is excluded from training; the rest are policy outcomes.

    `infra_error` is reserved for causes the system can prove are not the policy's (the backend could not create or
    lost the sandbox, the engine failed, our own code raised); `policy_error` is an episode the policy broke (its
    sandbox died during its command, the grader could not run on what it left behind): scored, usually 0, with the
    reason in `error` / `error_kind`."""

    ok = "ok"  # the model ended the episode itself (no further tool call / said done)
    max_turns = "max_turns"
    truncated = "truncated"  # per-trajectory completion-token budget or per-turn max_new_tokens hit
    context_exhausted = "context_exhausted"
    timeout = "timeout"  # per-trajectory wall-clock budget
    infra_error = "infra_error"  # sandbox died, engine unreachable: never scored, retried within a budget
    policy_error = "policy_error"  # the policy broke its episode (sandbox died in its command, ungradable state)


class Message(_Record):
    role: Literal["system", "user", "assistant", "tool"]
    content: str
    name: str | None = None
    tool_call_id: str | None = None


class ToolSpec(_Record):
    """A tool the model may call, described by a JSON schema of its arguments (OpenAI function style)."""

    name: str
    description: str
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})

    def to_openai(self) -> dict[str, Any]:
        return {"type": "function", "function": self.model_dump()}


class IntegritySignal(_Record):
    """One piece of evidence, observed by the sandbox, the runner or the env (never taken from the policy's own
    text), that the policy reached for what judges it. Detection only: a signal never changes a reward. The rules and
    the names live in `agentrl.runner.integrity`; docs/reward-integrity.md says what each observes and how it can
    miss."""

    name: str
    count: int = Field(default=1, ge=1)
    turn: int | None = None  # the turn where it was (first) seen; None: at grading, after the last turn
    detail: str = ""


class ToolCall(_Record):
    id: str
    name: str
    arguments: dict[str, Any]
    raw: str = ""  # the exact text span the call was parsed from


class ToolResult(_Record):
    """The outcome of one tool call. `error` is set for calls that never ran (parse error, unknown tool...)."""

    call_id: str
    name: str
    output: str  # what the model sees as the observation
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    duration_s: float = 0.0
    timed_out: bool = False
    truncated: bool = False
    error: str | None = None  # "parse_error" | "unknown_tool" | "bad_arguments" | "tool_failed" | None
    done: bool = False  # the env says the episode is over after this call
    tests: TestReport | None = None  # the (visible) tests the env ran for this call, as the grader reported them
    signals: list[IntegritySignal] = Field(default_factory=list)  # what the sandbox/env observed during this call


class SamplingParams(_Record):
    """One sampling config shared by rollout, evaluation and training. Mapped 1:1 to each backend's names.

    `top_k=0` means off (SGLang's -1). Logprobs are always returned under the temperature-scaled distribution
    before top-p/top-k filtering (SGLang's and TRL's convention), so they agree with the trainer's recomputation
    exactly when top_p=1 and top_k=0.
    """

    temperature: float = Field(default=0.7, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    max_new_tokens: int = Field(default=256, ge=1)
    stop_token_ids: list[int] = Field(default_factory=list)
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


class Generation(_Record):
    """What an engine returns for one generate call: exact ids and the logprob of each."""

    output_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length", "abort"]
    weight_version: int = 0
    cached_tokens: int = 0
    worker: str | None = None

    @model_validator(mode="after")
    def _lengths(self) -> Generation:
        if len(self.output_ids) != len(self.logprobs):
            raise ValueError(f"output_ids ({len(self.output_ids)}) and logprobs ({len(self.logprobs)}) differ")
        return self


class Turn(_Record):
    index: int
    start: int  # offset of this turn's first model token in completion_ids
    model_len: int
    env_len: int = 0
    text: str = ""  # decoded model tokens, for humans only; never re-tokenized
    finish_reason: str = "stop"
    weight_version: int = 0
    cached_tokens: int = 0
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_results: list[ToolResult] = Field(default_factory=list)
    parse_errors: list[str] = Field(default_factory=list)
    observation: str = ""  # the rendered tool/env text appended after this turn
    gen_duration_s: float = 0.0
    tool_duration_s: float = 0.0
    # drift flags (monitoring only), checked after each appended observation; None: not checked (drift_check off,
    # or the deferred check failed: see Trajectory.drift_check_error)
    prefix_drift: bool | None = False  # the chat template's rendering of the conversation (as text) != our decoded ids
    retokenize_mismatch: bool | None = False  # re-tokenizing the rendered conversation would NOT give our exact ids


class TestOutcome(_Record):
    name: str
    passed: bool
    message: str = ""


class TestReport(_Record):
    passed: int
    total: int
    outcomes: list[TestOutcome] = Field(default_factory=list)
    error: str | None = None  # the test harness itself failed to produce a report
    subject: str | None = None  # a digest of what was graded (e.g. the solution's sha256), to match reports
    signals: list[IntegritySignal] = Field(default_factory=list)  # what the grader observed (tampering, dropped files)

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0


class RewardResult(_Record):
    reward: float
    components: dict[str, float] = Field(default_factory=dict)


class Timing(_Record):
    total_s: float = 0.0
    setup_s: float = 0.0
    generation_s: float = 0.0
    tools_s: float = 0.0
    finalize_s: float = 0.0
    sandbox_wait_s: float = 0.0


class Trajectory(_Record):
    schema_version: int = SCHEMA_VERSION
    id: str
    group_id: str
    task_id: str
    env: str
    status: Status
    sample_index: int = 0
    attempt: int = 0
    step: int | None = None  # the training step whose batch holds this trajectory (rollouts: the rollout step)
    dispatch_version: int | None = None  # training: the weight version current when the group was started
    train_step: int | None = None  # training: the step that trained on it (staleness = train_step - dispatch_version)
    prompt_ids: list[int]
    completion_ids: list[int] = Field(default_factory=list)
    logprobs: list[float] = Field(default_factory=list)
    env_mask: list[int] = Field(default_factory=list)
    turns: list[Turn] = Field(default_factory=list)
    tests: TestReport | None = None
    reward: float | None = None  # None for infra_error: never a silent 0
    reward_components: dict[str, float] = Field(default_factory=dict)  # reward source -> its unweighted value
    error: str | None = None
    error_kind: str | None = None  # short machine-readable cause of infra_error / policy_error (see runner.attribution)
    solution: str | None = None
    drift_count: int = 0
    drift_check_error: str | None = None  # the deferred drift check failed: the turns' drift flags are None
    integrity: list[IntegritySignal] = Field(default_factory=list)  # agentrl.runner.integrity.observe()
    timing: Timing = Field(default_factory=Timing)
    meta: dict[str, Any] = Field(default_factory=dict)

    @field_validator("schema_version", mode="after")
    @classmethod
    def _upgrade(cls, version: int) -> int:
        """Older records are upgraded in memory (their missing fields take the defaults); newer ones are refused by
        the store before they get here."""
        return max(version, SCHEMA_VERSION)

    @model_validator(mode="after")
    def _invariants(self) -> Trajectory:
        n = len(self.completion_ids)
        if len(self.logprobs) != n or len(self.env_mask) != n:
            raise ValueError(
                f"trajectory {self.id}: completion_ids ({n}), logprobs ({len(self.logprobs)}) and "
                f"env_mask ({len(self.env_mask)}) must have equal length"
            )
        return self

    @property
    def num_model_tokens(self) -> int:
        return sum(self.env_mask)

    @property
    def num_tool_calls(self) -> int:
        return sum(len(t.tool_calls) for t in self.turns)

    @property
    def num_tool_errors(self) -> int:
        return sum(1 for t in self.turns for r in t.tool_results if r.error is not None) + sum(
            len(t.parse_errors) for t in self.turns
        )


ToolResult.model_rebuild()
