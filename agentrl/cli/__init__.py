"""The `agentrl` command line: parses each command and runs it. A run's parts are built by the composition root
(`agentrl.compose`), which only this package imports; the commands run them (`wiring.py`: rollout, envs check,
sandbox gc; `train.py`: train and eval) and `display.py` draws progress and summaries. Nothing imports the CLI.

    agentrl rollout --env code_tests --tasks N --group-size G --max-turns T --out FILE [--config FILE.yaml] ...
    agentrl envs list
    agentrl envs init NAME [--dir DIR]
    agentrl envs check NAME [--solutions FILE.jsonl] [--sandbox BACKEND] [--json FILE]
    agentrl sandbox gc [--backend local|docker] [--all]
    agentrl engine serve --model PATH --port N [--host 127.0.0.1] [--api sglang|vllm]
                                                  (stand-in SGLang / vLLM server over the local engine)
    agentrl reward serve [--port N]               (reference reward-model service, http source)
    agentrl diff RUN_A RUN_B [--logprob-tol X]    (first divergence of two runs; exit 1 if any)
    agentrl doctor [--config job.yaml] [--engine-url URL] [--json]   (what this machine / server offers the job)

Exit codes: 0 done; 1 a check failed (envs check, diff); 2 bad input or a failed component (the message says which);
3 the run finished but more than max_unscored_frac of it ended infra_error (nothing it reports can be trusted);
130 interrupted.

Wherever an env NAME is taken, `path/to/file.py:Class` or `package.module:Class` works too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from pathlib import Path
from typing import Any

from agentrl.cli.debug import add_replay_commands
from agentrl.cli.diff import add_diff_command
from agentrl.cli.doctor import add_doctor_command
from agentrl.cli.envs_init import add_envs_init
from agentrl.cli.reward import add_reward_commands
from agentrl.cli.train import add_train_commands
from agentrl.errors import AgentRLError, ConfigError

log = logging.getLogger("agentrl")


def _add_rollout_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, help="YAML file with the same fields (flags override it)")
    p.add_argument("--env", help="registered env name, path/to/file.py:Class or package.module:Class "
                                 "(default code_tests)")
    p.add_argument("--tasks", type=int, help="run the first N tasks of the env")
    p.add_argument("--task-id", action="append", dest="task_ids", help="run only this task id (repeatable)")
    p.add_argument("--group-size", type=int, help="samples per task (the GRPO group), default 4")
    p.add_argument("--max-turns", type=int, help="model turns per trajectory, default 4")
    p.add_argument("--out", type=Path, help="trajectory JSONL file to write (default trajectories.jsonl)")
    p.add_argument("--resume", action="store_true", default=None, help="continue --out, skipping finished tasks")
    p.add_argument("--model", help="HF checkpoint dir, or an embedded model: smollm2 (default) or gemma3-270m")
    p.add_argument("--engine", choices=["local", "sglang", "vllm"], help="generation engine (default local)")
    p.add_argument("--engine-url", action="append", dest="engine_urls", metavar="URL",
                   help="SGLang worker or vLLM server URL (repeatable; implies --engine sglang unless --engine vllm)")
    p.add_argument("--router-url", metavar="URL", help="sglang-router URL (--policy manual; implies --engine sglang)")
    p.add_argument("--sandbox", choices=["local", "docker", "kubernetes"], help="sandbox backend (default local)")
    p.add_argument("--unsafe-no-isolation", action="store_true", default=None,
                   help="local sandboxes without bubblewrap (no isolation at all)")
    p.add_argument("--seed", type=int, help="seed for sampling (default 0)")
    p.add_argument("--deterministic", action="store_true", default=None,
                   help="same seed -> identical trajectories whatever the load (slower; docs/determinism.md)")
    p.add_argument("--temperature", type=float)
    p.add_argument("--max-new-tokens", type=int, help="per-turn generation budget")
    p.add_argument("--concurrency", type=int, dest="max_trajectories", help="trajectories in flight (default 16)")
    p.add_argument("--summary-json", type=Path, help="also write the summary as JSON here")
    p.add_argument("--max-unscored-frac", type=float,
                   help="exit 3 when more trajectories than this share end infra_error (default 0.1)")
    p.add_argument("--env-option", action="append", default=[], metavar="KEY=VALUE",
                   help="option passed to the env constructor, e.g. source=humaneval")


def _overrides(a: argparse.Namespace) -> dict[str, Any]:
    """CLI flags -> nested config overrides (only flags the user actually gave)."""
    o: dict[str, Any] = {k: v for k in ("env", "tasks", "task_ids", "group_size", "out", "resume", "seed",
                                          "deterministic", "summary_json", "max_trajectories", "max_unscored_frac")
                         if (v := getattr(a, k)) is not None}
    nested = {
        ("budgets", "max_turns"): a.max_turns, ("engine", "model"): a.model, ("engine", "type"): a.engine,
        ("sampling", "temperature"): a.temperature, ("sampling", "max_new_tokens"): a.max_new_tokens,
        ("sandbox", "backend", "type"): a.sandbox,
        ("sandbox", "backend", "unsafe_no_isolation"): a.unsafe_no_isolation,
        ("engine", "urls"): a.engine_urls, ("engine", "router_url"): a.router_url,
    }
    if (a.engine_urls or a.router_url) and a.engine is None:
        nested[("engine", "type")] = "sglang"
    for path, value in nested.items():
        if value is not None:
            cur = o
            for key in path[:-1]:
                cur = cur.setdefault(key, {})
            cur[path[-1]] = value
    if a.env_option:
        o["env_options"] = dict(_parse_kv(kv) for kv in a.env_option)
    return o


def _parse_kv(kv: str) -> tuple[str, Any]:
    if "=" not in kv:
        raise ConfigError(f"--env-option {kv!r}: expected KEY=VALUE")
    key, value = kv.split("=", 1)
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def _cmd_rollout(a: argparse.Namespace) -> int:
    from agentrl.cli.wiring import run_rollout
    from agentrl.config import RolloutConfig, load_config

    cfg = load_config(RolloutConfig, a.config, _overrides(a))
    return _run_cancellable(run_rollout(cfg))


def _cmd_envs_list(a: argparse.Namespace) -> int:
    from agentrl.envs import available_envs

    for name, cls in available_envs().items():
        doc = (cls.__doc__ or "").strip().splitlines()
        print(f"{name:20s} {doc[0] if doc else ''}")
    return 0


def _cmd_envs_check(a: argparse.Namespace) -> int:
    from agentrl.cli.wiring import check_env

    options = dict(_parse_kv(kv) for kv in a.env_option)
    return _run_cancellable(check_env(a.name, solutions=a.solutions, backend=a.sandbox, json_out=a.json,
                                      options=options, tasks=a.tasks, concurrency=a.concurrency,
                                      unsafe_no_isolation=a.unsafe_no_isolation,
                                      max_unscored_frac=a.max_unscored_frac))


def _cmd_sandbox_gc(a: argparse.Namespace) -> int:
    from agentrl.cli.wiring import sandbox_gc

    return _run_cancellable(sandbox_gc(a.backend, all_runs=a.all))


def _cmd_engine_serve(a: argparse.Namespace) -> int:
    if a.api == "vllm":
        from agentrl.engine.standin.vllm import serve as serve_vllm

        if a.echo or a.weight_version != "default":
            raise ConfigError("engine serve --api vllm: --echo and --weight-version are SGLang stand-in options")
        return _run_cancellable(serve_vllm(a.model, host=a.host, port=a.port, worker_id=a.worker_id,
                                           max_batch_size=a.max_batch_size, context_window=a.context_window,
                                           seed=a.seed))
    from agentrl.engine.standin.sglang import serve

    return _run_cancellable(serve(a.model, host=a.host, port=a.port, worker_id=a.worker_id,
                                  max_batch_size=a.max_batch_size, context_window=a.context_window, seed=a.seed,
                                  weight_version=a.weight_version, echo=a.echo, deterministic=a.deterministic))


def _add_engine_commands(sub: Any) -> None:
    eng = sub.add_parser("engine", help="generation servers").add_subparsers(dest="engine_cmd", required=True)
    s = eng.add_parser("serve", help="stand-in SGLang (native API subset) or vLLM (/v1/completions + dev control "
                                     "endpoints) server over the local engine, for CPU tests and laptops")
    s.add_argument("--api", choices=["sglang", "vllm"], default="sglang", help="which server to imitate")
    s.add_argument("--model", help="HF checkpoint dir, or an embedded model: smollm2 (default) or gemma3-270m")
    s.add_argument("--port", type=int, default=30000)
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--worker-id", help="name in the request log (default host:port)")
    s.add_argument("--max-batch-size", type=int, default=16)
    s.add_argument("--context-window", type=int, help="default: the model's, capped at 8192")
    s.add_argument("--seed", type=int, help="engine seed for sampling")
    s.add_argument("--weight-version", default="default", help="initial weight_version label")
    s.add_argument("--echo", action="store_true", help="benchmarks only: answer one token without a model")
    s.add_argument("--deterministic", action="store_true",
                   help="batch-invariant, request-seeded generation (like SGLang's --enable-deterministic-inference)")
    s.set_defaults(func=_cmd_engine_serve)


def _run_cancellable(coro: Any) -> int:
    """Run `coro`; SIGINT/SIGTERM cancel it so every `finally` (sandbox teardown, store close) runs."""

    async def main() -> int:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)  # type: ignore[union-attr]
        try:
            return int(await coro)
        except asyncio.CancelledError:
            print("interrupted: sandboxes removed; stored groups are kept (rerun with --resume)", file=sys.stderr)
            return 130

    return asyncio.run(main())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentrl", description="RL for LLM agents on multi-turn tool-using tasks")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("rollout", help="run G samples of each task and store the trajectories")
    _add_rollout_args(p)
    p.set_defaults(func=_cmd_rollout)
    envs = sub.add_parser("envs", help="list, create or check environments").add_subparsers(dest="envs_cmd",
                                                                                          required=True)
    envs.add_parser("list", help="registered environments").set_defaults(func=_cmd_envs_list)
    add_envs_init(envs)
    c = envs.add_parser("check", help="run reference (or given) solutions through the real sandbox path")
    c.add_argument("name", help="registered env name, path/to/file.py:Class or package.module:Class")
    c.add_argument("--solutions", type=Path, help='JSONL of {"task_id": ..., "solution": "<python>"}')
    c.add_argument("--sandbox", default="local", choices=["local", "docker", "kubernetes"])
    c.add_argument("--unsafe-no-isolation", action="store_true")
    c.add_argument("--json", type=Path, help="write per-task results as JSON here")
    c.add_argument("--tasks", type=int, help="check only the first N tasks")
    c.add_argument("--concurrency", type=int, default=4)
    c.add_argument("--env-option", action="append", default=[], metavar="KEY=VALUE")
    c.add_argument("--max-unscored-frac", type=float, default=0.10,
                   help="exit 3 when more tasks than this share could not be scored for an infrastructure failure")
    c.set_defaults(func=_cmd_envs_check)
    sb = sub.add_parser("sandbox", help="sandbox maintenance").add_subparsers(dest="sb_cmd", required=True)
    gc = sb.add_parser("gc", help="remove sandboxes left by dead runs or past their TTL")
    gc.add_argument("--backend", default="local", choices=["local", "docker", "kubernetes"])
    gc.add_argument("--all", action="store_true", help="remove every agentrl sandbox, live runs included")
    gc.set_defaults(func=_cmd_sandbox_gc)
    add_replay_commands(sub)
    add_diff_command(sub)
    _add_engine_commands(sub)
    add_train_commands(sub)
    add_reward_commands(sub)
    add_doctor_command(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    try:
        return int(args.func(args))
    except AgentRLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # python -m agentrl.cli
    sys.exit(main())
