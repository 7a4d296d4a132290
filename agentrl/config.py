"""Configuration: one pydantic model per component, composed into `RolloutConfig`. YAML file + CLI overrides.

Every model forbids unknown keys; a validation error is turned into a `ConfigError` that names the field, the
file it came from, and what is expected. Configs are frozen after validation (never mutated).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agentrl.errors import ConfigError
from agentrl.reward.spec import DEFAULT_REWARD, RewardSpec, check_reward_list
from agentrl.sandbox.base import SandboxSpec
from agentrl.sandbox.kubernetes import KubernetesSandboxConfig  # the model only: no kubernetes client import
from agentrl.types import SamplingParams


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _with_default_type(value: Any) -> Any:
    """A backend given as a mapping without `type` means the default (local) backend."""
    if isinstance(value, dict) and "type" not in value:
        return {"type": "local", **value}
    return value


class LocalEngineConfig(_Config):
    type: Literal["local"] = "local"
    model: str | None = None  # None: the embedded SmolLM2-135M-Instruct
    max_batch_size: int = Field(default=16, ge=1)
    dtype: Literal["float32", "bfloat16"] = "float32"


class SGLangEngineConfig(_Config):
    """SGLang server(s) over HTTP (`agentrl.engine.sglang`). Either `urls` (workers; agentrl routes each trajectory
    to one of them, sticky) or `router_url` (sglang-router --policy manual routes by X-SMG-Routing-Key; `urls`, if
    also set, are then the workers that control calls go to, else they are read from the router's GET /workers)."""

    type: Literal["sglang"] = "sglang"
    urls: list[str] = Field(default_factory=list)
    router_url: str | None = None
    model: str | None = None  # local copy of the served checkpoint (tokenizer); None: /model_info's tokenizer_path
    context_window: int | None = Field(default=None, ge=64)  # None: the servers' context_length / the model config
    max_connections: int = Field(default=256, ge=1)  # client connection pool (total and per worker)
    request_timeout_s: float = Field(default=600.0, gt=0)  # one /generate, whole answer
    connect_timeout_s: float = Field(default=10.0, gt=0)
    control_timeout_s: float = Field(default=600.0, gt=0)  # weight updates, pause/continue, model_info
    retries: int = Field(default=3, ge=0)  # re-submissions after a transient failure or an aborted generation
    retry_backoff_s: float = Field(default=0.5, ge=0)
    weight_update: Literal["pause", "abort_all"] = "pause"
    max_sessions: int = Field(default=100_000, ge=1)  # sticky session pins kept (LRU)

    @model_validator(mode="after")
    def _targets(self) -> SGLangEngineConfig:
        if not self.urls and not self.router_url:
            raise ValueError("set urls (worker URLs, --engine-url) or router_url (--router-url)")
        for url in [*self.urls, *([self.router_url] if self.router_url else [])]:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{url!r} is not an http(s) URL, e.g. http://127.0.0.1:30000")
        return self


class VLLMEngineConfig(_Config):
    """vLLM server(s) over HTTP (`agentrl.engine.vllm`; `vllm serve`, VLLM_SERVER_DEV_MODE=1 for weight sync).
    agentrl routes each trajectory to one of `urls`, sticky, so its later turns reuse that server's prefix cache."""

    type: Literal["vllm"] = "vllm"
    urls: list[str] = Field(min_length=1)
    model: str | None = None  # local copy of the served checkpoint (tokenizer); None: /v1/models' root
    context_window: int | None = Field(default=None, ge=64)  # None: the servers' max_model_len / the model config
    max_connections: int = Field(default=256, ge=1)
    request_timeout_s: float = Field(default=600.0, gt=0)  # one /v1/completions, whole answer
    connect_timeout_s: float = Field(default=10.0, gt=0)
    control_timeout_s: float = Field(default=600.0, gt=0)  # reload_weights, pause/resume, metadata
    retries: int = Field(default=3, ge=0)  # re-submissions after a transient failure or an aborted generation
    retry_backoff_s: float = Field(default=0.5, ge=0)
    pause_mode: Literal["abort", "wait"] = "abort"  # /pause mode during a weight update
    max_sessions: int = Field(default=100_000, ge=1)  # sticky session pins kept (LRU)

    @field_validator("urls")
    @classmethod
    def _http(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{url!r} is not an http(s) URL, e.g. http://127.0.0.1:8000")
        return urls


EngineConfig = Annotated[LocalEngineConfig | SGLangEngineConfig | VLLMEngineConfig, Field(discriminator="type")]


class LocalSandboxConfig(_Config):
    type: Literal["local"] = "local"
    unsafe_no_isolation: bool = False  # run without bubblewrap: only for machines that cannot install it


class DockerSandboxConfig(_Config):
    type: Literal["docker"] = "docker"
    docker_host: str | None = None  # default: the environment's DOCKER_HOST / the local socket
    # how the agent's memory / pids / CPU are kept from the commands' (docs/reward-integrity.md): host cgroups where
    # the engine allows them (cgroup v1, cgroupfs driver), else the agent in a container of its own ("auto")
    separation: Literal["auto", "cgroups", "containers", "off"] = "auto"


SandboxBackendConfig = Annotated[LocalSandboxConfig | DockerSandboxConfig | KubernetesSandboxConfig,
                                 Field(discriminator="type")]


class SandboxConfig(_Config):
    backend: SandboxBackendConfig = Field(default_factory=LocalSandboxConfig)
    spec: SandboxSpec = Field(default_factory=SandboxSpec)
    warm: int = Field(default=4, ge=0)
    max_sandboxes: int = Field(default=16, ge=1)
    max_starting: int | None = Field(default=8, ge=1)  # sandboxes being created at once
    create_rate: float | None = Field(default=20.0, gt=0)  # creations per second (None: unlimited)
    cold_start_grace_s: float = Field(default=0.3, ge=0)  # wait this long for a warm one before a cold start

    _default_type = field_validator("backend", mode="before")(lambda v: _with_default_type(v))


class BudgetConfig(_Config):
    max_turns: int = Field(default=4, ge=1)
    max_completion_tokens: int = Field(default=2048, ge=16)
    context_window: int | None = Field(default=None, ge=64)  # None: the engine's
    tool_timeout_s: float = Field(default=120.0, gt=0)  # one tool call (env.call_tool); checked against the env
    trajectory_timeout_s: float = Field(default=3600.0, gt=0)  # wall clock, including waiting for the engine
    finalize_timeout_s: float = Field(default=300.0, gt=0)  # grading; expiry is the policy's (policy_error)
    lease_timeout_s: float = Field(default=900.0, gt=0)  # waiting for a sandbox; expiry is infra_error
    setup_timeout_s: float = Field(default=120.0, gt=0)  # env.setup; expiry is infra_error
    teardown_timeout_s: float = Field(default=60.0, gt=0)  # returning the lease; never changes a verdict

    def episode_s(self) -> float:
        """The longest one episode may hold a sandbox: its stage deadlines end it within this."""
        return (self.lease_timeout_s + self.setup_timeout_s + self.trajectory_timeout_s + self.finalize_timeout_s
                + self.teardown_timeout_s)


def check_ttl_covers_budgets(budgets: BudgetConfig, sandbox: SandboxConfig) -> None:
    """Refuse a sandbox TTL shorter than one episode's budgets: the TTL would end legitimate long episodes (and a
    TTL kill is charged to the system only when the budgets allowed the episode to still be running)."""
    need = budgets.episode_s()
    if sandbox.spec.ttl_s < need:
        raise ConfigError(
            f"sandbox.spec.ttl_s={sandbox.spec.ttl_s}s is shorter than one episode's budgets: budgets.lease_timeout_s "
            f"+ setup_timeout_s + trajectory_timeout_s + finalize_timeout_s + teardown_timeout_s = {need:g}s; raise "
            f"sandbox.spec.ttl_s to at least {math.ceil(need)} or lower those budgets")


# `reward:` = weighted sources (agentrl.reward.spec for the accepted forms); default: unit_tests at weight 1
RewardList = Annotated[list[RewardSpec], AfterValidator(check_reward_list)]


def default_reward() -> list[RewardSpec]:
    return list(DEFAULT_REWARD)


class RolloutConfig(_Config):
    env: str = "code_tests"
    env_options: dict[str, Any] = Field(default_factory=dict)
    tasks: int | None = Field(default=None, ge=1)  # the first N tasks of the env
    task_ids: list[str] = Field(default_factory=list)
    group_size: int = Field(default=4, ge=1)
    out: Path = Path("trajectories.jsonl")
    resume: bool = False
    seed: int = 0
    deterministic: bool = False  # same seed/config/model/tasks -> identical trajectories (docs/determinism.md)
    summary_json: Path | None = None
    max_trajectories: int = Field(default=16, ge=1)  # trajectories in flight (each holds a sandbox)
    infra_retries: int = Field(default=2, ge=0)
    max_unscored_frac: float = Field(default=0.10, ge=0.0, le=1.0)  # more infra_error than this stops the run
    unscored_min_trajectories: int = Field(default=20, ge=1)  # ... once this many trajectories are in
    # per-turn template drift check (monitoring only): inline = on the event loop every turn (default: its gain at
    # 2,000 in flight was within this machine's noise, BENCHMARKS.md); deferred = after the last turn, in a worker
    # process, same answers; off = none (the turns' drift flags stay null)
    drift_check: Literal["deferred", "inline", "off"] = "inline"
    # once start-up is over: freeze the start-up objects out of the collector's scans and collect young objects
    # less often (agentrl/cli/gc_policy.py; the largest event-loop cost at 2,000 in flight); never changes results
    gc_tune: bool = True
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    budgets: BudgetConfig = Field(default_factory=BudgetConfig)
    engine: EngineConfig = Field(default_factory=LocalEngineConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    reward: RewardList = Field(default_factory=default_reward)

    _default_type = field_validator("engine", mode="before")(lambda v: _with_default_type(v))


def _format_error(exc: ValidationError, source: str) -> str:
    lines = [f"invalid configuration ({source}):"]
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "<root>"
        if err["type"] == "extra_forbidden":
            lines.append(f"  field '{loc}': unknown key; remove it or fix its spelling")
        else:
            lines.append(f"  field '{loc}': {err['msg']} (got {err.get('input')!r})")
    return "\n".join(lines)


def _deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def read_yaml(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r}: the top level must be a mapping of field: value")
    return data


def load_config(model: type[_Config], path: Path | None = None,
                overrides: dict[str, Any] | None = None) -> Any:
    """Validate YAML (if given) merged with overrides (CLI flags win) into `model`."""
    data = read_yaml(path) if path is not None else {}
    data = _deep_merge(data, overrides or {})
    source = f"file {str(path)!r} + command line" if path is not None else "command line"
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_error(exc, source)) from None
