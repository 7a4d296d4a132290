"""SGLang's own JSON contract for `/generate` bodies, used by the stand-in server to judge requests like SGLang does.

Owns: loading SGLang 0.5.23's generated contract module (`sglang/api/v1/api_types.py`) WITHOUT importing the
`sglang` package (its `__init__` pulls in torch 2.14 and patches transformers), and a hand-written fallback validator
used only when the real contract is unavailable. Finding and fetching the file is `server_contract.py`'s (`CONTRACT`):

    $AGENTRL_SGLANG_CONTRACT                      a path to an api_types.py
    an installed `sglang` distribution            <site-packages>/sglang/api/v1/api_types.py (located, not imported)
    <cache>/sglang/0.5.23/sglang/api/v1/...       written by `fetch_contract()`
                                                  (`python -m agentrl.engine.standin.sglang_contract fetch`)

The module needs only `msgspec`. SGLang's HTTP server answers a violating body with HTTP 400 `{"error": <text>}`,
where <text> is `str(JsonContractError)`; `GenerateValidator.check(body)` returns that same text (or None).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.engine.standin.server_contract import ServerContract
from agentrl.errors import MissingDependencyError

SGLANG_VERSION = "0.5.23"
CONTRACT_MEMBER = "sglang/api/v1/api_types.py"
ENV_VAR = "AGENTRL_SGLANG_CONTRACT"
FETCH_COMMAND = "python -m agentrl.engine.standin.sglang_contract fetch"
CONTRACT = ServerContract("sglang", SGLANG_VERSION, (CONTRACT_MEMBER,), ENV_VAR, FETCH_COMMAND, "SGLang's API contract")

#: SGLang 0.5.23 `SamplingParams` fields, in contract order (only for the fallback validator's messages).
SAMPLING_FIELDS = (
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "json_schema", "regex",
    "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim",
    "stream_interval", "logit_bias", "sampling_seed", "custom_params", "beam_width", "watermark", "choice",
)
_INT_FIELDS = ("max_new_tokens", "top_k", "min_new_tokens", "n", "stream_interval", "sampling_seed", "beam_width")
_FLOAT_FIELDS = ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty")
_BOOL_FIELDS = ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim")


@dataclass(frozen=True)
class GenerateValidator:
    """Judges a parsed `/generate` JSON body: `check(body)` is None when admitted, else SGLang's error text."""

    check: Callable[[Any], str | None]
    source: str  # "sglang 0.5.23 contract (<path>)" or "fallback (<why>)"

    @property
    def is_real(self) -> bool:
        return not self.source.startswith("fallback")


def find_contract(cache_dir: Path | None = None) -> Path | None:
    """The contract file from the env var, an installed sglang, or the cache (see module docstring); None if absent."""
    files = CONTRACT.find(cache_dir)
    return files[CONTRACT_MEMBER] if files else None


def load_contract(path: Path) -> Any:
    """Import `api_types.py` from `path` as a private module (never as `sglang.*`)."""
    if importlib.util.find_spec("msgspec") is None:
        raise MissingDependencyError("the SGLang contract needs msgspec: run `pip install msgspec`")
    spec = importlib.util.spec_from_file_location("agentrl_sglang_api_types", path)
    if spec is None or spec.loader is None:
        raise MissingDependencyError(f"cannot load the SGLang contract from {path}: rerun `{FETCH_COMMAND}`")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def generate_validator(cache_dir: Path | None = None) -> GenerateValidator:
    """The real contract when it can be found and loaded, else the fallback (its `source` says why)."""
    return CONTRACT.validator(_real_validator, lambda why: GenerateValidator(_fallback_check, why), cache_dir)


def _real_validator(files: dict[str, Path]) -> GenerateValidator:
    path = files[CONTRACT_MEMBER]
    module = load_contract(path)
    request, error = module.GenerateRequest, module.JsonContractError

    def check(body: Any) -> str | None:  # the body of sglang/srt/entrypoints/api_contract.py, verbatim
        try:
            request.from_json_value(body)
        except error as exc:
            return str(exc)
        return None

    return GenerateValidator(check, f"sglang {SGLANG_VERSION} contract ({path})")


def fetch_contract(cache_dir: Path | None = None) -> Path:
    """Download the sglang wheel (no dependencies, ~40 MB) and keep only the contract file; its path. Blocking."""
    return CONTRACT.fetch(cache_dir) / CONTRACT_MEMBER


# -- fallback: the subset of the contract agentrl's client uses, with the same error texts -----------------------

def _fallback_check(body: Any) -> str | None:
    if not isinstance(body, dict):
        return f"invalid type: {_describe(body)}, expected struct GenerateRequest"
    params = body.get("sampling_params")
    for item in params if isinstance(params, list) else [params]:
        if item is None:
            continue
        if not isinstance(item, dict):
            return f"invalid type: {_describe(item)}, expected struct SamplingParams"
        error = _check_sampling(item)
        if error:
            return error
    return None


def _check_sampling(params: dict[str, Any]) -> str | None:
    for key, value in params.items():
        if key not in SAMPLING_FIELDS:
            listed = ", ".join(f"`{f}`" for f in SAMPLING_FIELDS)
            return f"unknown field `{key}`, expected one of {listed}"
        if value is None:
            continue
        if key in _INT_FIELDS and (not isinstance(value, int) or isinstance(value, bool)):
            return f"invalid type: {_describe(value)}, expected i64"
        if key in _FLOAT_FIELDS and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            return f"invalid type: {_describe(value)}, expected f64"
        if key in _BOOL_FIELDS and not isinstance(value, bool):
            return f"invalid type: {_describe(value)}, expected a boolean"
    return None


def _describe(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"boolean `{'true' if v else 'false'}`"
    if isinstance(v, int):
        return f"integer `{v}`"
    if isinstance(v, float):
        return f"floating point `{v}`"
    if isinstance(v, str):
        return f'string "{v}"'
    return "sequence" if isinstance(v, list) else "map" if isinstance(v, dict) else type(v).__name__


if __name__ == "__main__":
    sys.exit(CONTRACT.main())
