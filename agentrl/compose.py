"""The composition root: the one place that builds a run's parts from its config.

Owns: `build_run(cfg) -> RunParts` (env and tasks, engine + tokenizer, renderer, sampling, budgets, scheduler config,
sandbox spec and pool, scorer, deferred drift worker, the one `config_hash` and the run metadata), and every
construction of a `Rollout` or a `Scheduler` (`RunParts.rollout()`, `RunParts.scheduler()`); and
`build_rank_parts(cfg) -> RankParts`, the lighter parts of training ranks other than 0 (no engine, pool or
scorer). `agentrl rollout`, `train` and `eval` build their parts here; `envs check` and `replay` build their
sandbox pools here (`make_pool`). Does not own running anything: the CLI enters the pool and scorer and runs
the schedulers, and the trainer gets the built parts injected (it never builds them).

Import contracts (pyproject.toml): outside the runner only this module imports `agentrl.runner.rollout` and
`agentrl.runner.scheduler`, nothing but the runner and this module imports the runner's package face, and only
`agentrl.cli` imports this module.
"""

from __future__ import annotations

import dataclasses
import hashlib
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import agentrl
from agentrl.config import RolloutConfig, SGLangEngineConfig, VLLMEngineConfig, check_ttl_covers_budgets
from agentrl.envs import Env, Task, get_env, spec_for_env
from agentrl.errors import ConfigError
from agentrl.reward import RewardSpec, Scorer
from agentrl.runner.rollout import Budgets, Rollout
from agentrl.runner.scheduler import Scheduler, SchedulerConfig, check_time_needs
from agentrl.sandbox.base import SandboxSpec
from agentrl.trainer.config import TrainConfig
from agentrl.types import SamplingParams

# what was run, not where it was written nor how it was watched: outputs, resume, monitoring, the collector's schedule
HASH_EXCLUDES = frozenset({"out", "resume", "summary_json", "drift_check", "gc_tune"})


@dataclass
class RunParts:
    """Everything one run is built from. The pool and the scorer are async context managers their user enters (on the
    loop that runs the trajectories); `aclose()` closes the engine and the drift worker."""

    config: RolloutConfig  # the rollout view the parts were built from
    env: Env
    tasks: list[Task]
    engine: Any  # GenerationEngine
    tokenizer: Any  # from the checkpoint being run
    model_path: Path
    renderer: Any  # ChatRenderer over `tokenizer`
    sampling: SamplingParams  # stop ids default to the engine's end-of-turn ids, seed to the run's seed
    budgets: Budgets
    sched: SchedulerConfig
    spec: SandboxSpec
    pool: Any  # SandboxPool
    scorer: Scorer
    config_hash: str
    meta: dict[str, Any]  # stamped on every trajectory's meta
    drift: Any = None  # DeferredDrift for drift_check "deferred"

    def rollout(self, sampling: SamplingParams | None = None) -> Rollout:
        """The trajectory loop with the run's sampling (or `sampling`, e.g. greedy evaluation)."""
        return Rollout(env=self.env, engine=self.engine, renderer=self.renderer, sampling=sampling or self.sampling,
                       budgets=self.budgets, drift_check=self.config.drift_check, drift_worker=self.drift)

    def scheduler(self, *, sampling: SamplingParams | None = None, group_size: int | None = None,
                  namespace: str = "", meta: dict[str, Any] | None = None,
                  shares_slots_with: Scheduler | None = None) -> Scheduler:
        """A scheduler over the run's pool and scorer. `namespace` is appended to the run's (it separates the
        deterministic ids and seeds of e.g. evaluation modes); `shares_slots_with`: another scheduler whose
        `max_trajectories` slots this one shares, so that everything one job runs stays under one bound."""
        config = dataclasses.replace(self.sched, group_size=group_size or self.sched.group_size,
                                     namespace=self.sched.namespace + namespace)
        return Scheduler(self.rollout(sampling), self.pool, config, meta=self.meta if meta is None else meta,
                         scorer=self.scorer, slots=shares_slots_with.slots if shares_slots_with is not None else None)

    async def aclose(self) -> None:
        if self.drift is not None:
            await self.drift.aclose()
        await self.engine.close()


def rollout_view(cfg: RolloutConfig | TrainConfig) -> RolloutConfig:
    """The rollout config of a job (a training job's `rollout_config()`)."""
    return cfg.rollout_config() if isinstance(cfg, TrainConfig) else cfg


