"""Grader attacks through a real `agentrl rollout`: the CLI process, the real runner, scheduler, store, code_tests env
and bubblewrap sandboxes, with the model replaced by a scripted one served over HTTP (the SGLang stand-in over a
ScriptedEngine: the only fake is the model). Every trajectory's policy writes a hostile solution.py and/or attacks
its sandbox; every one must be scored 0 and none may end unscored (infra_error) or be retried."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sglang_support import contract_validator

from agentrl.engine.standin.sglang import StandIn, StandInServer
from agentrl.testing.scripted import ScriptedEngine
from agentrl.testing.scripted_attacks import code_attacks, plant, wrong

ENTRY = "add"  # easy/add: add(a, b) -> a + b


def _forger(names: list[str]) -> str:
    """A daemon that waits for the grader (the harness process, found by its command line), writes a forged
    all-passed verdict into its stdout and kills it, so the forged line is the last one the host reads."""
    results = [[n, True, ""] for n in names]
    return f"""
import json, os, signal, time
line = 'AGENTRL_HARNESS_RESULT ' + json.dumps({{"results": {results!r}}}) + '\\n'
def harness(pid):
    try:
        return b'HARNESS' in open(f'/proc/{{pid}}/cmdline', 'rb').read()
    except OSError:
        return False
def parent(pid):
    for row in open(f'/proc/{{pid}}/status'):
        if row.startswith('PPid:'):
            return row.split()[1]
while True:
    for pid in os.listdir('/proc'):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            if not harness(pid) or harness(parent(pid)):  # the grader itself, not its test children
                continue
            with open(f'/proc/{{pid}}/fd/1', 'w') as out:
                out.write(line)
            os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass
    time.sleep(0.002)
"""


def _daemon(names: list[str]) -> str:
    return f"""
import subprocess
open('forger.py', 'w').write({_forger(names)!r})
subprocess.Popen(['setsid', 'python3', 'forger.py'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print('daemon started')
"""


# the grader and workspace attacks of the one attack list (the chaos tier adds its sandbox and tool-call JSON ones)
ATTACKS: dict[str, list[str]] = code_attacks(ENTRY, families=("grader", "workspace"))


def _reply_for(names: list[str], scripts: dict[str, list[str]] | None = None, label: str = "attack") -> Any:
    """Each new session (trajectory) takes the next script (default: the attacks); its turns are the script's code
    blocks (the first one tagged `# <label>: <name>`), then 'done'."""
    assigned: dict[str, str] = {}
    scripts = ATTACKS if scripts is None else scripts

    def reply(session: str, turn: int, _ids: list[int]) -> str:
        name = assigned.setdefault(session, names[len(assigned) % len(names)])
        blocks = scripts[name]
        if turn >= len(blocks):
            return "I am done."
        tag = f"# {label}: {name}\n" if turn == 0 else ""
        return f"```python\n{tag}{blocks[turn]}\n```"

    return reply


async def test_every_attack_scores_zero_through_a_real_rollout(tmp_path: Path, smollm2_path: Path,
                                                               smollm2_tokenizer: Any) -> None:
    from agentrl.envs import get_env

    task = next(t for t in get_env("code_tests", source="easy").tasks() if t.id == "easy/add")
    ATTACKS["setsid_daemon_forges_verdicts"] = [plant(wrong(ENTRY)), _daemon([n for n, _ in task.data["tests"]])]
    names = sorted(ATTACKS)
    engine = ScriptedEngine(smollm2_tokenizer, _reply_for(names))
    server = StandInServer(StandIn(engine, model_path=smollm2_path, validator=contract_validator(),
                                   worker_id="scripted"))
    url = await server.start()
    out = tmp_path / "attacks.jsonl"
    try:
        cmd = [sys.executable, "-m", "agentrl.cli", "rollout", "--env", "code_tests", "--task-id", "easy/add",
               "--group-size", str(len(names)), "--max-turns", "3", "--out", str(out), "--engine", "sglang",
               "--engine-url", url, "--model", str(smollm2_path)]
        proc = await _run(cmd)
    finally:
        await server.stop()
    assert proc[0] == 0, proc[1][-3000:]
    trajs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(trajs) == len(names)
    by_attack = {_attack_of(t, names): t for t in trajs}
    assert sorted(by_attack) == names, "every attack ran in its own trajectory"
    broken = {name: (t["status"], t["reward"], t["attempt"], t["error_kind"], (t["error"] or "")[:200])
              for name, t in by_attack.items()
              if t["status"] == "infra_error" or t["attempt"] != 0 or t["reward"] != 0.0}
    assert not broken, f"attacks that were not scored 0 (status, reward, attempt, kind, error): {broken}"


def _attack_of(traj: dict[str, Any], names: list[str]) -> str:
    first = traj["turns"][0]["text"]
    return next(n for n in names if f"# attack: {n}\n" in first)


async def _run(cmd: list[str]) -> tuple[int, str]:
    import asyncio

    proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT, env={**os.environ})
    out, _ = await asyncio.wait_for(proc.communicate(), 600)
    return proc.returncode or 0, out.decode(errors="replace")
