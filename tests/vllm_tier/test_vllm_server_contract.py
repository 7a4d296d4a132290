"""What agentrl relies on from a vLLM server, checked against the stand-in AND a real vLLM 0.32 (each test runs
twice). Where they disagreed, the stand-in was changed: requests sent while paused are held and answered 200 after
/resume (the stand-in said 503), an abort returns the partial output with its logprobs (the stand-in returned none),
a refused reload leaves the server unable to generate until a good reload (the stand-in kept serving)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import call, get, post

from agentrl.engine.vllm import VLLMEngine
from agentrl.types import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8)


def prompt(tokenizer: Any, text: str) -> list[int]:
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                             tokenize=False)
    return list(tokenizer.encode(rendered, add_special_tokens=False))


def body(ids: list[int], sampling: SamplingParams = GREEDY, **extra: Any) -> dict[str, Any]:
    """Exactly what agentrl's vllm engine sends (the eos id of SmolLM2 as the stop id)."""
    eng = VLLMEngine(urls=["http://unused"], eos_token_ids=[2], context_window=4096)
    return {**eng._body(ids, sampling, sampling.max_new_tokens, "contract-session"), **extra}


def completion(url: str, b: dict[str, Any]) -> dict[str, Any]:
    status, data = post(url, "/v1/completions", b)
    assert status == 200, data
    return data["choices"][0]


def test_metadata_agentrl_reads(server: Any, smollm2_path: Path) -> None:
    models = get(server.url, "/v1/models")["data"]
    assert models[0]["root"] == str(smollm2_path) and models[0]["max_model_len"] >= 2048
    assert get(server.url, "/weight_info") == {"weight_version": "default"}
    assert isinstance(get(server.url, "/version")["version"], str)
    assert get(server.url, "/is_paused") == {"is_paused": False}


def test_ids_and_logprobs_format(server: Any, smollm2_tokenizer: Any) -> None:
    ids = prompt(smollm2_tokenizer, "What is 2+2?")
    c = completion(server.url, body(ids))
    assert c["finish_reason"] in ("stop", "length") and c["token_ids"]
    lp = c["logprobs"]
    assert lp["tokens"] == [f"token_id:{i}" for i in c["token_ids"]]
    assert len(lp["token_logprobs"]) == len(c["token_ids"]) and all(v <= 0.0 for v in lp["token_logprobs"])
    again = completion(server.url, body(ids, request_id="second"))
    assert again["token_ids"] == c["token_ids"], "greedy is repeatable"


def test_cached_tokens_are_reported_and_grow_with_a_shared_prefix(server: Any, smollm2_tokenizer: Any) -> None:
    ids = prompt(smollm2_tokenizer, "Tell me about the moon and the sun and the stars. " * 20)
    status, first = post(server.url, "/v1/completions", body(ids))
    status2, second = post(server.url, "/v1/completions", body(ids + [28, 29], request_id="b"))
    assert status == status2 == 200
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert isinstance(first["usage"]["prompt_tokens_details"]["cached_tokens"], int) and cached >= len(ids) // 2


def test_requests_sent_while_paused_wait_and_succeed_after_resume(server: Any, smollm2_tokenizer: Any) -> None:
    ids = prompt(smollm2_tokenizer, "Say hi.")
    assert post(server.url, "/pause?mode=abort")[0] == 200
    result: dict[str, Any] = {}
    t = threading.Thread(target=lambda: result.update(r=post(server.url, "/v1/completions", body(ids))))
    try:
        t.start()
        time.sleep(2.0)
        held = t.is_alive()
        assert get(server.url, "/is_paused") == {"is_paused": True}
    finally:
        assert post(server.url, "/resume")[0] == 200
    t.join(120)
    assert held, "a request sent while paused must wait for /resume, not fail"
    status, data = result["r"]
    assert status == 200 and data["choices"][0]["finish_reason"] in ("stop", "length")


#: prompts whose greedy answers run long; a try counts only if its request is still running when the abort is sent
LONG_ASKS = ("Count from 1 to 500, one number per line.",
             "Write the numbers from one to one thousand in words, one per line.",
             "Write a long story about a dragon and a knight, with many chapters.")