def config_hash(cfg: RolloutConfig | TrainConfig) -> str:
    """The one hash of a job: its rollout view (env, tasks, model, sampling, budgets, sandbox, reward, seed, ...)
    without outputs and monitoring. The same job hashes the same from `rollout`, `train` and `eval`; two runs of one
    config into two files hash the same. A training job's own knobs are in its output dir's config.json."""
    view = rollout_view(cfg)
    return hashlib.sha256(view.model_dump_json(exclude=set(HASH_EXCLUDES)).encode()).hexdigest()[:16]


def select_tasks(env: Env, n: int | None, ids: list[str]) -> list[Task]:
    tasks = list(env.tasks())
    if ids:
        by_id = {t.id: t for t in tasks}
        missing = [i for i in ids if i not in by_id]
        if missing:
            raise ConfigError(f"task_ids: {missing} not in env {env.name!r} (first ids: {list(by_id)[:5]})")
        tasks = [by_id[i] for i in ids]
    return tasks[:n] if n is not None else tasks


def run_env(cfg: RolloutConfig | TrainConfig) -> tuple[Env, list[Task]]:
    """The job's env and its selected tasks, refused up front when a deadline is shorter than the env needs or the
    sandbox TTL does not cover the budgets (no model, no sandbox). An env with a `prepare(say)` hook (repo_fix:
    sdists and test venvs) prepares what this machine lacks first, with progress; blocking: call it off the loop."""
    view = rollout_view(cfg)
    env = get_env(view.env, **view.env_options)
    check_time_needs(env, tool_timeout_s=view.budgets.tool_timeout_s,
                     finalize_timeout_s=view.budgets.finalize_timeout_s)
    check_ttl_covers_budgets(view.budgets, view.sandbox)
    prepare = getattr(env, "prepare", None)  # first use: fetch/build what the tasks need, saying what it does
    if callable(prepare):
        prepare(lambda msg: print(msg, file=sys.stderr, flush=True))
    return env, select_tasks(env, view.tasks, view.task_ids)


def build_run(cfg: RolloutConfig | TrainConfig, *, env: Env | None = None, tasks: list[Task] | None = None,
              model: Path | str | None = None, pool: Any = None) -> RunParts:
    """Build the parts of `cfg`'s run (blocking: loads the model; call it off the event loop).

    `env` / `tasks`: from `run_env` already (default: built here; `tasks` default to the job's selection).
    `model`: run this checkpoint instead of the job's (evaluation; the job's `config_hash` is kept).
    `pool`: share an existing sandbox pool (e.g. one evaluation of several checkpoints)."""
    view = rollout_view(cfg)
    if env is None:
        env, selected = run_env(view)
        tasks = selected if tasks is None else tasks
    elif tasks is None:
        tasks = select_tasks(env, view.tasks, view.task_ids)
    run_hash = config_hash(view)
    if model is not None:
        view = view.model_copy(update={"engine": view.engine.model_copy(update={"model": str(model)})})
    engine, tokenizer, model_path = make_engine_and_tokenizer(view)
    sampling = run_sampling(view, list(engine.eos_token_ids))
    budgets = Budgets(max_turns=view.budgets.max_turns, max_completion_tokens=view.budgets.max_completion_tokens,
                      context_window=view.budgets.context_window or engine.context_window,
                      tool_timeout_s=view.budgets.tool_timeout_s)
    spec = spec_for_env(view.sandbox.spec.model_copy(update={"default_timeout_s": view.budgets.tool_timeout_s}), env)
    renderer = make_renderer(tokenizer)
    meta = {"model": str(model_path), "engine": engine.info(), "sampling": sampling.model_dump(),
            "config_hash": run_hash, "seed": view.seed, "deterministic": view.deterministic,
            "agentrl_version": agentrl.__version__, "env_options": dict(view.env_options),
            "sandbox_spec": spec.model_dump()}
    return RunParts(
        config=view, env=env, tasks=list(tasks), engine=engine, tokenizer=tokenizer, model_path=model_path,
        renderer=renderer, sampling=sampling, budgets=budgets, sched=SchedulerConfig.from_config(view), spec=spec,
        pool=pool if pool is not None else pool_from_config(view, spec, uuid.uuid4().hex[:12], env),
        scorer=make_scorer(view.reward, env), config_hash=run_hash, meta=meta,
        drift=make_drift(view.drift_check, renderer))


@dataclass
class RankParts:
    """What a training rank other than 0 is built from (agentrl/trainer/dist.py): the env, its tasks, the tokenizer
    and the checkpoint. No engine, sandbox pool or scorer: rank 0 rolls out every rank's prompts. `sampling` is
    rank 0's, received when the job starts."""

    config: RolloutConfig
    env: Env
    tasks: list[Task]
    tokenizer: Any
    model_path: Path
    sampling: SamplingParams | None = None


