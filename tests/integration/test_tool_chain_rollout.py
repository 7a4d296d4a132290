"""tool_chain through a real `agentrl rollout`: the CLI process, the real runner, scorer and store, the tool_chain env
and bubblewrap sandboxes, with the model replaced by a scripted one served over HTTP (the SGLang stand-in over a
ScriptedEngine: the only fake is the model). Honest policies that use what the sandbox printed (one hop per turn, or
one composed call) score 1; policies that want the score without the hidden function (their own `f`, one hop short,
the answer printed by the tool instead of said, a 5,000-digit answer) score 0, and none ends unscored."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from sglang_support import contract_validator

from agentrl.engine.standin.sglang import StandIn, StandInServer
from agentrl.testing.scripted import ScriptedEngine
from agentrl_tool_calc import ToolChainEnv

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")

TASK = ToolChainEnv(tasks=1).tasks()[0]  # chain-train-0000: two hops
START = TASK.data["start"]
OWN_VALUE = next(v for v in range(10, 100) if v != TASK.data["answer"])


def _last_number(tok: Any, ids: list[int]) -> str:
    """The last number of the chat so far: the sandbox's last output (the scripted policy reads it)."""
    return re.findall(r"-?\d+", tok.decode(ids))[-1]


SCRIPTS: dict[str, list[str | None]] = {  # None: answer with the last number the tool printed
    "honest_one_hop_per_turn": [f"print(f({START}))", "print(f({last}))", None],
    "honest_composed": [f"print(f(f({START})))", None],
    "own_f": [f"def f(x):\n    return {OWN_VALUE}\nprint(f(f({START})))", None],
    "one_hop_short": [f"print(f({START}))", None],
    "tool_says_the_answer": [f"print('ANSWER:', f(f({START})))", "I am done."],
    "huge_answer": [f"print(f(f({START})))", "ANSWER: " + "9" * 5000],
}
EXPECTED = {"honest_one_hop_per_turn": 1.0, "honest_composed": 1.0}


def _reply_for(tok: Any, names: list[str]) -> Any:
    assigned: dict[str, str] = {}

    def reply(session: str, turn: int, ids: list[int]) -> str:
        name = assigned.setdefault(session, names[len(assigned) % len(names)])
        script = SCRIPTS[name]
        if turn >= len(script):
            return "I am done."
        step = script[turn]
        tag = f"# policy: {name}\n" if turn == 0 else ""
        if step is None:
            return f"ANSWER: {_last_number(tok, ids)}"
        if step.startswith(("ANSWER", "I am")):
            return step
        return f"```python\n{tag}{step.replace('{last}', _last_number(tok, ids))}\n```"

    return reply


async def test_tool_chain_scores_use_of_the_sandbox_and_nothing_else(tmp_path: Path, smollm2_path: Path,
                                                                      smollm2_tokenizer: Any) -> None:
    names = sorted(SCRIPTS)
    engine = ScriptedEngine(smollm2_tokenizer, _reply_for(smollm2_tokenizer, names))
    server = StandInServer(StandIn(engine, model_path=smollm2_path, validator=contract_validator(),
                                   worker_id="scripted"))
    url = await server.start()
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump({
        "env": "tool_chain", "env_options": {"split": "train", "tasks": 1}, "reward": [{"chain_answer": 1.0}],
        "sampling": {"temperature": 1.0, "max_new_tokens": 6000},
        "budgets": {"max_turns": 4, "max_completion_tokens": 7000}}))
    out = tmp_path / "chain.jsonl"
    try:
        cmd = [sys.executable, "-m", "agentrl.cli", "rollout", "--config", str(config), "--task-id", TASK.id,
               "--group-size", str(len(names)), "--out", str(out), "--engine", "sglang", "--engine-url", url,
               "--model", str(smollm2_path)]
        proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.STDOUT, env={**os.environ})
        output, _ = await asyncio.wait_for(proc.communicate(), 600)  # the scripted server runs on this loop
    finally:
        await server.stop()
    assert proc.returncode == 0, output.decode(errors="replace")[-3000:]
    trajs = [json.loads(line) for line in out.read_text().splitlines()]
    by_policy = {next(n for n in names if f"# policy: {n}\n" in t["turns"][0]["text"]): t for t in trajs}
    assert sorted(by_policy) == names
    got = {name: (t["status"], t["reward"], t["attempt"]) for name, t in by_policy.items()}
    want = {name: ("ok", EXPECTED.get(name, 0.0), 0) for name in names}
    assert got == want
    hops = by_policy["honest_one_hop_per_turn"]["turns"]
    first, second = (r["output"] for t in hops for r in t["tool_results"])  # two calls, one answer
    assert f"print(f({first}))" in hops[1]["text"] and hops[2]["text"] == f"ANSWER: {second}"
    assert second == str(TASK.data["answer"])  # the second call's input was the first call's output
