"""vLLM's own request models for `/v1/completions`, used by the stand-in server to judge requests like vLLM does.

Owns: loading vLLM 0.33.0's protocol sources WITHOUT importing the `vllm` package (its `__init__` pulls in torch 2.x
builds, CUDA kernels, zmq...), and a hand-written fallback used only when the real sources are unavailable. Finding
and fetching the files is `server_contract.py`'s (`CONTRACT`).

What runs is vLLM's code, verbatim: `CompletionRequest` (vllm/entrypoints/openai/completion/protocol.py, a pydantic
model, with its `model_validator`s) and `SamplingParams` (vllm/sampling_params.py, whose `_verify_args` rejects
e.g. temperature > 2 or top_k < -1), plus the modules they need that are pure Python (`vllm.envs`, `vllm.exceptions`,
`vllm.logprobs`, the two base protocol modules, `vllm.utils.collection_utils`). Their other imports (`vllm.config`,
`vllm.logger`, `vllm.renderers`, `vllm.tokenizers`, `vllm.outputs`, `vllm.v1.serial_utils`, ...) would drag in torch
and the engine, so they are STUBBED: small modules with the names those files import (`WeightVersionSpan` and
`PydanticMsgspecMixin` are the real class bodies, cut out of their files with `ast`). The stubs are installed in
`sys.modules` only while loading and while checking one body, then removed: a real `vllm`, if any, is untouched.

Where the sources come from, first hit wins:

    $AGENTRL_VLLM_CONTRACT                a directory holding `vllm/...` (e.g. an unpacked wheel)
    an installed `vllm` distribution      located with importlib (not imported)
    <cache>/vllm/0.33.0/                  written by `fetch_contract()` (`python -m
    agentrl.engine.standin.vllm_contract fetch`)

vLLM's gate, reproduced by `CompletionValidator.check(body)` (None when admitted, else (status, message)):
    1. FastAPI parses the body into `CompletionRequest`: a pydantic error is HTTP 400 "N validation error(s): ...".
    2. `request.to_sampling_params(max_tokens)` builds vLLM's `SamplingParams`: a `VLLMValidationError` is HTTP 400.
One deliberate difference: `CompletionRequest` has `extra="allow"`, so real vLLM IGNORES an unknown field (a
misspelt sampling name changes sampling without any error; it only logs at debug level). The stand-in refuses it
with HTTP 400 instead, so a wrong name in agentrl's client fails the tests rather than silently sampling differently.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import logging
import sys
import types
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.engine.standin.server_contract import ServerContract
from agentrl.errors import MissingDependencyError

VLLM_VERSION = "0.33.0"
ENV_VAR = "AGENTRL_VLLM_CONTRACT"
FETCH_COMMAND = "python -m agentrl.engine.standin.vllm_contract fetch"

#: the real vLLM modules loaded, in dependency order (module name, path inside the wheel)
REAL_MODULES = (
    ("vllm.envs", "vllm/envs.py"),
    ("vllm.exceptions", "vllm/exceptions.py"),
    ("vllm.logprobs", "vllm/logprobs.py"),
    ("vllm.utils.collection_utils", "vllm/utils/collection_utils.py"),
    ("vllm.sampling_params", "vllm/sampling_params.py"),
    ("vllm.entrypoints.serve.engine.protocol", "vllm/entrypoints/serve/engine/protocol.py"),
    ("vllm.entrypoints.generate.base.protocol", "vllm/entrypoints/generate/base/protocol.py"),
    ("vllm.entrypoints.openai.completion.protocol", "vllm/entrypoints/openai/completion/protocol.py"),
)
#: files a class body is cut out of (module name, path, class)
CUT_CLASSES = (
    ("vllm.outputs", "vllm/outputs.py", "WeightVersionSpan"),
    ("vllm.v1.serial_utils", "vllm/v1/serial_utils.py", "PydanticMsgspecMixin"),
)
MEMBERS = tuple(p for _, p in REAL_MODULES) + tuple(p for _, p, _ in CUT_CLASSES)
CONTRACT = ServerContract("vllm", VLLM_VERSION, MEMBERS, ENV_VAR, FETCH_COMMAND, "vLLM's request models",
                          fetch_timeout_s=1800)

#: CompletionRequest's sampling-related fields (fallback only: names the fields agentrl's client may send)
FALLBACK_FIELDS = frozenset({
    "model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop_token_ids", "logprobs",
    "return_tokens_as_token_ids", "return_token_ids", "return_weight_versions", "skip_special_tokens",
    "include_stop_str_in_output", "ignore_eos", "min_tokens", "n", "stream", "echo", "request_id", "session_id",
    "add_special_tokens", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "stop",
})


@dataclass(frozen=True)
class CompletionValidator:
    """Judges a parsed `/v1/completions` body: `check(body, context_window)` is None when admitted, else
    (HTTP status, message) as vLLM would answer (plus the stand-in's refusal of unknown fields)."""

    check: Callable[[Any, int], tuple[int, str] | None]
    source: str  # "vllm 0.33.0 protocol (<dir>)" or "fallback (<why>)"
    field_names: frozenset[str] = FALLBACK_FIELDS

    @property
    def is_real(self) -> bool:
        return not self.source.startswith("fallback")


def find_contract(cache_dir: Path | None = None) -> Path | None:
    """The directory holding `vllm/...` sources (see the module docstring), or None."""
    files = CONTRACT.find(cache_dir)
    return CONTRACT.root(files) if files else None


# -- loading with stubs --------------------------------------------------------------------------------------------

@dataclass
class LoadedContract:
    modules: dict[str, types.ModuleType]
    root: Path

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Put the contract's `vllm.*` modules in sys.modules for the duration (lazy imports inside vLLM's
        validators resolve to them), then restore whatever was there before."""
        with _vllm_modules_restored():
            sys.modules.update(self.modules)
            yield

    @property
    def completion_request(self) -> Any:
        return self.modules["vllm.entrypoints.openai.completion.protocol"].CompletionRequest

    @property
    def validation_error(self) -> type[Exception]:
        return self.modules["vllm.exceptions"].VLLMValidationError


def load_contract(root: Path) -> LoadedContract:
    """Load vLLM's request models from `root` (see the module docstring for what is real and what is stubbed)."""
    for module in ("pydantic", "msgspec", "numpy"):
        if importlib.util.find_spec(module) is None:
            raise MissingDependencyError(f"vLLM's request models need {module}: run `pip install {module}`")
    contract = LoadedContract(modules=_stub_modules(root), root=root)
    with contract.installed():
        for name, member in REAL_MODULES:
            module = _new_module(contract.modules, name, root / member)
            try:
                exec(compile((root / member).read_text(), str(root / member), "exec"), module.__dict__)  # noqa: S102
            except Exception as exc:
                raise MissingDependencyError(f"cannot load vLLM {VLLM_VERSION}'s {member} with agentrl's stubs "
                                             f"({type(exc).__name__}: {exc}); rerun `{FETCH_COMMAND}`") from exc
    return contract


