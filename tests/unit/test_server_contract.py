"""agentrl.engine.standin.server_contract.ServerContract: the one way SGLang's and vLLM's request contracts are found."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agentrl.engine.standin import sglang_contract, vllm_contract
from agentrl.engine.standin.server_contract import ServerContract
from agentrl.errors import MissingDependencyError

MEMBERS = ("fakepkg_contract/api/types.py", "fakepkg_contract/extra.py")
C = ServerContract("fakepkg_contract", "1.2.3", MEMBERS, "AGENTRL_TEST_CONTRACT", "python -m fake fetch", "the fake API")


def _tree(root: Path, members: tuple[str, ...] = MEMBERS) -> Path:
    for m in members:
        (root / m).parent.mkdir(parents=True, exist_ok=True)
        (root / m).write_text("# member\n")
    return root


def test_env_var_then_installed_package_then_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(C.env_var, raising=False)
    cache = tmp_path / "cache"
    assert C.find(cache) is None
    _tree(C.cache_root(cache))
    assert C.cache_root(cache) == cache / "fakepkg_contract" / "1.2.3"
    assert C.find(cache) == {m: C.cache_root(cache) / m for m in MEMBERS}

    site = _tree(tmp_path / "site")
    (site / "fakepkg_contract" / "__init__.py").write_text("raise RuntimeError('never imported')\n")
    monkeypatch.syspath_prepend(str(site))
    assert C.find(cache) == {m: site / m for m in MEMBERS}, "an installed package wins over the cache"
    assert "fakepkg_contract" not in sys.modules
    assert C.root(C.find(cache) or {}) == site

    monkeypatch.setenv(C.env_var, str(tmp_path / "missing"))
    assert C.find(cache) is None, "an explicit path that is not there is not silently replaced"
    explicit = _tree(tmp_path / "explicit")
    monkeypatch.setenv(C.env_var, str(explicit))
    assert C.find(cache) == {m: explicit / m for m in MEMBERS}
    (explicit / MEMBERS[1]).unlink()
    assert C.find(cache) is None, "an incomplete directory does not count"


def test_a_single_file_contract_may_be_named_by_its_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    one = ServerContract("fakepkg_one", "1", ("fakepkg_one/api.py",), "AGENTRL_TEST_ONE", "fetch", "one file")
    lone = tmp_path / "anywhere.py"
    lone.write_text("")
    monkeypatch.setenv(one.env_var, str(lone))
    assert one.find(tmp_path) == {"fakepkg_one/api.py": lone} and one.root({"fakepkg_one/api.py": lone}) == tmp_path


def test_validator_falls_back_with_the_fix_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(C.env_var, raising=False)
    assert C.validator(lambda files: "real", lambda why: why, tmp_path) == \
        "fallback (the fake API not found: run `python -m fake fetch`)"
    _tree(C.cache_root(tmp_path))

    def broken(files: dict[str, Path]) -> str:
        raise MissingDependencyError("needs msgspec")

    assert C.validator(broken, lambda why: why, tmp_path) == "fallback (needs msgspec)"
    assert C.validator(lambda files: sorted(files), lambda why: why, tmp_path) == sorted(MEMBERS)


def test_main_prints_usage_for_anything_but_fetch(capsys: pytest.CaptureFixture[str]) -> None:
    assert C.main(["pull"]) == 2 and "usage: python -m fake fetch" in capsys.readouterr().err


def test_both_servers_use_it() -> None:
    assert sglang_contract.CONTRACT.members == ("sglang/api/v1/api_types.py",)
    assert sglang_contract.CONTRACT.env_var == "AGENTRL_SGLANG_CONTRACT"
    assert vllm_contract.CONTRACT.env_var == "AGENTRL_VLLM_CONTRACT"
    assert "vllm/entrypoints/openai/completion/protocol.py" in vllm_contract.CONTRACT.members
    assert sglang_contract.CONTRACT.fetch_command == "python -m agentrl.engine.standin.sglang_contract fetch"
    assert vllm_contract.CONTRACT.fetch_command == "python -m agentrl.engine.standin.vllm_contract fetch"
