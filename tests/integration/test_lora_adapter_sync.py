"""weight_sync: adapter — only the LoRA adapter travels to the engine (issue 23 item 3).

The trainer's PEFT model saves its adapter; the local engine applies it in process, the SGLang and vLLM clients
hot-swap it on the stand-ins through the servers' own LoRA endpoints (bodies judged by the servers' own request
models), and every later turn names the new adapter and is tagged with the new weight version. After each sync the
engine's weights are exactly the trained model's merged weights, and its logits are the merged model's.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from agentrl.engine.local import LocalEngine
from agentrl.engine.standin.lora_contract import (
    ControlValidator,
    fetch_contracts,
    sglang_control_validator,
    vllm_lora_validator,
)
from agentrl.engine.sglang import SGLangEngine, checkpoint_facts
from agentrl.engine.standin.sglang import StandIn, StandInServer
from agentrl.engine.vllm import VLLMEngine
from agentrl.engine.standin.vllm import VLLMStandIn
from agentrl.errors import ConfigError, MissingDependencyError
from agentrl.trainer.loop import BackgroundLoop
from agentrl.trainer.weight_sync import AdapterWeightSync, merged_state_dict
from agentrl.types import SamplingParams

REQUIRE_REAL = "1" in (os.environ.get("AGENTRL_REQUIRE_SGLANG_CONTRACT"), os.environ.get("AGENTRL_REQUIRE_VLLM_CONTRACT"))
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=6)
PROMPT = [1, 5, 9, 14, 3]


@pytest.fixture(scope="module")
def control_validators() -> tuple[ControlValidator, ControlValidator]:
    sglang, vllm = sglang_control_validator(), vllm_lora_validator()
    if not (sglang.is_real and vllm.is_real):
        with contextlib.suppress(MissingDependencyError):
            fetch_contracts()
        sglang, vllm = sglang_control_validator(), vllm_lora_validator()
    if REQUIRE_REAL and not (sglang.is_real and vllm.is_real):
        pytest.fail(f"the servers' own LoRA request models are required here: {sglang.source}; {vllm.source}")
    return sglang, vllm


class Recording:
    """Wraps a control validator and keeps every (path, body) it judged."""

    def __init__(self, inner: ControlValidator) -> None:
        self.inner, self.calls = inner, []

    def as_validator(self) -> ControlValidator:
        def check(path: str, body: Any) -> str | None:
            self.calls.append((path, body))
            return self.inner.check(path, body)

        return ControlValidator(check, self.inner.source)


class FakeTrainer:
    """What the weight syncs read of a TRL trainer: the model, one process."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.processing_class = None
        self.accelerator = SimpleNamespace(unwrap_model=lambda m: m, is_main_process=True,
                                           wait_for_everyone=lambda: None)


def lora_model(base: Path, seed: int) -> Any:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0,
                                            task_type="CAUSAL_LM"))
    train(peft, seed)
    return peft


