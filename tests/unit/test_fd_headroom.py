"""A pool of many sandboxes raises the process's soft open-file limit (a socket per agent connection) up to the hard
limit, instead of failing mid-run with EMFILE; a hard limit too low for max_sandboxes is named with its fix."""

from __future__ import annotations

import resource
import subprocess
import sys
from collections.abc import Iterator

import pytest

from agentrl.sandbox.pool import FD_RESERVE, FDS_PER_SANDBOX, SandboxPool, ensure_fd_headroom


class NoBackend:
    """Enough of a backend for entering and leaving a pool that never leases."""

    async def sweep(self) -> int:
        return 0

    async def close(self) -> None:
        return None


@pytest.fixture
def limits() -> Iterator[tuple[int, int]]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    yield soft, hard
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_entering_a_large_pool_raises_the_soft_limit(limits: tuple[int, int]) -> None:
    _, hard = limits
    need = 300 * FDS_PER_SANDBOX + FD_RESERVE
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"hard open-file limit {hard} < {need}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    async with SandboxPool(NoBackend(), max_sandboxes=300):  # type: ignore[arg-type]
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (need, hard)


def test_a_low_hard_limit_is_used_whole_and_named() -> None:
    # in a child process: lowering the hard limit cannot be undone without CAP_SYS_RESOURCE
    code = (
        "import logging, resource\n"
        "from agentrl.sandbox.pool import ensure_fd_headroom\n"
        "logging.basicConfig(level=logging.WARNING, format='%(message)s')\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, 512))\n"
        "print(ensure_fd_headroom(2000), resource.getrlimit(resource.RLIMIT_NOFILE))\n"
    )
    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 512:
        pytest.skip("needs a hard open-file limit of at least 512")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert r.stdout.strip() == "512 (512, 512)"
    assert "max_sandboxes=2000" in r.stderr and "ulimit -Hn" in r.stderr


def test_a_sufficient_limit_is_left_alone(limits: tuple[int, int]) -> None:
    soft, hard = limits
    if soft < FD_RESERVE + FDS_PER_SANDBOX:
        pytest.skip(f"soft open-file limit {soft} is below one sandbox's need")
    assert ensure_fd_headroom(1) == soft
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == (soft, hard)
