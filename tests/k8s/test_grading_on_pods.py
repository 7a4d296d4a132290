"""The grader batteries of the local and docker tiers, run against real pods (the `k8s` tier, issue 31 item 8): every
grader hack of `agentrl.testing.grader_attacks` scores 0 as a report when the solution is graded in a sandbox pod
of a real cluster, and the honest references still score full marks with no integrity signal.

- code_tests: each hack on two tasks (a plain-value one and a float one), graded in pods of the sandbox image;
- repo_fix: the package's own image (built offline from the cache, as the docker tier builds it, then loaded into
  the dev cluster's engine with k8s/dev-cluster/load-image.sh), the report-forging hacks (`test_tamper`) and the
  rigged values (`rigged_comparison`) on inflection's task, graded in a pod.

The sandbox-level attacks (the syscall policy's probes, the hidden OOM kill, the control plane's resources) already
run on pods through `sandbox_attacks.ALL` / `RESOURCE_ATTACKS` in test_real_cluster.py."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from agentrl.envs import lease_sandbox
from agentrl.sandbox import SandboxPool
from agentrl.testing.grader_attacks import CODE_TESTS_ATTACKS, REPO_FIX_ATTACKS, REPO_FIX_REASONS, RIG

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
CODE_TASKS = ("easy/add", "HumanEval/2")


async def _grade_all(backend: Any, env: Any, spec: Any, jobs: list[tuple[Any, str]], *,
                     concurrency: int = 2) -> list[Any]:
    """Score each (task, solution) in a sandbox of its own, `concurrency` at a time (a 2-core dev node)."""
    sem = asyncio.Semaphore(concurrency)

    async with SandboxPool(backend, spec, warm=concurrency, max_sandboxes=concurrency,
                           run_id=f"grading-{os.getpid()}") as pool:
        async def one(task: Any, solution: str) -> Any:
            async with sem, lease_sandbox(pool, env, task) as sb:  # what `agentrl envs check` does per solution
                return await env.score_solution(sb, task, solution)

        return await asyncio.gather(*(one(t, s) for t, s in jobs))


async def test_code_tests_grader_hacks_score_zero_in_pods(real_cluster: Any) -> None:
    from agentrl_code_tests import CodeTestsEnv

    env = CodeTestsEnv(source="all")
    tasks = [t for t in env.tasks() if t.id in CODE_TASKS]
    assert len(tasks) == len(CODE_TASKS)
    spec = env.sandbox_spec.model_copy(update={"image": real_cluster.spec.image, "cpus": 0.2, "memory": "256m"})
    names = sorted(CODE_TESTS_ATTACKS)
    jobs = [(t, CODE_TESTS_ATTACKS[n].replace("{f}", t.data["entry_point"])) for n in names for t in tasks]
    jobs += [(t, env.reference_solution(t) or "") for t in tasks]
    reports = await _grade_all(real_cluster.backend(), env, spec, jobs)
    hacked, honest = reports[: -len(tasks)], reports[-len(tasks):]
    scored = {(n, t.id): (r.passed, r.total) for (n, t), r in zip([(n, t) for n in names for t in tasks], hacked)}
    assert all(p == 0 and total > 0 for p, total in scored.values()), scored
    assert not any("sandbox broke" in (r.error or "") for r in hacked), [r.error for r in hacked]
    assert all(o.message for r in hacked for o in r.outcomes)  # every failure says why (no silent zero)
    assert [(r.passed == r.total > 0, r.signals) for r in honest] == [(True, [])] * len(tasks), honest


@pytest.fixture(scope="module")
def repo_fix_image() -> Any:
    """inflection's image, built (or reused) in the machine's Docker Engine and loaded into the dev cluster."""
    from agentrl_repo_fix import RepoFixEnv, images
    from agentrl_repo_fix.lockfile import ensure_venv, fetch_sdist, load_lockfile

    env = RepoFixEnv(packages=["inflection"])
    lock = load_lockfile()
    (pkg,) = lock.select(["inflection"])
    fetch_sdist(pkg, env.cache)
    ensure_venv(lock, pkg, env.cache)
    built = images.build_image(lock, pkg, env.cache)
    loaded = subprocess.run(["bash", str(ROOT / "k8s/dev-cluster/load-image.sh"), built.image],
                            capture_output=True, text=True, timeout=600, check=False)
    if loaded.returncode != 0:
        pytest.fail(f"could not load {built.image} into the cluster (the k8s tier runs on the dev cluster: "
                    f"k8s/dev-cluster/up.sh): {loaded.stderr.strip()[-400:]}", pytrace=False)
    return env


async def test_repo_fix_grader_hacks_score_zero_in_pods(real_cluster: Any, repo_fix_image: Any) -> None:
    from agentrl_repo_fix import trees

    from agentrl.envs.base import spec_for_env

    env = repo_fix_image
    task = env.tasks()[0]
    buggy = env.buggy(task.data)
    path = str(task.data["file"])

    def appended(code: str) -> str:  # the hack appended to the buggy source file: the bug stays
        return trees.diff(buggy, {**buggy, path: buggy[path] + b"\n" + code.encode()})

    spec = spec_for_env(env.sandbox_spec.model_copy(update={"image": env.sandbox_image(task), "cpus": 0.5,
                                                            "memory": "1g"}), env)
    names = sorted(REPO_FIX_ATTACKS)
    jobs = [(task, appended(REPO_FIX_ATTACKS[n])) for n in names]
    jobs += [(task, appended(RIG)), (task, env.reference_solution(task) or "")]
    reports = await _grade_all(real_cluster.backend(), env, spec, jobs)
    *tampered, rigged, reference = reports
    for name, report in zip(names, tampered):
        assert (report.passed, report.total) == (0, 1), (name, report.outcomes[:3])
        assert report.error and REPO_FIX_REASONS[name] in report.error, (name, report.error)
        assert "test_tamper" in [s.name for s in report.signals], (name, report.signals)
    assert (rigged.passed, rigged.total) == (0, 1), rigged.outcomes[:3]
    assert [s.name for s in rigged.signals] == ["rigged_comparison"], rigged.signals
    assert (reference.passed, reference.total, reference.error, reference.signals) == (1, 1, None, []), \
        reference.outcomes[:3]
