"""agentrl.testing.scripted_attacks: the one attack list the rollout attack test, the chaos tier and the chaos
benchmark draw from. What runs them is tested by those; here, that the list itself is sound: every code block is
Python that compiles (they are string literals no syntax check sees otherwise), the families are disjoint, and a
wrong family is refused by name."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from agentrl.testing import sandbox_attacks
from agentrl.testing.scripted_attacks import FAMILIES, HERMES_JSON_ATTACKS, code_attacks, plant


@pytest.mark.parametrize("entry", ["add", "f"])
def test_every_code_block_compiles(entry: str) -> None:
    for name, blocks in code_attacks(entry).items():
        assert blocks, name
        for block in blocks:
            ast.parse(block, filename=name)


def test_families_are_disjoint_and_make_the_whole_list() -> None:
    per_family = [set(code_attacks("f", families=(family,))) for family in FAMILIES]
    assert sum(len(names) for names in per_family) == len(set().union(*per_family)) == len(code_attacks("f"))
    assert not set(HERMES_JSON_ATTACKS) & set(code_attacks("f"))


def test_an_unknown_family_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'kernel'.*grader"):
        code_attacks("f", families=("grader", "kernel"))


def test_a_planted_solution_is_written_verbatim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for name, blocks in code_attacks("add", families=("grader",)).items():
        if blocks[0].startswith("open('solution.py'"):
            exec(compile(blocks[0], name, "exec"), {})  # noqa: S102 - only writes solution.py here
            src = ast.literal_eval(blocks[0].split("write(", 1)[1].rsplit(")\nprint", 1)[0])
            assert (tmp_path / "solution.py").read_text() == src, name
    assert plant("x = 1\n").startswith("open('solution.py', 'w').write(")


def test_the_agent_lookup_is_shared_with_the_control_plane_attacks() -> None:
    """signal_the_agent finds the agent with sandbox_attacks' own lookup: one place to change when the agent's
    command line does."""
    (_, signal) = code_attacks("f", families=("sandbox",))["signal_the_agent"]
    assert signal.startswith(sandbox_attacks.AGENT_LOOKUP)
    assert sandbox_attacks.FIND_AGENT.startswith(sandbox_attacks.AGENT_LOOKUP)
    namespace: dict = {}
    exec(compile(sandbox_attacks.AGENT_LOOKUP, "lookup", "exec"), namespace)  # noqa: S102 - defines agent_of only
    found = namespace["agent_of"]()
    assert found is None or (isinstance(found[0], int) and found[0] != os.getpid())
