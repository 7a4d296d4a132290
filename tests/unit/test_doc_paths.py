"""The docs cannot drift silently from the tree: every relative link and every backticked repository path in
docs/architecture.md and README.md names something that exists, and no tracked file points readers at a design
note outside the repository (the product explains itself in docs/)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("docs/architecture.md", "README.md")
TOP = {p.name for p in ROOT.iterdir() if not p.name.startswith(".git")} - {"runs", ".venv"}
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
TICKED = re.compile(r"`([^`\n]+)`")
PATHLIKE = re.compile(r"^[\w.-]+(/[\w.*-]+)*/?$")


def doc_paths(text: str) -> list[str]:
    """Relative links, and backticked spans whose first word is a path inside the repo (its first segment is a
    top-level entry: `agentrl/...`, `docs/...`, `k8s/...`, `pyproject.toml`); URLs, anchors, `~/...`, `runs/...`
    (what a run writes) and code such as `agentrl.config.RolloutConfig` are not repo paths."""
    found = [m for m in LINK.findall(text) if not re.match(r"^[a-z]+:|^#", m)]
    for span in TICKED.findall(text):
        word = span.split()[0] if span.split() else ""
        if PATHLIKE.match(word) and word.split("/")[0] in TOP and ("/" in word or "." in word):
            found.append(word)
    return found


def exists(path: str, base: Path) -> bool:
    target = path.split("#")[0]
    if "*" in target:
        return any(ROOT.glob(target))
    return (base / target).exists() or (ROOT / target).exists()


def test_the_path_finder_sees_links_and_paths_and_skips_code() -> None:
    text = ("see [envs](envs.md#x), [site](https://example.org), `agentrl/runner/` and `docs/nope.md` and "
            "`sandbox_images/build.sh --offline-base`, `agentrl.config.RolloutConfig`, `runs/demo`, `~/.cache/x`, "
            "`pyproject.toml`, `tests/unit/test_*.py`, `solution.py`")
    assert doc_paths(text) == ["envs.md#x", "agentrl/runner/", "docs/nope.md", "sandbox_images/build.sh",
                               "pyproject.toml", "tests/unit/test_*.py"]
    assert not exists("docs/nope.md", ROOT / "docs") and exists("tests/unit/test_*.py", ROOT)


@pytest.mark.parametrize("doc", DOCS)
def test_every_path_a_doc_names_exists(doc: str) -> None:
    path = ROOT / doc
    paths = doc_paths(path.read_text())
    assert paths, f"{doc}: no paths found (the finder is broken)"
    missing = [p for p in paths if not exists(p, path.parent)]
    assert not missing, f"{doc} names paths that do not exist: {missing}"


def test_nothing_points_at_a_design_note_outside_the_repo() -> None:
    banned = ("DESIGN" + ".md", "../" + "shared")
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    hits = []
    for name in files:
        p = ROOT / name
        if p.suffix not in (".py", ".md", ".toml", ".yaml", ".yml", ".sh", ".txt", "") or not p.is_file():
            continue
        text = p.read_text(errors="replace")
        hits += [f"{name}: {b}" for b in banned if b in text]
    assert not hits, hits
