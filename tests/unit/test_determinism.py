"""Deterministic mode: the local engine's batch-invariant path and the runner's derived ids and seeds."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from agentrl.engine.local import LocalEngine
from agentrl.runner.seeds import IdPlan, derive, turn_seed
from agentrl.types import Generation, SamplingParams

SAMPLED = SamplingParams(temperature=1.0, max_new_tokens=16)


def _prompts(lengths: list[int], seed: int = 0) -> list[list[int]]:
    rnd = random.Random(seed)
    return [[rnd.randrange(3, 49_000) for _ in range(n)] for n in lengths]


async def _staggered(eng: LocalEngine, prompts: list[list[int]], seeds: list[int], delays: list[float]) -> list[Generation]:
    async def one(i: int) -> Generation:
        await asyncio.sleep(delays[i])
        return await eng.generate(prompts[i], SAMPLED.model_copy(update={"seed": seeds[i]}), session_id=f"r{i}")

    return list(await asyncio.gather(*(one(i) for i in range(len(prompts)))))


async def test_a_rows_ids_and_logprobs_do_not_depend_on_its_batch(tiny_model_path: Path) -> None:
    """The same request alone and amid 7 others arriving at random moments: identical ids and bit-identical logprobs."""
    target, seed = _prompts([23], seed=5)[0], 77
    eng = LocalEngine(tiny_model_path, deterministic=True, batch_wait_ms=5)
    try:
        alone = await eng.generate(target, SAMPLED.model_copy(update={"seed": seed}), session_id="alone")
        rnd = random.Random(1)
        for trial in range(2):
            others = _prompts([rnd.randrange(3, 60) for _ in range(7)], seed=trial + 10)
            delays = [rnd.uniform(0, 0.05) for _ in range(8)]
            gens = await _staggered(eng, [*others, target], [rnd.randrange(1000) for _ in others] + [seed], delays)
            assert gens[-1].output_ids == alone.output_ids
            assert gens[-1].logprobs == alone.logprobs  # bit for bit, not approximately
        assert eng.stats.max_batch_rows > 1  # decoded in a shared batch, not one row per forward pass
    finally:
        await eng.close()


async def test_the_request_seed_alone_picks_the_stream(tiny_model_path: Path) -> None:
    prompt = _prompts([15])[0]
    eng = LocalEngine(tiny_model_path, deterministic=True, seed=999)
    try:
        a = await eng.generate(prompt, SAMPLED.model_copy(update={"seed": 4}), session_id="one")
        b = await eng.generate(prompt, SAMPLED.model_copy(update={"seed": 4}), session_id="two")
        c = await eng.generate(prompt, SAMPLED.model_copy(update={"seed": 5}), session_id="one")
    finally:
        await eng.close()
    assert (a.output_ids, a.logprobs) == (b.output_ids, b.logprobs)  # session and call index do not matter
    assert a.output_ids != c.output_ids


async def test_deterministic_engine_skips_the_prefix_cache_and_matches_recompute(tiny_model_path: Path) -> None:
    import torch

    prompt = _prompts([30])[0]
    eng = LocalEngine(tiny_model_path, deterministic=True)
    try:
        first = await eng.generate(prompt, SAMPLED.model_copy(update={"seed": 1}), session_id="s")
        follow = prompt + first.output_ids + [17, 18, 19]
        second = await eng.generate(follow, SAMPLED.model_copy(update={"seed": 2}), session_id="s")
        with torch.inference_mode():
            logits = eng.model(torch.tensor([follow + second.output_ids])).logits[0].float()
        ref = torch.log_softmax(logits, dim=-1)
        expected = [ref[len(follow) - 1 + i, t].item() for i, t in enumerate(second.output_ids)]
        assert eng.info()["deterministic"] is True
    finally:
        await eng.close()
    assert second.cached_tokens == 0 and eng.stats.cached_tokens == 0
    assert max(abs(a - b) for a, b in zip(expected, second.logprobs)) < 1e-4


def test_id_plan_is_a_pure_function_of_seed_and_position() -> None:
    plan, other = IdPlan(7), IdPlan(7, namespace="greedy")
    g = plan.group_id("task-1", None)
    assert g == IdPlan(7).group_id("task-1", None) and len(g) == 12
    assert len({g, plan.group_id("task-1", 0), plan.group_id("task-1", None, replica=1),
                plan.group_id("task-2", None), other.group_id("task-1", None), IdPlan(8).group_id("task-1", None)}) == 6
    assert plan.trajectory_id(g, 0, 0) == IdPlan(7).trajectory_id(g, 0, 0) != plan.trajectory_id(g, 0, 1)
    assert plan.trajectory_seed(g, 0) != plan.trajectory_seed(g, 1)
    seed = plan.trajectory_seed(g, 0)
    assert seed is not None and 0 <= turn_seed(seed, 0) < 2**62 and turn_seed(seed, 0) != turn_seed(seed, 1)
    assert derive("a", 1) == derive("a", 1) != derive("a", 2)


def test_without_a_seed_ids_are_random_and_no_seed_is_set() -> None:
    plan = IdPlan(None)
    assert plan.group_id("t", None) != plan.group_id("t", None)
    assert plan.trajectory_seed("g", 0) is None and not plan.deterministic


def test_deterministic_flag_reaches_every_config() -> None:
    from agentrl.cli import _overrides, build_parser
    from agentrl.cli.train import _train_overrides
    from agentrl.config import RolloutConfig
    from agentrl.trainer.config import TrainConfig

    parser = build_parser()
    rollout = _overrides(parser.parse_args(["rollout", "--deterministic", "--seed", "7"]))
    assert RolloutConfig.model_validate(rollout).deterministic is True
    assert "deterministic" not in _overrides(parser.parse_args(["rollout"]))  # a YAML value is not overridden
    train = TrainConfig.model_validate(_train_overrides(parser.parse_args(["train", "--deterministic"])))
    assert train.deterministic and train.rollout_config().deterministic
    ev = parser.parse_args(["eval", "--checkpoint", "x", "--deterministic", "--seed", "3"])
    assert ev.deterministic is True and ev.seed == 3
