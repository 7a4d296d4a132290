"""Docker tier gating and hygiene.

Every test here needs a reachable Docker Engine and the image agentrl/python:latest (.ci/docker-setup.sh provides
both). Without them the tests skip with the reason, except when AGENTRL_REQUIRE_DOCKER=1 (CI): then they fail.
After the session, no container created by this test process may remain (asserted, then removed).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from dockertier import IMAGE, RUN_ID, containers_owned_by

REQUIRED = os.environ.get("AGENTRL_REQUIRE_DOCKER") == "1"


def _docker_problem() -> str | None:
    """Why the docker tier cannot run here, or None."""
    try:
        import docker
    except ImportError:
        return "the Docker SDK is not installed (pip install 'agentrl[docker]')"
    try:
        client = docker.from_env(timeout=10)
    except docker.errors.DockerException as e:
        return f"Docker Engine not reachable ({e}); run .ci/docker-setup.sh"
    try:
        client.ping()
        client.images.get(IMAGE)
    except docker.errors.ImageNotFound:
        return f"image {IMAGE} is missing; build it with sandbox_images/build.sh --offline-base"
    except docker.errors.DockerException as e:
        return f"Docker Engine not usable ({e}); run .ci/docker-setup.sh"
    finally:
        client.close()
    return None


@pytest.fixture(scope="session")
def docker_ready() -> None:
    problem = _docker_problem()
    if problem is None:
        return
    if REQUIRED:
        pytest.fail(f"AGENTRL_REQUIRE_DOCKER=1 but the docker tier cannot run: {problem}", pytrace=False)
    pytest.skip(problem)


@pytest.fixture(autouse=True)
def _needs_docker(docker_ready: None) -> None:
    """Applies the gate to every test in this directory."""


@pytest.fixture(scope="session", autouse=True)
def no_container_left_behind() -> Iterator[None]:
    """Session finalizer: every container this test process created must be gone at the end."""
    yield
    if _docker_problem() is not None:
        return
    left = containers_owned_by(os.getpid())
    if left:
        subprocess.run(["docker", "rm", "-f", *left], capture_output=True, check=False)
        pytest.fail(f"the docker tests left {len(left)} container(s) behind: {left}", pytrace=False)


# ---------------------------------------------------------------- backends and sandboxes


@pytest.fixture
async def backend() -> AsyncIterator[Any]:
    from agentrl.sandbox.docker import DockerBackend

    b = DockerBackend()
    try:
        yield b
    finally:
        await b.close()


@pytest.fixture
def make_sandbox(backend: Any) -> Callable[..., Any]:
    """make_sandbox(**spec_fields) -> async context manager of one container with that spec, always destroyed."""
    from agentrl.sandbox import Sandbox, SandboxSpec

    @asynccontextmanager
    async def make(**spec_fields: Any) -> AsyncIterator[Sandbox]:
        spec = SandboxSpec(image=IMAGE, **spec_fields)
        handle = await backend.create(spec, {"agentrl.run_id": RUN_ID})
        sb = Sandbox(handle, spec)
        try:
            assert await sb.health()  # as the pool does before a lease: fills sb.uid_separated
            yield sb
        finally:
            await sb.close()
            await backend.destroy(handle)

    return make
