"""SGLang's and vLLM's own request models for the LoRA-adapter control calls, used by the stand-ins to judge them.

Owns: loading the real request classes WITHOUT importing either package, and judging a body the way each server's
FastAPI route does. Finding and fetching the files is `server_contract.py`'s (`SGLANG_CONTROL`, `VLLM_LORA`; they
share each package's cache dir with the generate contracts):

    SGLang 0.5.23  sglang/srt/managers/io_struct.py       LoadLoRAAdapterReqInput, UnloadLoRAAdapterReqInput,
                                                          UpdateWeightVersionReqInput (msgspec Structs, cut out of
                                                          the file with their base BaseReq: the file itself imports
                                                          torch and zmq)
                   sglang/srt/utils/msgspec_utils.py      loaded as is (msgspec + pydantic_core): the pydantic schema
                                                          FastAPI validates those Structs with
    vLLM 0.33.0    vllm/entrypoints/serve/lora/protocol.py   LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest
                                                          (pydantic), loaded as is

A violating body is HTTP 400 on both servers (each overrides FastAPI's 422). One deliberate difference, as for the
generate contracts: both servers IGNORE unknown fields (SGLang's schema has extra_behavior="ignore", vLLM's models
the pydantic default); the stand-ins refuse them, so a misspelt name in agentrl's client fails the tests.
`python -m agentrl.engine.standin.lora_contract fetch` fetches both.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.engine.standin.server_contract import ServerContract
from agentrl.engine.standin.sglang_contract import SGLANG_VERSION
from agentrl.engine.standin.vllm_contract import VLLM_VERSION
from agentrl.errors import MissingDependencyError

FETCH_COMMAND = "python -m agentrl.engine.standin.lora_contract fetch"
SGLANG_IO_STRUCT = "sglang/srt/managers/io_struct.py"
SGLANG_MSGSPEC_UTILS = "sglang/srt/utils/msgspec_utils.py"
VLLM_LORA_PROTOCOL = "vllm/entrypoints/serve/lora/protocol.py"
SGLANG_CONTROL = ServerContract("sglang", SGLANG_VERSION, (SGLANG_IO_STRUCT, SGLANG_MSGSPEC_UTILS),
                                "AGENTRL_SGLANG_CONTROL_CONTRACT", FETCH_COMMAND, "SGLang's control request models")
VLLM_LORA = ServerContract("vllm", VLLM_VERSION, (VLLM_LORA_PROTOCOL,), "AGENTRL_VLLM_LORA_CONTRACT", FETCH_COMMAND,
                           "vLLM's LoRA request models", fetch_timeout_s=1800)

#: request model by endpoint path
SGLANG_MODELS = {"/load_lora_adapter": "LoadLoRAAdapterReqInput", "/unload_lora_adapter": "UnloadLoRAAdapterReqInput",
                 "/update_weight_version": "UpdateWeightVersionReqInput"}
VLLM_MODELS = {"/v1/load_lora_adapter": "LoadLoRAAdapterRequest", "/v1/unload_lora_adapter": "UnloadLoRAAdapterRequest"}
_SGLANG_CUT = ("BaseReq", *SGLANG_MODELS.values())
#: fallback field names (only when the real models are unavailable)
_FALLBACK = {"/load_lora_adapter": ({"lora_name", "lora_path"}, {"pinned", "lora_id", "rid", "http_worker_ipc"}),
             "/unload_lora_adapter": ({"lora_name"}, {"lora_id", "rid", "http_worker_ipc"}),
             "/update_weight_version": ({"new_version"}, {"abort_all_requests", "rid", "http_worker_ipc"}),
             "/v1/load_lora_adapter": ({"lora_name", "lora_path"}, {"load_inplace", "is_3d_lora_weight"}),
             "/v1/unload_lora_adapter": ({"lora_name"}, {"lora_int_id"})}


@dataclass(frozen=True)
class ControlValidator:
    """`check(path, body)`: None when the server's own model for `path` admits `body`, else the 400 message."""

    check: Callable[[str, Any], str | None]
    source: str  # "sglang 0.5.23 io_struct (<dir>)" / "vllm 0.33.0 lora protocol (<dir>)" or "fallback (<why>)"

    @property
    def is_real(self) -> bool:
        return not self.source.startswith("fallback")


def sglang_control_validator(cache_dir: Path | None = None) -> ControlValidator:
    return SGLANG_CONTROL.validator(_sglang_real, lambda why: ControlValidator(_fallback_check, why), cache_dir)


def vllm_lora_validator(cache_dir: Path | None = None) -> ControlValidator:
    return VLLM_LORA.validator(_vllm_real, lambda why: ControlValidator(_fallback_check, why), cache_dir)


def fetch_contracts(cache_dir: Path | None = None) -> tuple[Path, Path]:
    """Fetch both servers' files into the cache (blocking: a download each)."""
    return SGLANG_CONTROL.fetch(cache_dir), VLLM_LORA.fetch(cache_dir)


# -- SGLang ----------------------------------------------------------------------------------------------------------

