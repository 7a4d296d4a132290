"""agentrl end to end against a real vLLM 0.32 on CPU, through the CLI a user runs: doctor, rollout (tool_calc and
code_tests, multi-turn), replay --reexecute, train (full weights to the server every step, and a LoRA run with
weight_sync: adapter), eval of a checkpoint, and a reload the server refuses.

Each test restores the server (weights, label, adapters) so that the order of tests does not matter."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import get, post

from agentrl.engine.vllm import VLLMEngine
from agentrl.errors import EngineError
from agentrl.store import read_trajectories
from agentrl.types import SamplingParams, Status

PROBE = [1, 9690, 198, 2683, 314, 253, 7018, 30, 2, 198, 1, 520, 9531, 198]  # a fixed chat prompt


def agentrl(*args: str, timeout: float = 1500) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agentrl.cli", *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


def greedy_logprobs(url: str, model: str | None = None) -> list[float]:
    body: dict[str, Any] = {"prompt": PROBE, "max_tokens": 8, "temperature": 0.0, "logprobs": 0,
                            "return_token_ids": True}
    if model:
        body["model"] = model
    status, data = post(url, "/v1/completions", body)
    assert status == 200, data
    return [float(v) for v in data["choices"][0]["logprobs"]["token_logprobs"]]


@pytest.fixture
def restored(real_vllm: Any, smollm2_path: Path) -> Iterator[Any]:
    """After the test: the served checkpoint reloaded, adapters unloaded, the label back to "default"."""
    yield real_vllm
    for card in get(real_vllm.url, "/v1/models")["data"][1:]:
        post(real_vllm.url, "/v1/unload_lora_adapter", {"lora_name": card["id"]})
    post(real_vllm.url, "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(smollm2_path)}})
    post(real_vllm.url, "/reset_prefix_cache")
    post(real_vllm.url, "/update_weight_version", {"new_version": "default"})


def check_stored_contract(trajs: list[Any]) -> None:
    for t in trajs:
        assert len(t.completion_ids) == len(t.logprobs) == len(t.env_mask), t.id
        assert t.status is not Status.infra_error, (t.id, t.error)
        assert all(turn.prefix_drift is False for turn in t.turns), "prefix drift"


@pytest.fixture(scope="module")
def rollouts(real_vllm: Any, smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("rollouts")
    runs = {}
    for env, tasks in (("tool_calc", "4"), ("code_tests", "2")):
        path = out / f"{env}.jsonl"
        r = agentrl("rollout", "--env", env, "--engine", "vllm", "--engine-url", real_vllm.url, "--model",
                    str(smollm2_path), "--tasks", tasks, "--group-size", "2", "--max-turns", "3",
                    "--max-new-tokens", "96", "--seed", "1", "--out", str(path))
        assert r.returncode == 0, r.stderr[-4000:]
        runs[env] = path
    return runs


def test_doctor_reports_what_the_server_offers(real_vllm: Any) -> None:
    r = agentrl("doctor", "--engine-url", real_vllm.url, "--json", timeout=120)
    assert r.returncode == 0, r.stdout[-3000:]
    rows = {row["check"].removeprefix(f"vllm {real_vllm.url}").strip(): row for row in json.loads(r.stdout)}
    assert rows[""]["detail"].startswith("vLLM 0.32.0") and rows["dev mode"]["status"] == "ok"
    assert rows["spans"]["detail"] == "vLLM 0.32.0: no spans; versions derived from agentrl's update fences"
    assert rows["LoRA"]["detail"] == "max rank 16" and rows["dtype"]["detail"] == "torch.bfloat16"
    assert rows["seeded prefill"]["detail"] == "safe (cpu, chunked prefill False)"


def test_rollouts_store_the_exact_contract_with_no_infra_error(rollouts: dict[str, Path]) -> None:
    trajs = [t for path in rollouts.values() for t in read_trajectories(path)]
    assert len(trajs) == 12
    check_stored_contract(trajs)
    assert all(t.meta["engine"]["server_version"] == "0.32.0" for t in trajs)
    assert all(turn.weight_version == 0 for t in trajs for turn in t.turns)
    multi = [t for t in trajs if len(t.turns) > 1]
    assert multi, "no trajectory went past its first turn"
    for t in multi:  # the same server, sticky: later turns reuse the cached prefix
        assert all(b.cached_tokens >= a.cached_tokens for a, b in zip(t.turns, t.turns[1:])), t.id
    assert any(t.turns[-1].cached_tokens > 0 for t in multi)


def test_replay_reexecutes_a_stored_trajectory(rollouts: dict[str, Path]) -> None:
    trajs = read_trajectories(rollouts["tool_calc"])
    called = next((t for t in trajs if t.num_tool_calls), trajs[0])
    r = agentrl("replay", str(rollouts["tool_calc"]), "--id", called.id, "--reexecute", timeout=600)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])


def train_config(tmp: Path, url: str, model: Path, **extra: Any) -> Path:
    cfg = {"model": str(model), "env": "tool_calc", "env_options": {"split": "train"}, "group_size": 4,
           "batch_size": 2, "steps": 2, "learning_rate": 1.0e-4, "loss_type": "dapo",
           "pipeline": {"max_staleness": 0}, "sampling": {"temperature": 1.0, "max_new_tokens": 32},
           "budgets": {"max_turns": 2, "max_completion_tokens": 128},
           "engine": {"type": "vllm", "urls": [url]}, "weight_sync": "disk",
           "max_trajectories": 8, "sandbox": {"warm": 4, "max_sandboxes": 8}, "output_dir": str(tmp / "run"),
           "reward": [{"calc_answer": 1.0}, {"format": 0.5}], "seed": 0, **extra}
    path = tmp / "train.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_train_sends_the_weights_to_the_server_every_step(restored: Any, smollm2_path: Path, tmp_path: Path) -> None:
    before = greedy_logprobs(restored.url)
    r = agentrl("train", "--config", str(train_config(tmp_path, restored.url, smollm2_path)))
    assert r.returncode == 0, r.stderr[-4000:]
    # the weights of step 1's update reached the server before step 2's rollouts (a sync precedes every rollout)
    assert get(restored.url, "/weight_info") == {"weight_version": "1"}
    after = greedy_logprobs(restored.url)
    assert max(abs(a - b) for a, b in zip(before, after)) > 1e-4, "the server still serves the old weights"
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1]
    trajs = read_trajectories(tmp_path / "run" / "trajectories.jsonl")
    check_stored_contract(trajs)
    assert {turn.weight_version for t in trajs for turn in t.turns} == {0, 1}, "step 2 ran on step 1's weights"
    # eval of the last checkpoint: the server is made to serve it (not whatever it held)
    post(restored.url, "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(smollm2_path)}})
    post(restored.url, "/reset_prefix_cache")
    r = agentrl("eval", "--checkpoint", str(tmp_path / "run"), "--config", str(tmp_path / "train.yaml"),
                "--tasks", "2", "--samples", "1", "--out", str(tmp_path / "eval"))
    assert r.returncode == 0, r.stderr[-4000:]
    assert f"eval: loading {tmp_path / 'run' / 'checkpoints' / 'checkpoint-2'}" in r.stdout, r.stdout[-2000:]
    assert (tmp_path / "eval" / "candidate.json").is_file()
    served = greedy_logprobs(restored.url)  # the base was reloaded before eval: the server now serves checkpoint-2
    assert max(abs(a - b) for a, b in zip(served, before)) > 1e-4, "eval ran on the server's old weights"


def test_lora_run_hot_swaps_the_adapter(restored: Any, smollm2_path: Path, tmp_path: Path) -> None:
    cfg = train_config(tmp_path, restored.url, smollm2_path, lora={"r": 8, "alpha": 16}, weight_sync="adapter",
                       learning_rate=1.0e-3, steps=3)
    r = agentrl("train", "--config", str(cfg))
    assert r.returncode == 0, r.stderr[-4000:]
    assert get(restored.url, "/weight_info") == {"weight_version": "2"}
    adapters = [m["id"] for m in get(restored.url, "/v1/models")["data"][1:]]
    assert len(adapters) == 1 and adapters[0].endswith("-v2"), adapters  # the v1 adapter was unloaded
    base, tuned = greedy_logprobs(restored.url), greedy_logprobs(restored.url, adapters[0])
    assert max(abs(a - b) for a, b in zip(base, tuned)) > 1e-4, "the adapter changes what is served"
    trajs = read_trajectories(tmp_path / "run" / "trajectories.jsonl")
    check_stored_contract(trajs)


def test_a_reload_the_server_refuses_restores_the_last_good_weights(restored: Any, smollm2_path: Path,
                                                                   tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """On the real server a refused reload leaves meta tensors: the next generation would kill it. agentrl reloads
    the served checkpoint and raises an EngineError with vLLM's answer; the server keeps serving."""
    import agentrl.engine.vllm as vllm_mod

    monkeypatch.setattr(vllm_mod, "check_checkpoint", lambda *a, **k: None)  # a defect no client check sees
    before = greedy_logprobs(restored.url)

    async def run() -> None:
        eng = VLLMEngine(urls=[restored.url], eos_token_ids=[2], model_path=str(smollm2_path), retries=3)
        try:
            with pytest.raises(EngineError, match="restored to") as info:
                await eng.update_weights(str(tmp_path / "missing"), 1)
            assert "Worker failed with error" in str(info.value)
            gen = await eng.generate(PROBE, SamplingParams(temperature=0.0, max_new_tokens=4), session_id="s")
            assert gen.finish_reason in ("stop", "length") and gen.weight_version == 0
        finally:
            await eng.close()

    asyncio.run(run())
    assert restored.alive() and greedy_logprobs(restored.url) == pytest.approx(before, abs=1e-6)
