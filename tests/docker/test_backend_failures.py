"""The docker backend when things go wrong: a missing image, an agent that cannot start, a create cancelled half
way, a destroy of something already gone. Each must end with a clear error and no container left behind."""

from __future__ import annotations

import asyncio
import time
import os
from pathlib import Path

import pytest
from dockertier import IMAGE, RUN_ID, containers_owned_by

from agentrl.errors import ConfigError, SandboxStartError
from agentrl.sandbox import SandboxSpec
from agentrl.sandbox.docker import DockerBackend

pytestmark = pytest.mark.docker

LABELS = {"agentrl.run_id": RUN_ID}


async def _owned() -> list[str]:
    return await asyncio.to_thread(containers_owned_by, os.getpid())


async def test_missing_image_is_a_config_error_that_names_the_fix(backend: DockerBackend) -> None:
    with pytest.raises(ConfigError, match="build.sh --offline-base"):
        await backend.create(SandboxSpec(image="agentrl/does-not-exist:latest"), LABELS)
    assert await _owned() == []


async def test_an_agent_that_cannot_start_fails_fast_with_its_log(tmp_path: Path) -> None:
    bad = tmp_path / "agent.py"
    bad.write_text("import sys\nsys.exit('agent: cannot start here (test)')\n")
    bad.chmod(0o644)
    backend = DockerBackend(agent_file=bad, start_timeout_s=60)
    try:
        t0 = asyncio.get_running_loop().time()
        with pytest.raises(SandboxStartError, match="cannot start here"):
            await backend.create(SandboxSpec(image=IMAGE), LABELS)
        assert asyncio.get_running_loop().time() - t0 < 30  # noticed the exit, did not wait for the deadline
        assert await _owned() == []
    finally:
        await backend.close()


@pytest.mark.parametrize("fraction", [0.0, 0.25, 0.6])
async def test_a_cancelled_create_leaves_nothing_behind(backend: DockerBackend, fraction: float) -> None:
    """Cancel at a fraction of a measured create, so the cancel lands mid-start however fast this machine is."""
    t0 = time.monotonic()
    await backend.destroy(await backend.create(SandboxSpec(image=IMAGE), LABELS))
    create_s = time.monotonic() - t0
    task = asyncio.create_task(backend.create(SandboxSpec(image=IMAGE), LABELS))
    await asyncio.sleep(fraction * create_s * 0.5)  # create is roughly half of create+destroy
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await _owned() == []


async def test_destroy_is_idempotent_and_close_removes_what_is_left(backend: DockerBackend) -> None:
    first = await backend.create(SandboxSpec(image=IMAGE), LABELS)
    await backend.destroy(first)
    await backend.destroy(first)  # already gone: no error
    assert not Path(first.endpoint.address).parent.exists()  # the socket dir went with it
    await backend.create(SandboxSpec(image=IMAGE), LABELS)  # never destroyed by the caller
    assert len(await _owned()) == 1
    await backend.close()
    assert await _owned() == []
