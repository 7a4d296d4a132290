"""`python -m agentrl_repo_fix build|prepare`: build validated tasks from the lockfile, or only fill the cache
(sdists, test venvs) that episodes of an existing task file need."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from agentrl.errors import ConfigError
from agentrl_repo_fix.build import build
from agentrl_repo_fix.lockfile import DEFAULT_LOCKFILE, default_cache_dir, ensure_venv, fetch_sdist, load_lockfile

DEFAULT_TASKS = Path(__file__).with_name("data") / "tasks.jsonl"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m agentrl_repo_fix")
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("build", "prepare"):
        s = sub.add_parser(name)
        s.add_argument("--lockfile", type=Path, default=DEFAULT_LOCKFILE)
        s.add_argument("--cache-dir", type=Path, default=None, help="default: ~/.cache/agentrl/repo_fix")
        s.add_argument("--packages", nargs="*", default=None, help="lockfile names (default: all)")
    b = sub.choices["build"]
    b.add_argument("--out", type=Path, default=DEFAULT_TASKS)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--tasks-per-package", type=int, default=4, help="acceptance scale: 30 with all 10 packages")
    b.add_argument("--max-tries", type=int, default=40, help="mutants tried per package at most")
    return p


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    try:
        lock = load_lockfile(a.lockfile)
        packages = lock.select(a.packages)
        cache = a.cache_dir or default_cache_dir()
        if a.cmd == "prepare":
            for pkg in packages:
                fetch_sdist(pkg, cache)
                print(f"{pkg.key}: venv {ensure_venv(lock, pkg, cache)}")
            return 0
        t0 = time.monotonic()
        reports = build(lock, packages, cache, a.out, seed=a.seed, max_tasks=a.tasks_per_package,
                        max_tries=a.max_tries)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for r in reports:
        print(f"{r.package:24s} tasks {r.tasks:3d}/{r.tried:3d} tried  tests {r.tests}  excluded {r.excluded}  "
              f"suite {r.baseline_s:.2f}s  build {r.build_s:.1f}s  rejected {r.rejected}"
              + (f"  ERROR {r.error}" if r.error else ""))
    print(f"wrote {sum(r.tasks for r in reports)} tasks to {a.out} in {time.monotonic() - t0:.1f}s")
    return 0 if all(r.error is None for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