def _sglang_real(files: dict[str, Path]) -> ControlValidator:
    return _sglang_loaded(files[SGLANG_IO_STRUCT], files[SGLANG_MSGSPEC_UTILS], SGLANG_CONTROL.root(files))


@functools.lru_cache(maxsize=8)  # every stand-in loads it; parsing io_struct.py takes a while
def _sglang_loaded(io_struct: Path, msgspec_utils: Path, root: Path) -> ControlValidator:
    _need("msgspec", "pydantic", "pydantic_core")
    _load_module("agentrl_sglang_msgspec_utils", msgspec_utils.read_text(), str(msgspec_utils))
    source = "\n".join([
        "from __future__ import annotations", "from typing import Any, Dict, List, Optional, Union", "import msgspec",
        "from agentrl_sglang_msgspec_utils import msgspec_struct_pydantic_core_schema",
        *(_cut(io_struct, cls) for cls in _SGLANG_CUT)])
    models = _load_module("agentrl_sglang_io_struct", source, str(io_struct))
    classes = {path: getattr(models, name) for path, name in SGLANG_MODELS.items()}
    return ControlValidator(_pydantic_check(classes), f"sglang {SGLANG_VERSION} io_struct ({root})")


# -- vLLM ------------------------------------------------------------------------------------------------------------

def _vllm_real(files: dict[str, Path]) -> ControlValidator:
    _need("pydantic")
    path = files[VLLM_LORA_PROTOCOL]
    models = _load_module("agentrl_vllm_lora_protocol", path.read_text(), str(path))
    classes = {p: getattr(models, name) for p, name in VLLM_MODELS.items()}
    return ControlValidator(_pydantic_check(classes), f"vllm {VLLM_VERSION} lora protocol ({VLLM_LORA.root(files)})")


# -- shared ----------------------------------------------------------------------------------------------------------

def _pydantic_check(classes: dict[str, Any]) -> Callable[[str, Any], str | None]:
    """Validate like FastAPI does for a body parameter (pydantic), plus the stand-ins' refusal of unknown fields."""
    from pydantic import TypeAdapter, ValidationError

    adapters = {path: TypeAdapter(cls) for path, cls in classes.items()}
    names = {path: _field_names(cls) for path, cls in classes.items()}

    def check(path: str, body: Any) -> str | None:
        if path not in adapters:
            return f"no request model for {path}"
        try:
            adapters[path].validate_python(body)
        except ValidationError as exc:
            return f"{len(exc.errors())} validation error(s): {exc.errors(include_url=False, include_input=False)}"
        unknown = sorted(set(body) - names[path]) if isinstance(body, dict) else []
        if unknown:
            return (f"unknown field(s) {unknown}: {classes[path].__name__} does not define them (the real server "
                    "ignores them silently; the agentrl stand-in refuses them)")
        return None

    return check


def _field_names(cls: Any) -> set[str]:
    if hasattr(cls, "model_fields"):
        return set(cls.model_fields)
    import msgspec

    return {f.name for f in msgspec.structs.fields(cls)}


def _fallback_check(path: str, body: Any) -> str | None:
    if path not in _FALLBACK:
        return f"no request model for {path}"
    if not isinstance(body, dict):
        return "1 validation error(s): the body must be a JSON object"
    required, optional = _FALLBACK[path]
    missing, unknown = sorted(required - set(body)), sorted(set(body) - required - optional)
    if missing or unknown:
        return f"fallback validator ({FETCH_COMMAND} for the real one): missing {missing}, unknown {unknown}"
    wrong = sorted(k for k in required if not isinstance(body[k], str))
    return f"1 validation error(s): {wrong} must be strings" if wrong else None


def _need(*modules: str) -> None:
    for module in modules:
        if importlib.util.find_spec(module) is None:
            raise MissingDependencyError(f"the servers' request models need {module}: run `pip install {module}`")


def _load_module(name: str, source: str, filename: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__file__ = filename
    previous = sys.modules.get(name)
    sys.modules[name] = module  # msgspec and pydantic resolve string annotations through sys.modules
    try:
        exec(compile(source, filename, "exec"), module.__dict__)  # noqa: S102 - the server's own source file
    except Exception as exc:
        if previous is not None:
            sys.modules[name] = previous
        raise MissingDependencyError(f"cannot load {filename} ({type(exc).__name__}: {exc}); rerun "
                                     f"`{FETCH_COMMAND}`") from exc
    return module


def _cut(path: Path, cls: str) -> str:
    """The source of class `cls` in `path` (decorators included)."""
    source = path.read_text()
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            start = min([d.lineno for d in node.decorator_list] + [node.lineno])
            return "\n".join(source.splitlines()[start - 1: node.end_lineno])
    raise MissingDependencyError(f"class {cls} not found in {path}: not the expected server version? rerun "
                                 f"`{FETCH_COMMAND}`")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args != ["fetch"]:
        print(f"usage: {FETCH_COMMAND}", file=sys.stderr)
        return 2
    for path in fetch_contracts():
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
