"""SandboxPool with per-lease images (no real sandboxes: a recording fake backend, health always true): a lease gets
the pool's spec with the image asked for, warm sandboxes are kept per image and follow the images of recent leases
(evicting the image no longer asked for), and `lease_sandbox` passes an env's per-task image."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import Any

import pytest

from agentrl.envs import Env, Task, lease_sandbox
from agentrl.sandbox import SandboxPool, SandboxSpec
from agentrl.sandbox.base import AgentEndpoint, SandboxHandle
from agentrl.sandbox.client import Sandbox

SPEC = SandboxSpec(image="base:1", cpus=0.5)


class FakeBackend:
    name = "fake"

    def __init__(self) -> None:
        self.created: list[SandboxSpec] = []
        self.destroyed: list[str] = []

    async def create(self, spec: SandboxSpec, labels: dict[str, str]) -> SandboxHandle:
        await asyncio.sleep(0.001)
        self.created.append(spec)
        return SandboxHandle(id=f"sb{len(self.created)}-{spec.image}", backend=self.name,
                             endpoint=AgentEndpoint(kind="unix", address="/nonexistent"))

    async def destroy(self, handle: SandboxHandle) -> None:
        self.destroyed.append(handle.id)

    async def alive(self, handle: SandboxHandle) -> bool:
        return True

    async def death_cause(self, handle: SandboxHandle) -> str | None:
        return None

    async def sweep(self, *, run_id: str | None = None, all_runs: bool = False) -> int:
        return 0

    async def close(self) -> None:
        return None


@pytest.fixture(autouse=True)
def _healthy(monkeypatch: pytest.MonkeyPatch) -> None:
    async def healthy(self: Sandbox) -> bool:
        return True

    monkeypatch.setattr(Sandbox, "health", healthy)


async def _until(pool: SandboxPool, want: dict[str, int]) -> None:
    async with asyncio.timeout(5):
        while pool.stats()["warm_by_image"] != want or pool.stats()["starting"]:
            await asyncio.sleep(0.005)


async def test_a_lease_gets_the_pool_spec_with_the_image_asked_for() -> None:
    backend = FakeBackend()
    async with SandboxPool(backend, SPEC, warm=0, max_sandboxes=2) as pool:
        async with pool.lease(image="repo:2") as sb:
            assert sb.spec == SPEC.model_copy(update={"image": "repo:2"})
        async with pool.lease() as sb:
            assert sb.spec == SPEC
    assert [s.image for s in backend.created] == ["repo:2", "base:1"]
    assert pool.stats()["cold_starts"] == 2


async def test_warm_sandboxes_follow_the_images_leased_and_evict_the_rest() -> None:
    backend = FakeBackend()
    async with SandboxPool(backend, SPEC, warm=2, max_sandboxes=4) as pool:
        await pool.fill(timeout_s=5)
        assert pool.stats()["warm_by_image"] == {"base:1": 2}
        for _ in range(2):
            async with pool.lease(image="repo:2"):
                pass
        await _until(pool, {"repo:2": 2})
        async with pool.lease(image="repo:2") as sb:
            assert sb.spec.image == "repo:2"
        stats = pool.stats()
        assert stats["warm_hits"] >= 1 and stats["evicted"] == 2, stats
        assert sum(1 for d in backend.destroyed if d.endswith("base:1")) == 2  # the evicted ones were destroyed
        await _until(pool, {"repo:2": 2})


async def test_two_images_in_turn_share_the_warm_target() -> None:
    backend = FakeBackend()
    async with SandboxPool(backend, SPEC, warm=2, max_sandboxes=4) as pool:
        for image in ("a:1", "b:1", "a:1", "b:1"):
            async with pool.lease(image=image):
                pass
        await _until(pool, {"a:1": 1, "b:1": 1})
        assert pool.stats()["warm_ready"] == 2


class _ImageEnv(Env):
    def __init__(self, image: str | None) -> None:
        super().__init__()
        self.image = image

    def sandbox_image(self, task: Task) -> str | None:
        return self.image


class _RecordingPool:
    """A pool whose lease() takes no image (like older fakes): lease_sandbox must not pass one then."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    @asynccontextmanager
    async def lease(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        yield "sandbox"


async def test_lease_sandbox_passes_the_tasks_image_only_when_the_env_names_one() -> None:
    pool = _RecordingPool()
    task = Task(id="t", prompt="p")
    async with lease_sandbox(pool, _ImageEnv("repo:3"), task) as sb:
        assert sb == "sandbox"
    async with lease_sandbox(pool, _ImageEnv(None), task):
        pass
    assert pool.calls == [{"image": "repo:3"}, {}]
