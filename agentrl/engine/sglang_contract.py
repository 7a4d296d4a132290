"""SGLang's own JSON contract for `/generate` bodies, used by the stand-in server to judge requests like SGLang does.

Owns: finding SGLang 0.5.23's generated contract module (`sglang/api/v1/api_types.py`), loading it WITHOUT importing
the `sglang` package (its `__init__` pulls in torch 2.14 and patches transformers), fetching it once from PyPI into
the agentrl cache, and a hand-written fallback validator used only when the real contract is unavailable.

Where the contract comes from, first hit wins:

    $AGENTRL_SGLANG_CONTRACT                      a path to an api_types.py
    an installed `sglang` distribution            <site-packages>/sglang/api/v1/api_types.py (located, not imported)
    <cache>/sglang/0.5.23/api_types.py            written by `fetch_contract()`
                                                  (`python -m agentrl.engine.sglang_contract fetch`)

The module needs only `msgspec`. SGLang's HTTP server answers a violating body with HTTP 400 `{"error": <text>}`,
where <text> is `str(JsonContractError)`; `GenerateValidator.check(body)` returns that same text (or None).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.engine.models import default_cache_dir
from agentrl.errors import MissingDependencyError

SGLANG_VERSION = "0.5.23"
CONTRACT_MEMBER = "sglang/api/v1/api_types.py"
ENV_VAR = "AGENTRL_SGLANG_CONTRACT"
FETCH_COMMAND = "python -m agentrl.engine.sglang_contract fetch"

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


def cached_contract_path(cache_dir: Path | None = None) -> Path:
    root = cache_dir if cache_dir is not None else default_cache_dir().parent
    return root / "sglang" / SGLANG_VERSION / "api_types.py"


def find_contract(cache_dir: Path | None = None) -> Path | None:
    """The contract file from the env var, an installed sglang, or the cache (see module docstring); None if absent."""
    explicit = os.environ.get(ENV_VAR)
    if explicit:
        return Path(explicit) if Path(explicit).is_file() else None
    spec = importlib.util.find_spec("sglang")  # locating a top-level package does not execute its __init__
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / "api" / "v1" / "api_types.py"
        if candidate.is_file():
            return candidate
    cached = cached_contract_path(cache_dir)
    return cached if cached.is_file() else None


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
    path = find_contract(cache_dir)
    if path is None:
        return GenerateValidator(_fallback_check, f"fallback (contract not found: run `{FETCH_COMMAND}`)")
    try:
        module = load_contract(path)
    except MissingDependencyError as exc:
        return GenerateValidator(_fallback_check, f"fallback ({exc})")
    request, error = module.GenerateRequest, module.JsonContractError

    def check(body: Any) -> str | None:  # the body of sglang/srt/entrypoints/api_contract.py, verbatim
        try:
            request.from_json_value(body)
        except error as exc:
            return str(exc)
        return None

    return GenerateValidator(check, f"sglang {SGLANG_VERSION} contract ({path})")


def fetch_contract(cache_dir: Path | None = None) -> Path:
    """Download the sglang wheel (no dependencies) from the package index and keep only the contract file.

    Blocking (a subprocess + a 40 MB download): for set-up scripts and test fixtures, never inside async code.
    """
    target = cached_contract_path(cache_dir)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="agentrl-sglang-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
               f"sglang=={SGLANG_VERSION}", "-d", tmp]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
        wheels = sorted(Path(tmp).glob("sglang-*.whl"))
        if result.returncode != 0 or not wheels:
            raise MissingDependencyError(
                f"could not download sglang=={SGLANG_VERSION} to extract its API contract "
                f"({result.stderr.strip()[-500:]}); or set {ENV_VAR} to an api_types.py")
        with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(CONTRACT_MEMBER) as src:
            partial = target.with_suffix(".tmp")
            with partial.open("wb") as dst:
                shutil.copyfileobj(src, dst)
        os.replace(partial, target)
    return target


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


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args != ["fetch"]:
        print(f"usage: {FETCH_COMMAND}", file=sys.stderr)
        return 2
    print(fetch_contract())
    return 0


if __name__ == "__main__":
    sys.exit(main())
