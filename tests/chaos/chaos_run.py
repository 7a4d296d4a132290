"""One chaos soak run: the real `agentrl rollout` CLI process (runner, scheduler, store, the code_tests env with hermes
tool calls, sandboxes, the http reward source) against the scripted model and the reward service (chaos_services.py),
with the host faults (chaos_faults.py) and dockerd restarts (chaos_dockerd.py) of its plan (chaos_plan.py).

`run_once` writes the run's config, serves the model and the reward service in-process, runs the CLI (the code under
test is whatever `agentrl` PYTHONPATH or the venv gives it; its cwd is the workdir), and returns what happened
(`RunResult`: the stored trajectories, the runner's retry log, the faults, drops, reward answers, restarts, the
machine's load). It judges nothing: chaos_judge.py does.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos_dockerd import PrivateDockerd, RestartRecord, Restarter
from chaos_faults import FaultRecord, Injector
from chaos_plan import ENV_OPTIONS, INFRA_RETRIES, MAX_NEW_TOKENS, REWARD_WEIGHTS, Ids, Slot
from chaos_services import ChaosModel, DroppingFace, RewardService

from agentrl.engine.standin.core import StandInServer
from agentrl.engine.standin.sglang import StandIn
from agentrl.engine.standin.sglang_contract import generate_validator

INFRA_LINE = re.compile(r"trajectory (\w+) \(task (\S+)\) infra error \[([^\]]*)\], attempt (\d+)")


def write_config(path: Path, *, backend: str, tasks: int, group_size: int, seed: int, out: Path, engine_url: str,
                 model: Path, reward_url: str, concurrency: int, docker_host: str | None = None) -> None:
    cfg = {
        "env": "code_tests", "env_options": ENV_OPTIONS, "tasks": tasks, "group_size": group_size, "seed": seed,
        "deterministic": True, "out": str(out), "max_trajectories": concurrency, "infra_retries": INFRA_RETRIES,
        "summary_json": str(out.with_suffix(".summary.json")),
        "sampling": {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 1.0},
        "budgets": {"max_turns": 4, "max_completion_tokens": 16384},
        "engine": {"type": "sglang", "urls": [engine_url], "model": str(model), "retries": 3,
                   "retry_backoff_s": 0.2},
        "sandbox": {"backend": {"type": backend, **({"docker_host": docker_host} if docker_host else {})},
                    "warm": min(4, concurrency), "max_sandboxes": concurrency},
        "reward": [{"unit_tests": REWARD_WEIGHTS["unit_tests"]},
                   {"http": {"url": reward_url, "weight": REWARD_WEIGHTS["http"], "retries": 2, "backoff_s": 0.1,
                             "timeout_s": 60}}],
    }
    path.write_text(json.dumps(cfg))  # JSON is YAML


@dataclass
class RunResult:
    backend: str
    chaos: bool
    requested: int
    wall_s: float
    rc: int
    trajectories: list[dict[str, Any]]
    infra_log: list[tuple[str, str, str, int]]  # (traj id, task, error_kind, attempt)
    ids: Ids  # the attempts' trajectory ids of this run
    faults: list[FaultRecord] = field(default_factory=list)
    drops: list[dict[str, Any]] = field(default_factory=list)
    reward_answers: dict[str, list[int]] = field(default_factory=dict)
    stderr_tail: str = ""
    load: dict[str, float] = field(default_factory=dict)  # 1-minute load average during the run
    restarts: list[RestartRecord] = field(default_factory=list)  # the private dockerd's restarts (docker only)
    sandbox_of: dict[str, str] = field(default_factory=dict)  # attempt id -> the sandbox its error names


async def run_once(*, backend: str, tasks: list[Any], group_size: int, seed: int, plan: dict[tuple[str, int], Slot],
                   chaos: bool, tokenizer: Any, model_path: Path, concurrency: int, workdir: Path,
                   dockerd: PrivateDockerd | None = None, restart_every_s: float = 0.0) -> RunResult:
    """One `agentrl rollout`. `dockerd`: the docker sandboxes go to that private engine; with `restart_every_s`
    (and `chaos`) it is restarted at that interval while the run lasts."""
    task_ids = [t.id for t in tasks]
    ids = Ids(seed, task_ids, group_size)
    t0 = time.perf_counter()
    state_root = Path(tempfile.mkdtemp(prefix="cx", dir="/tmp"))
    docker_host = dockerd.host if dockerd is not None and backend == "docker" else None
    restarting = chaos and docker_host is not None and restart_every_s > 0
    injector = Injector(backend, state_root / "agentrl-sandboxes", t0, docker_host) if chaos else None
    model = ChaosModel(tokenizer, plan, ids, {t.id: t for t in tasks}, injector, mark_attacks=restarting)
    face = DroppingFace(StandIn(model.engine, model_path=model_path, validator=generate_validator(),
                                worker_id="chaos"), model, t0)
    server = StandInServer(face)
    rewards = RewardService(model)
    engine_url, reward_url = await server.start(), await rewards.start()
    tag = f"{backend}-{'chaos' if chaos else 'clean'}"
    out, cfg, log = workdir / f"{tag}.jsonl", workdir / f"{tag}.yaml", workdir / f"{tag}.log"
    for stale in (out, out.with_suffix(".summary.json")):
        stale.unlink(missing_ok=True)
    write_config(cfg, backend=backend, tasks=len(tasks), group_size=group_size, seed=seed, out=out,
                 engine_url=engine_url, model=model_path, reward_url=reward_url, concurrency=concurrency,
                 docker_host=docker_host)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(state_root)}  # the local state root is this run's alone
    if docker_host:  # the sandbox socket dirs too: a sweep against the private engine never sees another's sockets
        env["TMPDIR"] = str(state_root)
    loads: list[float] = []
    sampler = asyncio.create_task(_sample_load(loads))
    restarter = Restarter(dockerd, restart_every_s, t0, rewards.answers) if restarting and dockerd else None
    restarts = asyncio.create_task(restarter.run()) if restarter else None
    try:
        with log.open("wb") as err:
            proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "agentrl.cli", "rollout", "--config",
                                                        str(cfg), stdout=err, stderr=err, env=env, cwd=workdir)
            rc = await proc.wait()
        wall = time.perf_counter() - t0
        if injector is not None:
            await injector.wait()
    finally:
        if restarter is not None and restarts is not None:
            restarter.stopping.set()
            await restarts
        sampler.cancel()
        await server.stop()
        await rewards.stop()
        shutil.rmtree(state_root, ignore_errors=True)
    text = log.read_text(errors="replace")
    trajs = [json.loads(line) for line in out.read_text().splitlines() if line.strip()] if out.exists() else []
    infra = [(m[1], m[2], m[3], int(m[4])) for m in INFRA_LINE.finditer(text)]
    sandbox_of = named_sandboxes(text, trajs)
    return RunResult(backend, chaos, len(plan), wall, rc, trajs, infra, ids, injector.records if injector else [],
                     face.drops, dict(rewards.answers), text[-3000:], _load_summary(loads),
                     restarter.records if restarter else [], sandbox_of)


SANDBOX_NAME = re.compile(r"agentrl-[0-9a-f]{12}")


def named_sandboxes(log_text: str, trajectories: list[dict[str, Any]]) -> dict[str, str]:
    """Attempt id -> the docker sandbox its error names (the agent's socket path carries the container name): from
    the retry log (attempts recorded infra_error) and the stored records' errors (final attempts)."""
    out = {}
    for line in log_text.splitlines():
        if (m := INFRA_LINE.search(line)) and (name := SANDBOX_NAME.search(line, m.end())):
            out[m[1]] = name[0]
    for t in trajectories:
        if (name := SANDBOX_NAME.search(t.get("error") or "")) is not None:
            out[t["id"]] = name[0]
    return out


async def _sample_load(out: list[float]) -> None:
    """The 1-minute load average every 5 s while a run lasts (the machine is shared: the numbers need it)."""
    while True:
        out.append(float(Path("/proc/loadavg").read_text().split()[0]))
        await asyncio.sleep(5)


def _load_summary(loads: list[float]) -> dict[str, float]:
    if not loads:
        return {}
    return {"min": min(loads), "mean": round(sum(loads) / len(loads), 1), "max": max(loads)}


