"""`python -m agentrl_repo_fix build|prepare|images`: build validated tasks from the lockfile, only fill the cache
(sdists, test venvs) that episodes of an existing task file need, or build the per-package sandbox images of the
docker / kubernetes backends from that cache (images.py)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from agentrl.errors import ConfigError
from agentrl_repo_fix import images
from agentrl_repo_fix.build import build
from agentrl_repo_fix.lockfile import (
    DEFAULT_LOCKFILE,
    Lockfile,
    Package,
    default_cache_dir,
    ensure_venv,
    fetch_sdist,
    load_lockfile,
)

DEFAULT_TASKS = Path(__file__).with_name("data") / "tasks.jsonl"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m agentrl_repo_fix")
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("build", "prepare", "images"):
        s = sub.add_parser(name)
        s.add_argument("--lockfile", type=Path, default=DEFAULT_LOCKFILE)
        s.add_argument("--cache-dir", type=Path, default=None, help="default: ~/.cache/agentrl/repo_fix")
        s.add_argument("--packages", nargs="*", default=None, help="lockfile names (default: all)")
    b = sub.choices["build"]
    b.add_argument("--out", type=Path, default=DEFAULT_TASKS)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--tasks-per-package", type=int, default=4, help="acceptance scale: 30 with all 10 packages")
    b.add_argument("--max-tries", type=int, default=40, help="mutants tried per package at most")
    i = sub.choices["images"]
    i.add_argument("--base-image", default=images.DEFAULT_BASE, help="the sandbox image to build on")
    i.add_argument("--repository", default=images.DEFAULT_REPOSITORY,
                   help="images are REPOSITORY-<package>:<version> (the env option image_repository must match)")
    i.add_argument("--force", action="store_true", help="rebuild even when an image with the same inputs exists")
    return p


def _images(a: argparse.Namespace, lock: Lockfile, packages: list[Package], cache: Path) -> int:
    images.check_docker()
    t0 = time.monotonic()
    for pkg in packages:
        r = images.build_image(lock, pkg, cache, base=a.base_image, repository=a.repository, force=a.force,
                               say=lambda msg: print(msg, flush=True))
        print(f"{r.package:24s} {r.image:48s} {'built' if r.built else 'reused':6s} {r.seconds:6.1f}s  "
              f"{r.size_bytes / 1e6:6.1f} MB  inputs {r.inputs[:12]}", flush=True)
    print(f"{len(packages)} image(s) ready in {time.monotonic() - t0:.1f}s")
    return 0


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
        if a.cmd == "images":
            return _images(a, lock, packages, cache)
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
