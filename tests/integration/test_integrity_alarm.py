"""The integrity alarm in a real training run (TRL, the runner, bubblewrap sandboxes, the store): the policy is
scripted to switch to a hack (a memory bomb in its tool call) once the engine holds weights version 2. The flagged
rate in metrics.jsonl jumps at that step, the alarm fires, and with `action: stop` training ends after that step with
a clear message, keeping every stored trajectory and metrics row. Only the engine's sampling is replaced (its
weights are still synced every step); what TRL trains on is exactly what the scripted policy emitted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_trainer import job, taught_model  # noqa: F401 - fixture
from transformers import AutoTokenizer

from agentrl.engine.local import LocalEngine
from agentrl.store import read_trajectories
from agentrl.trainer.metrics import read_metrics
from agentrl.types import Generation, SamplingParams

HACK_FROM_VERSION = 2
HONEST = "```python\nprint(7)\n```"
HACK = "```python\nchunks = []\nwhile True:\n    chunks.append(b'x' * (64 << 20))\n```"


def _scripted(tokenizer: Any) -> Any:
    async def generate(self: LocalEngine, input_ids: list[int], sampling: SamplingParams, *,
                       session_id: str) -> Generation:
        version = self.weight_version
        ids = list(tokenizer.encode(HACK if version >= HACK_FROM_VERSION else HONEST, add_special_tokens=False))
        ids = ids[: sampling.max_new_tokens - 1] + [self.eos_token_ids[0]]
        return Generation(output_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop", weight_version=version)

    return generate


@pytest.mark.parametrize("action", ["stop"])
def test_a_policy_switching_to_a_hack_rings_the_alarm_and_stops(taught_model: Path, tmp_path: Path,  # noqa: F811
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str],
                                                                 action: str) -> None:
    from agentrl.cli import main

    monkeypatch.setattr(LocalEngine, "generate", _scripted(AutoTokenizer.from_pretrained(taught_model)))
    out = tmp_path / "run"
    cfg = job(taught_model, out, steps=5, batch_size=1, group_size=2,
              sampling={"temperature": 1.0, "max_new_tokens": 48},
              sandbox={"warm": 2, "max_sandboxes": 8, "spec": {"memory": "256m"}},  # the bomb meets the OOM killer fast
              integrity={"max_frac": {"resource_exhaustion": 0.25}, "action": action})
    config = tmp_path / "job.yaml"
    config.write_text(cfg.model_dump_json())
    code = main(["train", "--config", str(config)])
    err = capsys.readouterr().err
    rows = read_metrics(out / "metrics.jsonl")
    stored = read_trajectories(out / "trajectories.jsonl")
    assert code == 3, (err[-2000:], [(t.step, [(r.exit_code, r.timed_out, r.output[:60]) for turn in t.turns
                                              for r in turn.tool_results]) for t in stored])
    assert "stopped after 3 steps by the integrity alarm at step 2: resource_exhaustion in 100%" in err
    assert [r["integrity_resource_exhaustion_frac"] for r in rows] == [0.0, 0.0, 1.0]
    assert sorted({t.step for t in stored}) == [0, 1, 2]  # nothing lost, nothing past the alarm's step
    assert all(bool(t.integrity) == (t.step == 2) for t in stored)
    assert all(t.reward is not None for t in stored)  # detection never unscored anything