def build_rank_parts(cfg: TrainConfig) -> RankParts:
    """The parts of a training rank other than 0 (blocking: loads the tokenizer). The checkpoint is the job's
    `model`; an HTTP engine's served checkpoint is not looked up here, so several ranks need `model` set."""
    from transformers import AutoTokenizer

    from agentrl.engine.models import resolve_model

    view = rollout_view(cfg)
    if view.engine.type != "local" and view.engine.model is None:
        raise ConfigError(f"training on several ranks with engine type {view.engine.type!r} needs `model`: a local "
                          "copy of the served checkpoint, which every rank loads")
    env, tasks = run_env(view)
    path = resolve_model(view.engine.model)
    return RankParts(config=view, env=env, tasks=tasks, tokenizer=AutoTokenizer.from_pretrained(path),
                     model_path=path)


def run_sampling(cfg: RolloutConfig, eos_token_ids: list[int]) -> SamplingParams:
    """The run's one SamplingParams: stop ids default to the engine's end-of-turn ids, seed to the run's seed."""
    return cfg.sampling.model_copy(update={
        "stop_token_ids": cfg.sampling.stop_token_ids or list(eos_token_ids),
        "seed": cfg.sampling.seed if cfg.sampling.seed is not None else cfg.seed})


# -- sandbox pools ------------------------------------------------------------------------------------------------

def make_pool(backend: str, spec: SandboxSpec, *, warm: int, max_sandboxes: int, run_id: str,
              unsafe_no_isolation: bool = False, backend_options: dict[str, Any] | None = None,
              **pool_options: Any) -> Any:
    from agentrl.sandbox import SandboxPool

    return SandboxPool(backend=backend, spec=spec, warm=warm, max_sandboxes=max_sandboxes, run_id=run_id,
                       unsafe_no_isolation=unsafe_no_isolation, backend_options=backend_options, **pool_options)


def env_backend_options(backend: str, env: Env | None) -> dict[str, Any]:
    """Backend options an env asks for: on the local backend, the host paths its sandboxes must see read-only
    (`env.ro_binds()`, e.g. repo_fix's per-package test venvs)."""
    ro_binds = getattr(env, "ro_binds", None)
    if backend == "local" and callable(ro_binds):
        return {"ro_binds": list(ro_binds())}
    return {}


def pool_from_config(cfg: RolloutConfig, spec: SandboxSpec, run_id: str, env: Env | None = None) -> Any:
    b, s = cfg.sandbox.backend, cfg.sandbox
    opts: dict[str, Any] = env_backend_options(b.type, env)
    if env is not None:
        spec = spec_for_env(spec, env)  # e.g. repo_fix's writable /repo, whatever the config's spec says
    if b.type == "docker" and b.docker_host:
        opts["docker_host"] = b.docker_host
    if b.type == "docker" and b.separation != "auto":
        opts["separation"] = b.separation
    if b.type == "kubernetes":
        opts["config"] = b
    return make_pool(b.type, spec, warm=s.warm, max_sandboxes=s.max_sandboxes, run_id=run_id,
                     unsafe_no_isolation=getattr(b, "unsafe_no_isolation", False), backend_options=opts,
                     max_starting=s.max_starting, create_rate=s.create_rate, cold_start_grace_s=s.cold_start_grace_s)


# -- engines, renderer, drift, scorer -----------------------------------------------------------------------------

def make_engine_and_tokenizer(cfg: RolloutConfig) -> tuple[Any, Any, Path]:
    import torch
    from transformers import AutoTokenizer

    if cfg.engine.type == "sglang":
        return make_sglang_engine_and_tokenizer(cfg)
    if cfg.engine.type == "vllm":
        return make_vllm_engine_and_tokenizer(cfg)

    from agentrl.engine.local import LocalEngine
    from agentrl.engine.models import resolve_model

    path = resolve_model(cfg.engine.model)
    tokenizer = AutoTokenizer.from_pretrained(path)  # always from the checkpoint being run
    dtype = torch.float32 if cfg.engine.dtype == "float32" else torch.bfloat16
    engine = LocalEngine(path, max_batch_size=cfg.engine.max_batch_size, dtype=dtype, seed=cfg.seed,
                         deterministic=cfg.deterministic)
    return engine, tokenizer, path


