"""weight_sync: adapter — the config rule, reading a PEFT adapter dir, and fetching a second contract of a package."""

from __future__ import annotations

import io
import json
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from agentrl.engine.lora import adapter_deltas
from agentrl.engine.standin.server_contract import ServerContract
from agentrl.errors import ConfigError
from agentrl.trainer.config import TrainConfig


def test_adapter_sync_needs_lora() -> None:
    with pytest.raises(ValidationError) as info:
        TrainConfig(weight_sync="adapter")
    message = str(info.value)
    assert "weight_sync: adapter" in message and "`lora:`" in message and "weight_sync: disk" in message
    cfg = TrainConfig(weight_sync="adapter", lora={"r": 4, "alpha": 8})
    assert cfg.weight_sync == "adapter" and cfg.lora is not None and cfg.lora.r == 4


def _adapter(tmp_path: Path, config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Path:
    from safetensors.torch import save_file

    (tmp_path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2, "lora_alpha": 4,
                                                              **config}))
    save_file(tensors, str(tmp_path / "adapter_model.safetensors"))
    return tmp_path


def test_adapter_deltas_follow_peft(tmp_path: Path) -> None:
    a, b = torch.randn(2, 5), torch.randn(3, 2)
    key = "base_model.model.model.layers.0.self_attn.q_proj"
    (tmp_path / "p").mkdir()
    plain = adapter_deltas(_adapter(tmp_path / "p", {}, {f"{key}.lora_A.weight": a, f"{key}.lora_B.weight": b}))
    assert list(plain) == ["model.layers.0.self_attn.q_proj.weight"]
    assert torch.equal(plain["model.layers.0.self_attn.q_proj.weight"], (b @ a) * 2.0)
    (tmp_path / "rs").mkdir()
    rs = adapter_deltas(_adapter(tmp_path / "rs", {"use_rslora": True},
                                 {f"{key}.lora_A.weight": a, f"{key}.lora_B.weight": b}))
    assert torch.equal(rs["model.layers.0.self_attn.q_proj.weight"], (b @ a) * (4 / 2 ** 0.5))


@pytest.mark.parametrize(("config", "extra", "text"), [
    ({"use_dora": True}, {}, "use_dora"),
    ({"modules_to_save": ["lm_head"]}, {}, "modules_to_save"),
    ({"rank_pattern": {"q_proj": 8}}, {}, "rank_pattern"),
    ({}, {"base_model.model.model.embed_tokens.lora_embedding_A": torch.zeros(2, 4)}, "not a LoRA A/B weight"),
])
def test_adapter_deltas_refuse_what_the_engine_cannot_apply(tmp_path: Path, config: dict[str, Any],
                                                            extra: dict[str, torch.Tensor], text: str) -> None:
    key = "base_model.model.model.layers.0.self_attn.q_proj"
    tensors = {f"{key}.lora_A.weight": torch.zeros(2, 5), f"{key}.lora_B.weight": torch.zeros(3, 2), **extra}
    with pytest.raises(ConfigError, match=text):
        adapter_deltas(_adapter(tmp_path, config, tensors))


def test_a_second_contract_of_a_package_keeps_the_first_ones_files(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang's generate contract and its control models share <cache>/sglang/<version>: fetching one must not wipe
    the other (the old fetch replaced the whole directory)."""
    first = ServerContract("fakepkg_two", "1", ("fakepkg_two/api.py",), "AGENTRL_TEST_A", "fetch", "first")
    second = ServerContract("fakepkg_two", "1", ("fakepkg_two/srt/io.py",), "AGENTRL_TEST_B", "fetch", "second")
    monkeypatch.delenv("AGENTRL_TEST_A", raising=False)
    monkeypatch.delenv("AGENTRL_TEST_B", raising=False)

    def fake_pip(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as wheel:
            wheel.writestr("fakepkg_two/api.py", "API = 1\n")
            wheel.writestr("fakepkg_two/srt/io.py", "IO = 1\n")
        (Path(cmd[cmd.index("-d") + 1]) / "fakepkg_two-1-py3-none-any.whl").write_bytes(buf.getvalue())
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(subprocess, "run", fake_pip)
    first.fetch(tmp_path)
    second.fetch(tmp_path)
    assert first.find(tmp_path) is not None, "the first contract's files survive the second fetch"
    assert second.find(tmp_path) is not None
    assert first.cache_root(tmp_path) == second.cache_root(tmp_path)
