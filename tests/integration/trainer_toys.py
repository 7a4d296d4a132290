"""Test helpers for the trainer: a toy env whose reward is reachable, and a tiny model taught to use its tool.

`print_number` env: the task says "print the number N"; the model answers with ```python blocks, each run in the
sandbox (answer.py, its output is the observation); the hidden check runs answer.py again: reward 0.5 if it prints
an integer, 1.0 if it prints N. Real sandbox, real runner; only the task is small.

`teach_tiny_model`: a tiny random Llama (agentrl.testing.models) given ~150 quick supervised steps on replies of the
env's format (print of a random number, a string, or broken code), so that sampling from it at temperature 1 emits
code blocks -> tool calls -> tool tokens, with rewards that differ inside a group. Still a tiny, mostly random model.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from agentrl.envs import Env, Task, register_env
from agentrl.types import TestOutcome, TestReport, ToolCall, ToolResult, ToolSpec

RUN_PYTHON = ToolSpec(name="run_python", description="Run Python code; returns its output.",
                      parameters={"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]})
ANSWER = "answer.py"


@register_env("print_number")
class PrintNumberEnv(Env):
    """Write a ```python block that prints the task's number (toy env for trainer tests)."""

    action_format = "codeblock"
    tools: list[ToolSpec] = [RUN_PYTHON]
    system_prompt = "Answer with one ```python code block."

    def __init__(self, tasks: int = 16, **options: Any) -> None:
        super().__init__(tasks=tasks, **options)
        self.n_tasks = int(tasks)

    def tasks(self) -> list[Task]:
        return [Task(id=f"num-{i:03d}", prompt=f"Print the number {(i * 37 + 11) % 100}.",
                     data={"number": (i * 37 + 11) % 100}) for i in range(self.n_tasks)]

    async def setup(self, sandbox: Any, task: Task) -> None:
        await sandbox.write_file(ANSWER, "")

    async def call_tool(self, sandbox: Any, call: ToolCall, *, task: Task) -> ToolResult:
        await sandbox.write_file(ANSWER, str(call.arguments.get("code", "")))
        r = await sandbox.exec(f"python3 {ANSWER}", timeout=5)
        return ToolResult(call_id=call.id, name=call.name, output=f"exit {r.exit_code}\n{(r.stdout + r.stderr)[:300]}",
                          exit_code=r.exit_code, stdout=r.stdout[:300], stderr=r.stderr[:300],
                          duration_s=r.duration_s, timed_out=r.timed_out)

    async def finalize(self, sandbox: Any, task: Task) -> TestReport:
        r = await sandbox.exec(f"python3 {ANSWER}", timeout=5)
        out = r.stdout.strip()
        is_int = r.exit_code == 0 and out.lstrip("-").isdigit()
        right = is_int and int(out) == task.data["number"]
        return TestReport(passed=int(is_int) + int(right), total=2,
                          outcomes=[TestOutcome(name="prints_integer", passed=is_int),
                                    TestOutcome(name="prints_number", passed=right)])

    async def solution(self, sandbox: Any, task: Task) -> str | None:
        return await sandbox.read_file(ANSWER)

    def reference_solution(self, task: Task) -> str | None:
        return f"print({task.data['number']})"


def _reply(rng: random.Random) -> str:
    kind = rng.random()
    n = rng.randrange(100)
    if kind < 0.5:
        return f"```python\nprint({n})\n```"
    if kind < 0.75:
        return f"```python\nprint('n{n}')\n```"
    return f"```python\nprint({n}\n```"


def teach_tiny_model(directory: Path, tokenizer_from: Path, *, steps: int = 80, batch: int = 8,
                     seed: int = 0) -> Path:
    """Write a tiny model (see module docstring) into `directory`; returns it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl.testing.models import make_tiny_model
    from agentrl.tools.render import ChatRenderer

    make_tiny_model(directory, tokenizer_from=tokenizer_from, seed=seed)
    tok = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    env = PrintNumberEnv(tasks=16)
    renderer = ChatRenderer(tok)
    prompts = [renderer.prompt_ids(env.messages(t)) for t in env.tasks()]
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    rng = random.Random(seed)
    torch.manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    model.train()
    for _ in range(steps):
        rows = []
        for _ in range(batch):
            prompt = rng.choice(prompts)
            rows.append((prompt, tok.encode(_reply(rng), add_special_tokens=False) + [eos]))
        width = max(len(p) + len(t) for p, t in rows)
        ids = torch.zeros((batch, width), dtype=torch.long)
        mask = torch.zeros((batch, width), dtype=torch.long)
        labels = torch.full((batch, width), -100)
        for i, (p, t) in enumerate(rows):
            ids[i, : len(p) + len(t)] = torch.tensor(p + t)
            mask[i, : len(p) + len(t)] = 1
            labels[i, len(p): len(p) + len(t)] = torch.tensor(t)
        hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state[:, :-1]
        targets = labels[:, 1:]
        keep = targets != -100
        loss = torch.nn.functional.cross_entropy(model.lm_head(hidden[keep]), targets[keep])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    model.save_pretrained(directory)
    return directory


TAUGHT_VERSION = "print-number-v1"  # bump when teach_tiny_model changes


def cached_taught_model(tokenizer_from: Path) -> Path:
    """The taught tiny model, built once per machine into the agentrl cache (like the embedded model)."""
    import os

    from filelock import FileLock

    from agentrl.engine.models import default_cache_dir

    target = default_cache_dir().parent / "test-models" / TAUGHT_VERSION
    if (target / "model.safetensors").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if not (target / "model.safetensors").is_file():
            tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
            teach_tiny_model(tmp, tokenizer_from)
            tmp.rename(target)
    return target