def _new_module(modules: dict[str, types.ModuleType], name: str, path: Path | None = None) -> types.ModuleType:
    """A module `name` (and its parent packages) registered in `modules` and, while installed, sys.modules."""
    parts = name.split(".")
    for i in range(1, len(parts)):
        pkg = ".".join(parts[:i])
        if pkg not in modules:
            package = types.ModuleType(pkg)
            package.__path__ = []
            modules[pkg] = sys.modules[pkg] = package
            if i > 1:
                setattr(modules[".".join(parts[: i - 1])], parts[i - 1], package)
    module = modules.get(name) or types.ModuleType(name)
    if path is not None:
        module.__file__ = str(path)
    modules[name] = sys.modules[name] = module
    if len(parts) > 1:
        setattr(modules[".".join(parts[:-1])], parts[-1], module)
    return module


class _Logger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """vllm.logger's logger: the standard one plus the *_once methods vLLM calls."""

    def warning_once(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self.debug(msg, *args)

    info_once = debug_once = warning_once


class _Placeholder:
    """A stubbed vLLM class that the loaded files only name in annotations or never reach on the checked path."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("agentrl's vLLM contract stub: this vLLM class is not loaded")


def _stub_modules(root: Path) -> dict[str, types.ModuleType]:
    modules: dict[str, types.ModuleType] = {}
    with _vllm_modules_restored():
        def stub(name: str, **attrs: Any) -> None:
            module = _new_module(modules, name)
            module.__dict__.update(attrs)

        stub("vllm.logger", init_logger=lambda name: _Logger(logging.getLogger(f"agentrl.{name}"), {}))
        stub("vllm.config", ModelConfig=_Placeholder, SpeculativeConfig=_Placeholder,
             StructuredOutputsConfig=_Placeholder, VllmConfig=_Placeholder)
        import dataclasses

        stub("vllm.config.utils", replace=dataclasses.replace)
        stub("vllm.utils", random_uuid=lambda: uuid.uuid4().hex)
        stub("vllm.utils.mistral", is_mistral_tokenizer=lambda tokenizer: False)
        stub("vllm.utils.torch_utils", make_ndarray_with_pad=_Placeholder)
        stub("vllm.tokenizers", TokenizerLike=Any)
        stub("vllm.renderers", TokenizeParams=_Placeholder)
        stub("vllm.renderers.chat_utils", make_tool_call_id=lambda: f"chatcmpl-tool-{uuid.uuid4().hex}")
        for name, member, cls in CUT_CLASSES:
            module = _new_module(modules, name, root / member)
            exec(compile(_cut_class(root / member, cls), str(root / member), "exec"), module.__dict__)  # noqa: S102
    return modules


@contextlib.contextmanager
def _vllm_modules_restored() -> Iterator[None]:
    """On exit, sys.modules' `vllm` entries are exactly what they were on entry (a real vllm stays untouched)."""
    saved = {k: v for k, v in sys.modules.items() if k == "vllm" or k.startswith("vllm.")}
    try:
        yield
    finally:
        for k in [k for k in sys.modules if k == "vllm" or k.startswith("vllm.")]:
            del sys.modules[k]
        sys.modules.update(saved)


def _cut_class(path: Path, cls: str) -> str:
    """The source of class `cls` of `path` with its decorators, preceded by the file's stdlib/typing imports that
    it may need (imports of torch, zmq, cloudpickle and vllm itself dropped)."""
    source = path.read_text()
    tree = ast.parse(source)
    keep: list[str] = ["from dataclasses import dataclass", "from typing import Any, ClassVar, get_type_hints",
                       "import msgspec", "from pydantic import GetCoreSchemaHandler",
                       "from pydantic_core import core_schema"]
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            start = min([d.lineno for d in node.decorator_list] + [node.lineno])
            lines = source.splitlines()[start - 1 : node.end_lineno]
            return "\n".join(keep + lines) + "\n"
    raise MissingDependencyError(f"class {cls} not found in {path}: not vLLM {VLLM_VERSION}? rerun `{FETCH_COMMAND}`")


# -- the validator ---------------------------------------------------------------------------------------------------

def completion_validator(cache_dir: Path | None = None) -> CompletionValidator:
    """vLLM's own models when they can be found and loaded, else the fallback (its `source` says why)."""
    return CONTRACT.validator(_real_validator, lambda why: CompletionValidator(_fallback_check, why), cache_dir)


def _real_validator(files: dict[str, Path]) -> CompletionValidator:
    root = CONTRACT.root(files)
    contract = load_contract(root)
    request_cls, error_cls = contract.completion_request, contract.validation_error
    names = frozenset(request_cls.model_fields) | frozenset(
        f.alias for f in request_cls.model_fields.values() if f.alias)

    def check(body: Any, context_window: int) -> tuple[int, str] | None:
        from pydantic import ValidationError

        with contract.installed():
            try:
                request = request_cls.model_validate(body)
            except ValidationError as exc:
                return 400, _validation_message(exc)
            except error_cls as exc:  # raised by a model_validator; vLLM's exception handler makes it a 400
                return 400, str(exc)
            unknown = sorted(set(body) - names) if isinstance(body, dict) else []
            if unknown:
                return 400, (f"unknown field(s) {unknown}: vLLM {VLLM_VERSION}'s CompletionRequest does not define "
                             "them (the real server ignores them silently; the agentrl stand-in refuses them)")
            try:
                request.to_sampling_params(_max_tokens(request, body, context_window), {})
            except (error_cls, ValueError) as exc:
                return 400, str(exc)
        return None

    return CompletionValidator(check, f"vllm {VLLM_VERSION} protocol ({root})", names)


def _max_tokens(request: Any, body: dict[str, Any], context_window: int) -> int:
    """vLLM's `get_max_tokens`: min(requested, context - prompt) (the context check itself is the server's)."""
    prompt = body.get("prompt")
    n_prompt = len(prompt) if isinstance(prompt, list) and prompt and isinstance(prompt[0], int) else 0
    room = max(1, context_window - n_prompt)
    return min(request.max_tokens, room) if request.max_tokens is not None else room


def _validation_message(exc: Any) -> str:
    """The shape of vLLM's validation_exception_handler message: "N validation error(s):" + one line each."""
    errors = exc.errors()
    label = "error" if len(errors) == 1 else "errors"
    lines = [f"{len(errors)} validation {label}:"]
    for err in errors[:10]:
        loc = ".".join(str(p) for p in err.get("loc", ()) if "[" not in str(p) and "(" not in str(p))
        lines.append(f"  {{'type': {err.get('type')!r}, 'loc': {('body.' + loc) if loc else 'body'!r}, "
                     f"'msg': {err.get('msg')!r}}}")
    return "\n".join(lines)


def fetch_contract(cache_dir: Path | None = None) -> Path:
    """Download the vllm wheel (no dependencies, ~340 MB) and keep only `MEMBERS`; their root. Blocking."""
    return CONTRACT.fetch(cache_dir)


# -- fallback: names and types of the fields agentrl's client sends ----------------------------------------------

_FALLBACK_INT = ("max_tokens", "top_k", "seed", "logprobs", "n", "min_tokens")
_FALLBACK_FLOAT = ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")
_FALLBACK_BOOL = ("return_tokens_as_token_ids", "return_token_ids", "return_weight_versions", "skip_special_tokens",
                  "include_stop_str_in_output", "ignore_eos", "stream", "echo", "add_special_tokens")


def _fallback_check(body: Any, context_window: int) -> tuple[int, str] | None:
    if not isinstance(body, dict):
        return 400, "1 validation error: the body must be a JSON object"
    unknown = sorted(set(body) - FALLBACK_FIELDS)
    if unknown:
        return 400, f"unknown field(s) {unknown} (fallback validator: fetch vLLM's models with `{FETCH_COMMAND}`)"
    for key, value in body.items():
        if value is None:
            continue
        if key in _FALLBACK_INT and (not isinstance(value, int) or isinstance(value, bool)):
            return 400, f"1 validation error: {key} must be an integer, got {value!r}"
        if key in _FALLBACK_FLOAT and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            return 400, f"1 validation error: {key} must be a number, got {value!r}"
        if key in _FALLBACK_BOOL and not isinstance(value, bool):
            return 400, f"1 validation error: {key} must be a boolean, got {value!r}"
    temperature = body.get("temperature")
    if isinstance(temperature, (int, float)) and not 0.0 <= temperature <= 2.0:
        return 400, f"temperature must be in [0, 2], got {temperature}."
    return None


if __name__ == "__main__":
    sys.exit(CONTRACT.main())
