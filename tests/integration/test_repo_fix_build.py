"""The repo_fix task build on a real package (inflection: ~1 s suite): the baseline, mutant validation and output
are reproducible byte for byte for a seed, every kept task satisfies the validation rules, and a different seed
gives different tasks. Needs the package cache (filled on first use, as in test_repo_fix_sandbox.py)."""

from __future__ import annotations

import json
from pathlib import Path

from agentrl_repo_fix import trees
from agentrl_repo_fix.build import MAX_FAIL_FRACTION, build
from agentrl_repo_fix.lockfile import default_cache_dir, load_lockfile


def _build(out: Path, seed: int) -> list[dict]:
    lock = load_lockfile()
    reports = build(lock, lock.select(["inflection"]), default_cache_dir(), out, seed=seed, max_tasks=2,
                    max_tries=4, log=lambda _line: None)
    assert reports[0].error is None and reports[0].tasks >= 1, reports
    meta = json.loads(Path(str(out) + ".meta.json").read_text())
    assert meta["packages"][0]["baseline_s"] > 0 and meta["tasks"] == reports[0].tasks
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_build_is_reproducible_and_every_task_is_valid(tmp_path: Path) -> None:
    first = _build(tmp_path / "a.jsonl", seed=7)
    again = _build(tmp_path / "b.jsonl", seed=7)
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    lock = load_lockfile()
    (pkg,) = lock.select(["inflection"])
    from agentrl_repo_fix.lockfile import fetch_sdist

    pristine = trees.from_sdist(fetch_sdist(pkg, default_cache_dir()))
    for task in first:
        stable = len(task["fail_to_pass"]) + len(task["pass_to_pass"])
        assert task["fail_to_pass"] and task["pass_to_pass"]
        assert len(task["fail_to_pass"]) <= MAX_FAIL_FRACTION * stable
        assert not set(task["fail_to_pass"]) & set(task["pass_to_pass"])
        buggy = trees.apply_diff(pristine, task["bug_diff"])
        assert buggy != pristine and trees.apply_diff(buggy, task["reference_diff"]) == pristine
        changed = [p for p in pristine if pristine[p] != buggy[p]]
        assert changed == [task["file"]] and task["seed"] == 7 and task["split"] == "train"
    assert again == first
    other = _build(tmp_path / "c.jsonl", seed=8)
    assert [t["bug_diff"] for t in other] != [t["bug_diff"] for t in first]
