"""The agent's memory does not depend on the data it carries (issue 31 item 6), through real local (bubblewrap)
sandboxes: a 200 MB file and repo_fix's editor on a 40 MB file (edit, undo) cross the agent byte-exact while its
peak resident memory (VmHWM, read on the host) grows by less than PEAK_BOUND. The old agent held every file whole
(and its base64 twice on a write): VmHWM grew about 5x the file, and it refused a 200 MB write outright."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from agentrl_repo_fix.tools import run_editor

from agentrl.sandbox import Sandbox, SandboxSpec
from agentrl.testing.agent_memory import PEAK_BOUND, agent_pid, edit_and_undo, file_round_trip, tree_round_trip

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")


@pytest.fixture
async def local() -> AsyncIterator[tuple[Sandbox, int]]:
    from agentrl.sandbox.local import LocalBackend

    backend: Any = LocalBackend()
    spec = SandboxSpec(memory="1g", disk="768m")
    handle = await backend.create(spec, {"agentrl.run_id": f"mem-{uuid.uuid4().hex[:6]}"})
    sb = Sandbox(handle, spec)
    try:
        assert await sb.health()
        yield sb, agent_pid(backend._live[handle.id].proc.pid)
    finally:
        await sb.close()
        await backend.destroy(handle)


async def test_a_200_mb_file_crosses_the_agent_byte_exact_with_flat_memory(local: tuple[Sandbox, int]) -> None:
    sb, pid = local
    grew = await file_round_trip(sb, pid, 200 << 20)
    assert grew < PEAK_BOUND, f"the agent's peak memory grew by {grew >> 20} MiB for a 200 MB file"


async def test_a_200_mb_tree_crosses_the_agent_as_grading_ships_it(local: tuple[Sandbox, int]) -> None:
    sb, pid = local
    grew = await tree_round_trip(sb, pid, 200 << 20)
    assert grew < PEAK_BOUND, f"the agent's peak memory grew by {grew >> 20} MiB for a 200 MB tree"


async def test_the_editor_edits_and_undoes_a_40_mb_file_with_flat_memory(local: tuple[Sandbox, int]) -> None:
    sb, pid = local
    grew = await edit_and_undo(sb, pid, run_editor, 40 << 20)
    assert grew < PEAK_BOUND, f"the agent's peak memory grew by {grew >> 20} MiB for an edit of a 40 MB file"
