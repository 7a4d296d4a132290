"""Shared fixtures: the embedded model (converted once per machine), a tiny random model with its tokenizer, and
tier gating (docker/k8s/gpu skip with a reason unless the environment says the resource must exist)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    from agentrl.engine.models import resolve_model

    return resolve_model(None)


@pytest.fixture(scope="session")
def tiny_model_path(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agentrl.testing.models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny-model"), tokenizer_from=smollm2_path)


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_path: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path)