def test_an_abort_returns_the_partial_output(server: Any, smollm2_tokenizer: Any) -> None:
    """A greedy answer can end on its own before the abort (CI once saw the counting one end within 4 s), which says
    nothing about aborts: such a try is repeated with another prompt, and only a request that was still running when
    the abort went out must come back with finish_reason "abort" and its partial output."""
    for n, (ask, wait_s) in enumerate(zip(LONG_ASKS, (2.0, 1.0, 0.5), strict=True)):
        long = body(prompt(smollm2_tokenizer, ask), SamplingParams(temperature=0.0, max_new_tokens=3000),
                    request_id=f"long-{n}")
        result: dict[str, Any] = {}

        def send(b: dict[str, Any] = long, out: dict[str, Any] = result) -> None:
            out["r"] = post(server.url, "/v1/completions", b)
            out["done_at"] = time.monotonic()

        t = threading.Thread(target=send)
        t.start()
        time.sleep(wait_s)
        aborted_at = time.monotonic()
        try:
            assert post(server.url, "/pause?mode=abort")[0] == 200
            t.join(120)
        finally:
            post(server.url, "/resume")
        assert not t.is_alive(), "the aborted request did not come back within 120 s"
        if result["done_at"] < aborted_at:
            continue  # it ended on its own before the abort: try a longer answer
        status, data = result["r"]
        c = data["choices"][0]
        assert status == 200 and c["finish_reason"] == "abort", c["finish_reason"]
        assert len(c["token_ids"]) > 0 and len(c["logprobs"]["token_logprobs"]) == len(c["token_ids"])
        return
    pytest.fail(f"all {len(LONG_ASKS)} generations ended before their abort: give them longer answers")


def test_error_statuses(server: Any, smollm2_tokenizer: Any) -> None:
    ids = prompt(smollm2_tokenizer, "Hi")
    status, data = post(server.url, "/v1/completions", body(ids, model="no-such-model"))
    assert status == 404 and data["error"]["message"].startswith("The model `no-such-model` does not exist")
    status, data = post(server.url, "/v1/completions", body([1] * 5000))
    assert status == 400 and data["error"]["code"] == 400
    status, data = post(server.url, "/v1/unload_lora_adapter", {"lora_name": "never-loaded"})
    assert status == 404 and data["error"]["message"] == "The lora adapter 'never-loaded' cannot be found."


def test_lora_load_serve_unload(server: Any, smollm2_tokenizer: Any, lora_adapter: Path) -> None:
    name = f"contract-{id(server)}"
    status, text = post(server.url, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(lora_adapter)})
    assert status == 200 and text == f"Success: LoRA adapter '{name}' added successfully.", text
    try:
        assert name in [m["id"] for m in get(server.url, "/v1/models")["data"]]
        c = completion(server.url, body(prompt(smollm2_tokenizer, "Hi"), model=name))
        assert c["token_ids"]
        status, data = post(server.url, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(lora_adapter)})
        assert status == 400 and "has already been loaded" in data["error"]["message"]
    finally:
        status, text = post(server.url, "/v1/unload_lora_adapter", {"lora_name": name})
    assert status == 200 and text == f"Success: LoRA adapter '{name}' removed successfully."


def test_a_refused_reload_breaks_generation_until_a_good_reload(server: Any, smollm2_tokenizer: Any,
                                                                 smollm2_path: Path, tmp_path: Path) -> None:
    """The real vLLM is left with meta tensors after a failed reload_weights (its bug): agentrl therefore checks a
    checkpoint first and reloads the last good one after a refusal. Both servers recover from that reload."""
    ids = prompt(smollm2_tokenizer, "What is the capital of France?")
    before = completion(server.url, body(ids))
    status, data = post(server.url, "/collective_rpc",
                        {"method": "reload_weights", "kwargs": {"weights_path": str(tmp_path / "missing")}})
    assert status == 500 and "Worker failed with error" in data["error"]["message"]
    status, data = post(server.url, "/collective_rpc",
                        {"method": "reload_weights", "kwargs": {"weights_path": str(smollm2_path)}})
    assert status == 200, data
    assert post(server.url, "/reset_prefix_cache")[0] == 200
    after = completion(server.url, body(ids, request_id="after"))
    assert after["token_ids"] == before["token_ids"] and server.alive()
