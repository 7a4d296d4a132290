"""repo_fix on the docker backend: the per-package image (built offline from the cache, reused when its inputs are
unchanged, carrying the test venv and git but no copy of the package), a scripted multi-turn episode through the
real runner in that image that earns reward 1.0 (a no-op 0), the pool keeping warm sandboxes per image, and
`agentrl envs check repo_fix --sandbox docker` as a user runs it.

Uses the committed inflection tasks. The first run fills the cache (`prepare`: sdist + wheels) and fetches git's
.debs once (`apt-get download`); image builds after that are offline (`docker build --network none`).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from typing import Any

import pytest
from agentrl_repo_fix import RepoFixEnv, images
from agentrl_repo_fix.lockfile import ensure_venv, fetch_sdist, load_lockfile

from agentrl.envs import lease_sandbox
from agentrl.runner import Budgets, Rollout, Scheduler, SchedulerConfig
from agentrl.sandbox import SandboxPool, SandboxSpec
from agentrl.testing.scripted import ScriptedEngine, hermes_call, single_hunk_edit
from agentrl.tools.render import ChatRenderer
from agentrl.types import SamplingParams, Status

pytestmark = pytest.mark.docker
PACKAGE = "inflection"
SPEC = SandboxSpec(default_timeout_s=60, memory="2g", disk="512m", pids=512,  # image: the default agentrl/python
                   writable_dirs=("/repo",))  # what spec_for_env(spec, RepoFixEnv) adds


@pytest.fixture(scope="module")
def built() -> tuple[RepoFixEnv, images.ImageResult]:
    env = RepoFixEnv(packages=[PACKAGE])
    lock = load_lockfile()
    (pkg,) = lock.select([PACKAGE])
    fetch_sdist(pkg, env.cache)
    ensure_venv(lock, pkg, env.cache)
    return env, images.build_image(lock, pkg, env.cache)


@pytest.fixture(scope="module")
def env(built: tuple[RepoFixEnv, images.ImageResult]) -> RepoFixEnv:
    return built[0]


def _pool(n: int = 1, warm: int = 1) -> SandboxPool:
    return SandboxPool(backend="docker", spec=SPEC, warm=warm, max_sandboxes=n, run_id=f"pytest-{uuid.uuid4().hex[:8]}")


def _docker_run(image: str, script: str) -> str:
    return subprocess.run(["docker", "run", "--rm", "--network", "none", image, "sh", "-c", script],
                          capture_output=True, text=True, timeout=120, check=False).stdout


def test_image_is_reused_and_carries_the_venv_and_git_but_not_the_package(built: Any) -> None:
    env, first = built
    lock = load_lockfile()
    (pkg,) = lock.select([PACKAGE])
    again = images.build_image(lock, pkg, env.cache)
    assert (again.built, again.image, again.inputs) == (False, first.image, first.inputs)
    assert images.image_label(first.image, images.LABEL_INPUTS) == first.inputs
    out = _docker_run(first.image, f"{images.IMAGE_VENV}/bin/python -m pytest --version; git --version; id -u; "
                      f"{images.IMAGE_VENV}/bin/python -c 'import inflection' 2>&1 | tail -1; "
                      "find / -xdev -iname '*inflection*' 2>/dev/null; ls /build 2>&1")
    assert "pytest 8" in out and "git version" in out and "\n1000\n" in out
    assert "No module named 'inflection'" in out
    assert "inflection" not in out.replace("No module named 'inflection'", "")  # no file named after it anywhere
    assert "No such file" in out  # the build stage's wheels and pip are not in the image


async def test_reference_passes_and_noop_fails_in_the_package_image(env: RepoFixEnv) -> None:
    task = env.tasks()[0]
    async with _pool(warm=0) as pool:
        async with lease_sandbox(pool, env, task) as sb:
            assert sb.spec.image == images.image_name(PACKAGE, task.data["version"])
            ref = await env.score_solution(sb, task, env.reference_solution(task) or "")
        async with lease_sandbox(pool, env, task) as sb:
            noop = await env.score_solution(sb, task, "")
    assert (ref.passed, ref.total, ref.error) == (1, 1, None), ref.outcomes[:3]
    assert (noop.passed, noop.total) == (0, 1)




async def test_scripted_episode_through_the_runner_earns_reward_one_on_docker(env: RepoFixEnv,
                                                                              smollm2_tokenizer: Any) -> None:
    task = next(t for t in env.tasks() if str(t.data["reference_diff"]).count("@@ -") == 1)
    path, old, new = single_hunk_edit(str(task.data["reference_diff"]))
    replies = [
        hermes_call("bash", command="command -v python; git log --oneline | wc -l"),
        hermes_call("str_replace_editor", command="view", path=path, view_range=[1, 20]),
        hermes_call("str_replace_editor", command="str_replace", path=path, old_str=old, new_str=new),
        hermes_call("bash", command=f"python -m pytest -q -x {' '.join(task.data['tests'])} 2>&1 | tail -3"),
        hermes_call("submit"),
    ]
    engine = ScriptedEngine(smollm2_tokenizer, replies, context_window=32768)
    rollout = Rollout(env=env, engine=engine, renderer=ChatRenderer(smollm2_tokenizer),
                      sampling=SamplingParams(temperature=1.0, max_new_tokens=2048,
                                              stop_token_ids=[smollm2_tokenizer.eos_token_id]),
                      budgets=Budgets(max_turns=50, max_completion_tokens=30000, context_window=32768,
                                      tool_timeout_s=120))
    async with _pool() as pool:
        sched = Scheduler(rollout, pool, SchedulerConfig(group_size=1))
        traj = await sched.run_one(task, group_id="g", sample_index=0)
    assert traj.status is Status.ok, traj.error
    assert len(traj.turns) == 5 and traj.num_tool_calls == 5
    where = traj.turns[0].tool_results[0].output
    assert f"{images.IMAGE_VENV}/bin/python" in where and "\n1\n" in f"\n{where}", where  # image venv, one commit
    assert traj.turns[2].tool_results[0].error is None, traj.turns[2].tool_results[0].output
    assert "passed" in traj.turns[3].tool_results[0].output
    assert traj.reward == 1.0, traj.tests


async def test_pool_keeps_warm_sandboxes_of_the_images_leased(env: RepoFixEnv) -> None:
    image = env.sandbox_image(env.tasks()[0])
    async with _pool(n=3, warm=2) as pool:
        await pool.fill(timeout_s=60)
        assert pool.stats()["warm_by_image"] == {SPEC.image: 2}
        for _ in range(2):
            async with pool.lease(image=image) as sb:
                assert sb.spec.image == image
                assert (await sb.exec(["git", "--version"])).exit_code == 0
        async with asyncio.timeout(60):
            while pool.stats()["warm_by_image"] != {image: 2}:
                await asyncio.sleep(0.05)
        async with pool.lease(image=image) as sb:
            assert sb.spec.image == image
        stats = pool.stats()
    assert stats["warm_hits"] >= 1 and stats["evicted"] >= 1, stats


def test_envs_check_repo_fix_passes_on_docker(env: RepoFixEnv) -> None:
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", "envs", "check", "repo_fix", "--sandbox", "docker",
                        "--env-option", f"packages={PACKAGE}", "--tasks", "3"], capture_output=True, text=True, timeout=600,
                       check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    n = min(3, len(env.tasks()))
    assert f"total: {n}/{n} tasks pass all tests" in r.stdout, r.stdout[-2000:]