def make_sglang_engine_and_tokenizer(cfg: RolloutConfig) -> tuple[Any, Any, Path]:
    """SGLang engine; the tokenizer comes from engine.model (a local copy of the served checkpoint) or, if unset,
    from the tokenizer_path the server reports (/model_info), which must then be readable here too. Start-up only:
    the one metadata request is blocking (like loading a local model)."""
    from transformers import AutoTokenizer

    from agentrl.engine.models import resolve_model
    from agentrl.engine.sglang import SGLangEngine, read_tokenizer_path

    e = cfg.engine
    assert isinstance(e, SGLangEngineConfig)  # the caller dispatches on engine.type
    if e.model is not None:
        path = resolve_model(e.model)
    else:
        served = read_tokenizer_path(e.router_url or e.urls[0], via_router=e.router_url is not None)
        if not Path(served).is_dir():
            raise ConfigError(f"the SGLang server's tokenizer_path {served!r} is not a directory on this machine: "
                              "pass --model with a local copy of the served checkpoint (engine.model)")
        path = Path(served)
    tokenizer = AutoTokenizer.from_pretrained(path)
    engine = SGLangEngine(router_url=e.router_url, weight_update=e.weight_update, deterministic=cfg.deterministic,
                          **_http_engine_kwargs(e, path))
    return engine, tokenizer, path


def _http_engine_kwargs(e: Any, path: Path) -> dict[str, Any]:
    """What every HTTP engine takes from `engine:` and the local copy of the served checkpoint."""
    from agentrl.engine.sglang import checkpoint_facts

    eos, window = checkpoint_facts(path)
    return dict(urls=e.urls, eos_token_ids=eos, context_window=e.context_window or window, model_path=str(path),
                max_connections=e.max_connections, request_timeout_s=e.request_timeout_s,
                connect_timeout_s=e.connect_timeout_s, control_timeout_s=e.control_timeout_s, retries=e.retries,
                retry_backoff_s=e.retry_backoff_s, max_sessions=e.max_sessions)


def make_vllm_engine_and_tokenizer(cfg: RolloutConfig) -> tuple[Any, Any, Path]:
    """vLLM engine; the tokenizer comes from engine.model (a local copy of the served checkpoint) or, if unset, from
    the `root` path GET /v1/models reports, which must then be readable here too. Start-up only (blocking)."""
    from transformers import AutoTokenizer

    from agentrl.engine.models import resolve_model
    from agentrl.engine.vllm import VLLMEngine, read_served_model

    e = cfg.engine
    assert isinstance(e, VLLMEngineConfig)  # the caller dispatches on engine.type
    served = None
    if e.model is not None:
        path = resolve_model(e.model)
    else:
        served, root = read_served_model(e.urls[0])
        if not root or not Path(root).is_dir():
            raise ConfigError(f"the vLLM server serves {served!r} from {root!r}, not a directory on this machine: "
                              "pass --model with a local copy of the served checkpoint (engine.model)")
        path = Path(root)
    tokenizer = AutoTokenizer.from_pretrained(path)
    engine = VLLMEngine(served_model=served, pause_mode=e.pause_mode, deterministic=cfg.deterministic,
                        **_http_engine_kwargs(e, path))
    return engine, tokenizer, path


def make_renderer(tokenizer: Any) -> Any:
    """The env's system prompt already describes its tools, so the template is not given them again."""
    from agentrl.tools.render import ChatRenderer

    return ChatRenderer(tokenizer)


def make_drift(mode: str, renderer: Any) -> Any:
    """The deferred drift check's worker process pool for `renderer` (mode `deferred`), else None. Closed by
    `RunParts.aclose()`."""
    if mode != "deferred":
        return None
    from agentrl.tools.drift import DeferredDrift

    return DeferredDrift(renderer)


def make_scorer(specs: list[RewardSpec], env: Env, tasks: list[Task] | None = None) -> Scorer:
    """The run's reward: `specs` weighted; sources that need the task's prompt get it from `env` (by task id; the
    env's tasks are listed on the first such lookup, not before)."""
    by_id: dict[str, Task] = {t.id: t for t in tasks} if tasks is not None else {}
    listed = tasks is not None

    def prompt_messages(traj: Any) -> list[Any]:
        nonlocal listed
        if not listed:
            by_id.update({t.id: t for t in env.tasks()})
            listed = True
        task = by_id.get(traj.task_id)
        if task is None:
            raise ConfigError(f"trajectory {traj.id}: task {traj.task_id!r} is not a task of env {env.name!r}")
        return env.messages(task)

    return Scorer(specs, prompt_messages=prompt_messages)
