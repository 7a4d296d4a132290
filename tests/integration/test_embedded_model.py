"""The embedded SmolLM2-135M-Instruct through the local engine: it answers sensibly, greedy decoding equals
transformers' own `generate()`, and the engine's logprobs equal a plain forward pass."""

from __future__ import annotations

import asyncio
from pathlib import Path

import torch

from agentrl.engine.local import LocalEngine
from agentrl.types import SamplingParams

QUESTIONS = ["What is the capital of France? Answer in one sentence.", "Name three primary colors."]


async def test_embedded_model_answers_and_matches_transformers(smollm2_path: Path, smollm2_tokenizer) -> None:  # type: ignore[no-untyped-def]
    prompts = [
        smollm2_tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                              return_dict=False)
        for q in QUESTIONS
    ]
    engine = LocalEngine("smollm2", seed=0)  # the embedded name resolves to the converted checkpoint
    assert engine.model_path == smollm2_path.resolve()
    try:
        greedy = SamplingParams(temperature=0.0, max_new_tokens=40)
        gens = await asyncio.gather(*[engine.generate(p, greedy, session_id=str(i)) for i, p in enumerate(prompts)])
        with torch.inference_mode():
            for prompt, gen in zip(prompts, gens):
                hf = engine.model.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False)
                assert gen.output_ids == hf[0, len(prompt):].tolist()
                logits = engine.model(torch.tensor([prompt + gen.output_ids])).logits[0]
                ref = torch.log_softmax(logits, -1)[torch.arange(len(prompt) - 1, logits.shape[0] - 1),
                                                    torch.tensor(gen.output_ids)]
                assert (ref - torch.tensor(gen.logprobs)).abs().max().item() < 1e-4
    finally:
        await engine.close()
    assert gens[0].finish_reason == "stop" and gens[0].output_ids[-1] == smollm2_tokenizer.eos_token_id
    assert "Paris" in smollm2_tokenizer.decode(gens[0].output_ids)