@torch.no_grad()
def train(peft: Any, seed: int) -> None:
    """Stand-in for optimizer steps: new non-zero LoRA weights (B starts at zero, so the delta would be 0)."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in peft.named_parameters():
        if "lora_" in name:
            p.copy_(torch.randn(p.shape, generator=gen) * 0.05)


def engine_weights(engine: LocalEngine) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in engine.model.state_dict().items()}


def assert_equals_merged(engine: LocalEngine, peft: Any) -> None:
    merged, held = merged_state_dict(peft), engine_weights(engine)
    assert set(merged) <= set(held)
    adapted = [k for k in merged if ".layers." in k and k.endswith("proj.weight")]
    assert adapted, "the adapter touches projection weights"
    for key, value in merged.items():
        assert torch.equal(held[key], value), f"{key} differs from the trained model's merged weight"
    ids = torch.tensor([PROMPT])
    with torch.no_grad():  # the unmerged LoRA forward (x W + x A B s) rounds differently from the merged one
        served, trained = engine.model(ids).logits, peft(input_ids=ids).logits
    torch.testing.assert_close(served, trained, rtol=0, atol=1e-5)


@pytest.fixture
def loop() -> Any:
    background = BackgroundLoop()
    yield background
    background.close()


def test_local_engine_applies_the_adapter_in_process(tiny_model_path: Path, tmp_path: Path, loop: Any) -> None:
    engine = loop.run(_local(tiny_model_path))
    try:
        base = engine_weights(engine)
        peft = lora_model(tiny_model_path, seed=1)
        sync = AdapterWeightSync(engine, loop, tmp_path / "weights")
        sync.sync(FakeTrainer(peft), 1)
        saved = sorted(p.name for p in (tmp_path / "weights" / "adapter-0000001").iterdir())
        assert "adapter_model.safetensors" in saved and "adapter_config.json" in saved
        assert not any(n.endswith(".bin") or n == "model.safetensors" for n in saved), saved
        assert_equals_merged(engine, peft)
        gen = loop.run(engine.generate(PROMPT, GREEDY, session_id="s"))
        assert gen.weight_version == 1 and engine.adapter is not None

        train(peft, seed=2)  # the next step: the new adapter replaces the old one (never added on top of it)
        sync.sync(FakeTrainer(peft), 2)
        assert_equals_merged(engine, peft)
        assert loop.run(engine.generate(PROMPT, GREEDY, session_id="s")).weight_version == 2
        assert [p.name for p in (tmp_path / "weights").iterdir()] == ["adapter-0000002"], "older adapters pruned"

        with torch.no_grad():  # a zero adapter brings the base weights back exactly
            for name, p in peft.named_parameters():
                if "lora_B" in name:
                    p.zero_()
        sync.sync(FakeTrainer(peft), 3)
        held = engine_weights(engine)
        assert all(torch.equal(held[k], v) for k, v in base.items())
    finally:
        loop.run(engine.close())


def test_adapter_sync_refuses_an_engine_without_adapters_and_full_weights(tiny_model_path: Path, tmp_path: Path,
                                                                          loop: Any) -> None:
    with pytest.raises(ConfigError, match="weight_sync: disk"):
        AdapterWeightSync(SimpleNamespace(update_weights=None), loop, tmp_path)
    engine = loop.run(_local(tiny_model_path))
    try:
        from transformers import AutoModelForCausalLM

        full = AutoModelForCausalLM.from_pretrained(tiny_model_path)
        with pytest.raises(ConfigError, match="configure `lora:`"):
            AdapterWeightSync(engine, loop, tmp_path).sync(FakeTrainer(full), 1)
        bad = tmp_path / "bad"
        bad.mkdir()
        with pytest.raises(ConfigError, match="adapter_config.json is missing"):
            loop.run(engine.load_adapter(bad, 1))
        assert engine.weight_version == 0
    finally:
        loop.run(engine.close())


async def _local(path: Path) -> LocalEngine:
    return LocalEngine(path, seed=0)


# -- the HTTP clients against the stand-ins -------------------------------------------------------------------------

@contextlib.asynccontextmanager
async def _served(face: str, model: Path, validator: ControlValidator,
                  **client_kw: Any) -> AsyncIterator[tuple[Any, Any, Any]]:
    from sglang_support import contract_validator

    engine = LocalEngine(model, seed=0)
    eos, window = checkpoint_facts(model)
    if face == "sglang":
        standin: Any = StandIn(engine, model_path=model, validator=contract_validator(), worker_id="w0",
                               control_validator=validator)
    else:
        standin = VLLMStandIn(engine, model_path=model, validator=_completion_validator(), worker_id="w0",
                              lora_validator=validator)
    server = StandInServer(standin)
    url = await server.start()
    client: Any = (SGLangEngine if face == "sglang" else VLLMEngine)(urls=[url], eos_token_ids=eos,
                                                                     context_window=window, model_path=str(model),
                                                                     **client_kw)
    try:
        yield client, standin, engine
    finally:
        await client.close()
        await server.stop()
        await engine.close()


def _completion_validator() -> Any:
    from agentrl.engine.standin.vllm_contract import completion_validator, fetch_contract

    validator = completion_validator()
    if not validator.is_real:
        with contextlib.suppress(MissingDependencyError):
            fetch_contract()
        validator = completion_validator()
    return validator


@pytest.mark.parametrize("face", ["sglang", "vllm"])
def test_http_clients_hot_swap_the_adapter(face: str, tiny_model_path: Path, tmp_path: Path, loop: Any,
                                           control_validators: tuple[ControlValidator, ControlValidator]) -> None:
    inner = control_validators[0 if face == "sglang" else 1]
    recording = Recording(inner)
    peft = lora_model(tiny_model_path, seed=3)
    sync_dir = tmp_path / "weights"

    async def scenario() -> dict[str, Any]:
        async with _served(face, tiny_model_path, recording.as_validator()) as (client, standin, engine):
            before = await client.generate(PROMPT, GREEDY, session_id="t")
            sync = AdapterWeightSync(client, loop, sync_dir)
            path = sync.save(FakeTrainer(peft), 1)
            await client.load_adapter(str(path), 1)
            first = client.adapter
            after = await client.generate(PROMPT, GREEDY, session_id="t")
            held_1 = engine_weights(engine)
            train(peft, seed=4)
            path2 = sync.save(FakeTrainer(peft), 2)
            await client.load_adapter(str(path2), 2)
            again = await client.generate(PROMPT, GREEDY, session_id="t")
            return {"before": before, "after": after, "again": again, "first": first, "second": client.adapter,
                    "log": list(standin.request_log), "adapters": dict(standin.adapters), "held_1": held_1,
                    "held_2": engine_weights(engine), "local": await _greedy_merged(tiny_model_path, peft)}

    out = loop.run(scenario())
    assert out["before"].weight_version == 0 and out["after"].weight_version == 1 and out["again"].weight_version == 2
    assert out["first"] != out["second"] and out["first"].endswith("-v1") and out["second"].endswith("-v2")
    named = "lora_path" if face == "sglang" else "model"
    assert [e[named] for e in out["log"]][-3:] == [None if face == "sglang" else str(tiny_model_path),
                                                    out["first"], out["second"]]
    assert [e["weight_version"] for e in out["log"]][-3:] == ["default", "1", "2"]
    assert out["adapters"] == {out["second"]: str(sync_dir / "adapter-0000002")}, "the previous adapter is unloaded"
    prefix = "" if face == "sglang" else "/v1"
    paths = [p for p, _ in recording.calls]
    assert paths == [f"{prefix}/load_lora_adapter", *(["/update_weight_version"] if face == "sglang" else []),
                     f"{prefix}/load_lora_adapter", *(["/update_weight_version"] if face == "sglang" else []),
                     f"{prefix}/unload_lora_adapter"], paths
    assert recording.calls[0][1] == {"lora_name": out["first"], "lora_path": str(sync_dir / "adapter-0000001")}
    merged = merged_state_dict(peft)
    assert all(torch.equal(out["held_2"][k], v) for k, v in merged.items()), "the server's engine holds the merge"
    assert not all(torch.equal(out["held_1"][k], v) for k, v in merged.items())
    assert out["again"].output_ids == out["local"], "the served turn is the trained (merged) model's greedy turn"


async def _greedy_merged(model: Path, peft: Any) -> list[int]:
    engine = LocalEngine(model, seed=0)
    try:
        await engine.update_weights(merged_state_dict(peft), 9)
        return (await engine.generate(PROMPT, GREEDY, session_id="ref")).output_ids
    finally:
        await engine.close()


@pytest.mark.parametrize(("face", "mode"), [("sglang", "pause"), ("vllm", "abort")])
async def test_in_flight_turns_rerun_with_the_new_adapter(face: str, mode: str, tiny_model_path: Path, tmp_path: Path,
                                                          control_validators: tuple[ControlValidator,
                                                                                    ControlValidator]) -> None:
    import asyncio

    from sglang_support import wait_until

    peft = lora_model(tiny_model_path, seed=5)
    path = AdapterWeightSync(SimpleNamespace(load_adapter=print), None, tmp_path).save(FakeTrainer(peft), 1)
    prompts = [[3, 4, 5], [8, 9, 10, 11]]
    long = SamplingParams(temperature=0.0, max_new_tokens=200)  # still running when the update starts
    kw = {"weight_update": mode} if face == "sglang" else {"pause_mode": mode}
    validator = control_validators[0 if face == "sglang" else 1]
    async with _served(face, tiny_model_path, validator, retries=2, **kw) as (client, standin, _):
        tasks = [asyncio.create_task(client.generate(p, long, session_id=f"s{i}")) for i, p in enumerate(prompts)]
        await wait_until(lambda: standin.in_flight == len(prompts))
        await client.load_adapter(str(path), 1)
        gens = await asyncio.wait_for(asyncio.gather(*tasks), 120)
        log, name = list(standin.request_log), client.adapter
    named = "lora_path" if face == "sglang" else "model"
    assert all(g.finish_reason != "abort" and g.weight_version == 1 for g in gens)
    aborted = [e for e in log if e["finish"] == "abort"]
    assert len(aborted) == len(prompts) and all(e[named] != name for e in aborted)
    assert [(e[named], e["weight_version"]) for e in log if e["finish"] != "abort"] == [(name, "1")] * len(prompts)
    reference = LocalEngine(tiny_model_path, seed=0)
    try:
        await reference.update_weights(merged_state_dict(peft), 1)
        expected = await reference.generate(prompts[0], long, session_id="ref")
    finally:
        await reference.close()
    assert gens[0].output_ids == expected.output_ids, "the re-run used the trained (merged) weights"


async def test_full_weights_after_an_adapter_go_to_the_base_model(tiny_model_path: Path, smollm2_path: Path,
                                                                  tmp_path: Path,
                                                                  control_validators: tuple[ControlValidator,
                                                                                            ControlValidator]) -> None:
    """A full-weight update replaces the adapter: later requests name none, and the adapter is unloaded."""
    from agentrl.testing.models import make_tiny_model

    model2 = make_tiny_model(tmp_path / "m2", tokenizer_from=smollm2_path, seed=1)
    path = AdapterWeightSync(SimpleNamespace(load_adapter=print), None, tmp_path / "w").save(
        FakeTrainer(lora_model(tiny_model_path, seed=6)), 1)
    async with _served("sglang", tiny_model_path, control_validators[0]) as (client, standin, engine):
        await client.load_adapter(str(path), 1)
        await client.generate(PROMPT, GREEDY, session_id="a")
        await client.update_weights(str(model2), 2)
        gen = await client.generate(PROMPT, GREEDY, session_id="a")
        log, adapters, adapter = list(standin.request_log), dict(standin.adapters), client.adapter
        held = engine_weights(engine)
    assert gen.weight_version == 2 and adapter is None and adapters == {}
    assert log[-1]["lora_path"] is None and log[-1]["weight_version"] == "2" and log[-2]["lora_path"] is not None
    from transformers import AutoModelForCausalLM

    new = AutoModelForCausalLM.from_pretrained(model2).state_dict()
    assert all(torch.equal(held[k], v) for k, v in new.items())


def test_standins_refuse_what_the_servers_models_refuse(tiny_model_path: Path, loop: Any,
                                                        control_validators: tuple[ControlValidator,
                                                                                  ControlValidator]) -> None:
    import aiohttp

    sglang_v, vllm_v = control_validators
    if not (sglang_v.is_real and vllm_v.is_real):
        pytest.skip(f"the servers' own LoRA request models could not be fetched here: {sglang_v.source}")

    async def post(url: str, path: str, body: Any) -> tuple[int, str]:
        async with aiohttp.ClientSession() as s, s.post(f"{url}{path}", json=body) as r:
            return r.status, await r.text()

    async def scenario() -> list[tuple[int, str]]:
        out = []
        for face, validator in (("sglang", sglang_v), ("vllm", vllm_v)):
            async with _served(face, tiny_model_path, validator) as (client, standin, _):
                await client.connect()
                url = client.workers[0]
                prefix = "" if face == "sglang" else "/v1"
                out.append(await post(url, f"{prefix}/load_lora_adapter", {"lora_name": "a"}))
                out.append(await post(url, f"{prefix}/load_lora_adapter", {"lora_name": "a", "lora_path": 7}))
                out.append(await post(url, f"{prefix}/unload_lora_adapter", {"lora_nam": "a"}))
                body = ({"input_ids": PROMPT, "lora_path": "never-loaded", "sampling_params": {"max_new_tokens": 2}}
                        if face == "sglang" else {"prompt": PROMPT, "model": "never-loaded", "max_tokens": 2})
                out.append(await post(url, "/generate" if face == "sglang" else "/v1/completions", body))
        return out

    answers = loop.run(scenario())
    assert [s for s, _ in answers] == [400, 400, 400, 400, 400, 400, 400, 404], answers
    assert "lora_path" in answers[0][1] and "Field required" in answers[0][1]
    assert "valid string" in answers[1][1] and "valid string" in answers[5][1]
    assert "has never been loaded: never-loaded" in answers[3][1]
    assert "The model `never-loaded` does not exist." in json.loads(answers[7][1])["error"]["message"]
