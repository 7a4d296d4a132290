"""The public testing API that docs/testing.md lists is what the package ships: every documented name imports, and
the project's own scaffolding (the fake Kubernetes API edge and kubelet) is not in the package."""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "testing.md"


def _documented() -> list[tuple[str, str]]:
    """(module, name) for every name in the first column of the public API table (`agentrl.a.b.Name(...)` or a
    bare `Name` after it, meaning the same module); name "" for a module listed as a whole."""
    table = DOC.read_text().split("## The public testing API", 1)[1].split("\n## ", 1)[0]
    found: list[tuple[str, str]] = []
    for row in table.splitlines():
        if not row.startswith("| `agentrl."):
            continue
        module = ""
        for token in re.findall(r"`([^`]+)`", row.split("|")[1]):
            token = token.split("(", 1)[0]
            if token.startswith("agentrl."):
                try:
                    importlib.import_module(token)
                    module, name = token, ""
                except ModuleNotFoundError:
                    module, _, name = token.rpartition(".")
                found.append((module, name))
            elif token.isidentifier() and module:
                found.append((module, token))
    return found


def test_every_documented_name_imports() -> None:
    documented = _documented()
    assert len(documented) >= 15, documented
    for module, name in documented:
        mod = importlib.import_module(module)
        if name:
            assert hasattr(mod, name), f"docs/testing.md lists {module}.{name}, which does not exist"


@pytest.mark.parametrize("module", ["agentrl.testing.fake_k8s", "agentrl.testing.fake_kubelet"])
def test_kubernetes_fakes_are_test_scaffolding_not_package(module: str) -> None:
    assert importlib.util.find_spec(module) is None, f"{module} belongs under tests/k8s"
    assert (ROOT / "tests" / "k8s" / f"{module.rsplit('.', 1)[1]}.py").is_file()
