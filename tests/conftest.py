"""Shared fixtures: the embedded model (converted once per machine), a tiny random model with its tokenizer, and
tier gating (docker/k8s/gpu skip with a reason unless the environment says the resource must exist).

Bubblewrap gating: tests marked `bwrap` (and every test of BWRAP_MODULES, whose tests run `agentrl` in a child
process, where a missing bubblewrap only shows as an exit code) skip with the reason when bubblewrap is missing or
cannot create namespaces here; and on such a machine, a test that fails *because of* bubblewrap (its failure names bubblewrap / bwrap) is
reported as skipped with the same reason, so a missing system package is never a test failure. Both are off when
AGENTRL_REQUIRE_BWRAP=1 (CI): then every such test fails. On a machine where bubblewrap works nothing is rewritten.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

BWRAP_FIX = "apt-get install -y bubblewrap (make test installs it when it runs as root or with sudo -n)"
_BWRAP_WORDS = ("bubblewrap", "bwrap")
BWRAP_MODULES = frozenset({"test_cli_rollout.py", "test_trainer.py", "test_learning.py"})


@functools.cache
def bwrap_problem() -> str | None:
    """Why bubblewrap cannot isolate sandboxes here, or None when it can (probed once per session)."""
    if shutil.which("bwrap") is None:
        return f"bubblewrap is not installed: {BWRAP_FIX}"
    try:
        probe = subprocess.run(["bwrap", "--unshare-user", "--unshare-pid", "--unshare-net", "--ro-bind", "/", "/",
                                "--", "/bin/true"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap does not run here: {exc}"
    if probe.returncode != 0:
        return f"bubblewrap cannot create namespaces here: {probe.stderr.strip()} (see `agentrl doctor`)"
    return None


def _bwrap_required() -> bool:
    return os.environ.get("AGENTRL_REQUIRE_BWRAP") == "1"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "bwrap: needs working bubblewrap (AGENTRL_REQUIRE_BWRAP=1 turns a skip into a "
                                       "failure)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in BWRAP_MODULES:
            item.add_marker(pytest.mark.bwrap)
    marked = [item for item in items if item.get_closest_marker("bwrap") is not None]
    if not marked or _bwrap_required() or bwrap_problem() is None:
        return
    skip = pytest.mark.skip(reason=f"bwrap tier: {bwrap_problem()}")
    for item in marked:
        item.add_marker(skip)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if not report.failed or _bwrap_required() or call.excinfo is None:
        return
    text = str(report.longrepr).lower()
    if any(word in text for word in _BWRAP_WORDS) and bwrap_problem() is not None:
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: bwrap tier: {bwrap_problem()}")


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    from agentrl.engine.models import resolve_model

    return resolve_model(None)


@pytest.fixture(scope="session")
def tiny_model_path(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agentrl.testing.models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny-model"), tokenizer_from=smollm2_path)


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_path: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path)


@pytest.fixture(scope="session")
def eos_prone_model(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random model, edited so it ends turns on its own: one residual dimension is held constant (every
    token embedding has C there and no layer writes to it), and the end-of-turn embedding row (tied to the LM head)
    has extra weight on it, so P(end-of-turn) is roughly 5-20% per step instead of 1/vocab."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    d0, c = 0, 20.0
    with torch.no_grad():
        emb = model.get_input_embeddings().weight
        emb[:, d0] = c
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[d0, :] = 0.0
            layer.mlp.down_proj.weight[d0, :] = 0.0
        head = model.get_output_embeddings().weight
        if head.data_ptr() != emb.data_ptr():
            head[:, d0] = 0.0
        head[tok.eos_token_id, d0] += 2.5
    out = tmp_path_factory.mktemp("eos-prone")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
