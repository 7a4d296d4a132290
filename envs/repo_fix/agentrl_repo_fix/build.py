"""The task build: lockfile -> validated bug tasks. Offline after the cache is filled; seeded and reproducible (the
same seed, lockfile and cache give a byte-identical task file; runtimes go to a separate meta file).

Per package: run the pristine suite 3x; tests that do not pass all three times are excluded (flaky or broken here);
the package is refused when under 95% pass. Then mutations (mutate.py) are tried in a seeded order, balanced across
kinds; a mutant becomes a task only if, on two runs with identical results, >= 1 stable test fails (FAIL_TO_PASS),
>= 1 passes (PASS_TO_PASS), <= 20% of the stable tests fail, nothing timed out, and the reverse of its diff restores
the pristine tree byte for byte. The suites run on the host, in a scratch copy, with the package's venv.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from agentrl_repo_fix import mutate, trees
from agentrl_repo_fix.lockfile import Lockfile, Package, ensure_venv, fetch_sdist
from agentrl_repo_fix.testrun import SuiteResult, parse_junit, pytest_argv, suite_env

TASK_FORMAT = "agentrl-repo-fix/1"
MIN_BASELINE_PASS = 0.95
MAX_FAIL_FRACTION = 0.20
SUITE_TIMEOUT_S = 300.0
PER_TEST_TIMEOUT_S = 20.0
MUTANT_TIMEOUT_FACTOR = 10.0  # a mutant's suite may take this many times the pristine suite (min below), else rejected
MUTANT_TIMEOUT_MIN_S = 60.0
_ADDR = re.compile(r"0x[0-9a-fA-F]{6,}")
_DURATION = re.compile(r"\d+\.\d+s\b")
_PYTEST_TMP = re.compile(r"pytest-\d+")  # pytest's numbered basetemp (pytest-124/...) differs run to run


@dataclass
class PackageReport:
    package: str
    tasks: int = 0
    tried: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    baseline_s: float = 0.0
    build_s: float = 0.0
    tests: int = 0
    excluded: int = 0
    error: str | None = None


def run_suite(tree: trees.Tree, pkg: Package, venv: Path, *, deselect: list[str] | None = None,
              timeout_s: float = SUITE_TIMEOUT_S) -> tuple[SuiteResult, float, bool]:
    """(results, seconds, timed_out) of one run of the package's suite over `tree` in a scratch directory."""
    with tempfile.TemporaryDirectory(prefix="repo-fix-run-") as tmp:
        root = Path(tmp, "repo")
        trees.write(tree, root)
        report = str(Path(tmp, "report.xml"))
        argv = pytest_argv(str(venv / "bin" / "python"), pkg.tests, report,
                           deselect=list(pkg.deselect) + list(deselect or []), per_test_timeout_s=PER_TEST_TIMEOUT_S)
        t0 = time.monotonic()
        try:
            proc = subprocess.run(argv, cwd=root, env=suite_env(pkg.pythonpath, tmp), capture_output=True,
                                  timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return SuiteResult({}, {}, error="timeout"), time.monotonic() - t0, True
        took = time.monotonic() - t0
        try:
            data = Path(report).read_bytes()
        except FileNotFoundError:
            tail = proc.stdout.decode(errors="replace")[-800:]
            return SuiteResult({}, {}, error=f"no report (exit {proc.returncode}): {tail}"), took, False
        result = parse_junit(data)
        timed_out = any("Timeout" in m for m in result.messages.values())
        return result, took, timed_out


def baseline(tree: trees.Tree, pkg: Package, venv: Path) -> tuple[list[str], list[str], float]:
    """(stable passing tests, excluded tests, mean runtime) over 3 runs."""
    runs = [run_suite(tree, pkg, venv) for _ in range(3)]
    for result, _, timed_out in runs:
        if result.error or timed_out:
            raise RuntimeError(f"{pkg.key}: the pristine suite did not run: {result.error or 'timeout'}")
    seen = set().union(*(r.passed for r, _, _ in runs))
    stable = sorted(t for t in seen if all(r.passed.get(t) is True for r, _, _ in runs))
    excluded = sorted(seen - set(stable))
    if not seen or len(stable) / len(seen) < MIN_BASELINE_PASS:
        raise RuntimeError(f"{pkg.key}: only {len(stable)}/{len(seen)} tests pass reliably (need "
                           f"{MIN_BASELINE_PASS:.0%}); fix the lockfile's tests/deselect")
    return stable, excluded, sum(t for _, t, _ in runs) / 3


def source_files(tree: trees.Tree, pkg: Package) -> list[str]:
    """The .py files bugs may go in: under the lockfile's `source`, never a test or conftest file."""
    out = []
    for name in sorted(tree):
        under = any(name == s or name.startswith(s.rstrip("/") + "/") for s in pkg.source)
        base = name.rsplit("/", 1)[-1]
        if under and name.endswith(".py") and "tests" not in name.split("/") and not base.startswith("test_") \
                and base != "conftest.py":
            out.append(name)
    return out


def ordered_candidates(tree: trees.Tree, files: list[str], rng: random.Random) -> list[tuple[str, mutate.Mutation]]:
    """All mutations of `files`, in a seeded order that round-robins over kinds (constants would dominate)."""
    by_kind: dict[str, list[tuple[str, mutate.Mutation]]] = {}
    for name in files:
        try:
            found = mutate.candidates(tree[name])
        except (SyntaxError, ValueError):
            continue
        for m in found:
            by_kind.setdefault(m.kind, []).append((name, m))
    kinds = sorted(by_kind)
    for kind in kinds:
        rng.shuffle(by_kind[kind])
    rng.shuffle(kinds)
    out: list[tuple[str, mutate.Mutation]] = []
    while any(by_kind[k] for k in kinds):
        for kind in kinds:
            if by_kind[kind]:
                out.append(by_kind[kind].pop())
    return out


def _stable_msg(text: str) -> str:
    return _PYTEST_TMP.sub("pytest-N", _DURATION.sub("<t>", _ADDR.sub("0x?", text)))


def validate(pristine: trees.Tree, buggy: trees.Tree, pkg: Package, venv: Path, stable: list[str],
             excluded: list[str], *, timeout_s: float = SUITE_TIMEOUT_S) -> tuple[dict | None, str]:
    """(task fields, "ok") for a valid bug, else (None, the reason it was rejected)."""
    bug_diff = trees.diff(pristine, buggy)
    try:
        if trees.apply_diff(buggy, bug_diff, reverse=True) != pristine:
            return None, "reverse_mismatch"
    except ValueError:
        return None, "reverse_mismatch"
    results = []
    for _ in range(2):
        result, _, timed_out = run_suite(buggy, pkg, venv, timeout_s=timeout_s)
        if timed_out:
            return None, "timeout"
        if result.error:
            return None, "no_report"
        results.append(result)
    verdicts = [{t: r.passed.get(t) is True for t in stable} for r in results]
    if verdicts[0] != verdicts[1]:
        return None, "nondeterministic"
    f2p = sorted(t for t, ok in verdicts[0].items() if not ok)
    p2p = sorted(t for t, ok in verdicts[0].items() if ok)
    if not f2p:
        return None, "no_failing_test"
    if not p2p:
        return None, "no_passing_test"
    if len(f2p) > MAX_FAIL_FRACTION * len(stable):
        return None, "too_many_failures"
    messages = {t: _stable_msg(results[0].messages.get(t, "")) for t in f2p[:3]}
    return {"bug_diff": bug_diff, "reference_diff": trees.diff(buggy, pristine), "fail_to_pass": f2p,
            "pass_to_pass": p2p, "excluded": excluded, "failure_messages": messages}, "ok"


def build_package(lock: Lockfile, pkg: Package, cache: Path, *, seed: int, max_tasks: int, max_tries: int,
                  log: Callable[[str], None] = print) -> tuple[list[dict], PackageReport]:
    """Validated tasks of one package (at most `max_tasks`, trying at most `max_tries` mutants)."""
    t0 = time.monotonic()
    report = PackageReport(package=pkg.key)
    pristine = trees.from_sdist(fetch_sdist(pkg, cache))
    venv = ensure_venv(lock, pkg, cache)
    stable, excluded, report.baseline_s = baseline(pristine, pkg, venv)
    report.tests, report.excluded = len(stable), len(excluded)
    log(f"{pkg.key}: {len(stable)} stable tests, {len(excluded)} excluded, suite {report.baseline_s:.1f}s")
    rng = random.Random(f"{seed}:{pkg.key}")
    tasks: list[dict] = []
    seen_diffs: set[str] = set()
    for name, m in ordered_candidates(pristine, source_files(pristine, pkg), rng):
        if len(tasks) >= max_tasks or report.tried >= max_tries:
            break
        buggy = dict(pristine)
        buggy[name] = mutate.apply(pristine[name], m)
        report.tried += 1
        fields, why = validate(pristine, buggy, pkg, venv, stable, excluded,
                               timeout_s=max(MUTANT_TIMEOUT_MIN_S, MUTANT_TIMEOUT_FACTOR * report.baseline_s))
        if fields is None or fields["bug_diff"] in seen_diffs:
            why = why if fields is None else "duplicate"
            report.rejected[why] = report.rejected.get(why, 0) + 1
            continue
        seen_diffs.add(fields["bug_diff"])
        task = {"format": TASK_FORMAT, "id": f"{pkg.name}-{pkg.version}-{len(tasks):03d}", "package": pkg.name,
                "version": pkg.version, "sha256": pkg.sha256, "split": pkg.split, "tests": pkg.tests,
                "pythonpath": pkg.pythonpath, "deselect": pkg.deselect, "seed": seed, "mutation": m.kind,
                "file": name, "line": m.line, "per_test_timeout_s": PER_TEST_TIMEOUT_S, **fields}
        tasks.append(task)
        log(f"  task {task['id']}: {m.kind} in {name}:{m.line}, {len(fields['fail_to_pass'])} F2P")
    report.tasks = len(tasks)
    report.build_s = time.monotonic() - t0
    return tasks, report


def build(lock: Lockfile, packages: list[Package], cache: Path, out: Path, *, seed: int, max_tasks: int,
          max_tries: int, log: Callable[[str], None] = print) -> list[PackageReport]:
    """Build every package's tasks; write `out` (JSONL, one task a line) and `out`.meta.json (runtimes, yield)."""
    all_tasks: list[dict] = []
    reports: list[PackageReport] = []
    for pkg in packages:
        try:
            tasks, report = build_package(lock, pkg, cache, seed=seed, max_tasks=max_tasks, max_tries=max_tries,
                                          log=log)
        except RuntimeError as exc:
            log(f"{pkg.key}: skipped: {exc}")
            reports.append(PackageReport(package=pkg.key, error=str(exc)))
            continue
        all_tasks.extend(tasks)
        reports.append(report)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(t, sort_keys=True) + "\n" for t in all_tasks))
    meta = {"format": TASK_FORMAT, "seed": seed, "tasks": len(all_tasks),
            "packages": [r.__dict__ for r in reports]}
    Path(str(out) + ".meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return reports
