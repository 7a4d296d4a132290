"""The lockfile of packages (TOML, see data/packages.toml) and the local cache it fills: hash-checked sdists, test
dependency wheels, and one venv per package (test dependencies only: the package itself is never installed, so no
clean copy of its code exists outside the task's repository).

Cache layout (`cache_dir`, default ~/.cache/agentrl/repo_fix):

    sdists/<name>-<version>.tar.gz     downloaded by pip with --require-hashes (the lockfile's sha256)
    wheels/                            the test dependencies' wheels (pip download), installed from here offline
    venvs/<name>-<version>/            `python3 -m venv` of the sandbox's interpreter + test deps; bound read-only
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentrl.errors import ConfigError

DEFAULT_LOCKFILE = Path(__file__).with_name("data") / "packages.toml"
SANDBOX_PYTHON = "/usr/bin/python3"  # the interpreter a local sandbox sees (its /usr is the host's)


def default_cache_dir() -> Path:
    return Path(os.environ.get("AGENTRL_REPO_FIX_CACHE") or Path.home() / ".cache" / "agentrl" / "repo_fix")


class Package(BaseModel):
    """One locked package: where its code and tests are and how its suite runs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$")
    version: str = Field(pattern=r"^[A-Za-z0-9_.\-+]+$")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    split: str = Field(pattern=r"^(train|eval)$")
    source: list[str] = Field(min_length=1)  # files/dirs (relative to the sdist root) bugs may be planted in
    tests: list[str] = Field(min_length=1)  # pytest arguments: test files or directories
    pythonpath: str = "."
    test_deps: list[str] = Field(default_factory=list)
    deselect: list[str] = Field(default_factory=list)  # pytest node ids never run

    @property
    def key(self) -> str:
        return f"{self.name}-{self.version}"


class Lockfile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    format: int = Field(ge=1, le=1)
    defaults: dict[str, list[str]] = Field(default_factory=dict)
    package: list[Package] = Field(min_length=1)

    def deps(self, pkg: Package) -> list[str]:
        return list(self.defaults.get("test_deps", [])) + list(pkg.test_deps)

    def select(self, names: list[str] | None) -> list[Package]:
        if not names:
            return list(self.package)
        known = {p.name: p for p in self.package}
        missing = [n for n in names if n not in known]
        if missing:
            raise ConfigError(f"--packages {', '.join(missing)}: not in the lockfile (known: {', '.join(known)})")
        return [known[n] for n in names]


def load_lockfile(path: Path = DEFAULT_LOCKFILE) -> Lockfile:
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"lockfile {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"lockfile {path} is not valid TOML: {exc}") from None
    try:
        return Lockfile.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"lockfile {path}: {exc}") from None


def _pip(*args: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", "-q", "--disable-pip-version-check", *args],
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise ConfigError(f"pip {' '.join(args[:2])} failed: {proc.stderr.strip()[-1500:]}")


@contextlib.contextmanager
def _locked(cache: Path, name: str) -> Iterator[None]:
    """An exclusive lock on one cache entry (two processes filling it at once would clash)."""
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f".{name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def fetch_sdist(pkg: Package, cache: Path) -> Path:
    """The package's sdist in the cache, downloaded (hash-checked) when missing; the hash is re-checked every time."""
    with _locked(cache, f"sdist-{pkg.key}"):
        return _fetch_sdist(pkg, cache)


def _fetch_sdist(pkg: Package, cache: Path) -> Path:
    target = cache / "sdists" / f"{pkg.key}.tar.gz"
    if not target.exists():
        tmp = cache / "sdists" / f".dl-{pkg.key}"
        tmp.mkdir(parents=True, exist_ok=True)
        req = tmp / "req.txt"
        req.write_text(f"{pkg.name}=={pkg.version} --hash=sha256:{pkg.sha256}\n")
        _pip("download", "--no-deps", "--no-binary", ":all:", "--require-hashes", "-r", str(req), "-d", str(tmp))
        got = [p for p in tmp.iterdir() if p.name.endswith((".tar.gz", ".zip")) and p.name != "req.txt"]
        if len(got) != 1:
            raise ConfigError(f"pip download of {pkg.key} left {len(got)} archives in {tmp}")
        got[0].replace(target)
    digest = hashlib.sha256(target.read_bytes()).hexdigest()
    if digest != pkg.sha256:
        raise ConfigError(f"{target}: sha256 {digest} != lockfile's {pkg.sha256}: delete the file and rebuild")
    return target


def ensure_venv(lock: Lockfile, pkg: Package, cache: Path, *, python: str = SANDBOX_PYTHON) -> Path:
    """The package's test venv (created from the sandbox's interpreter, test deps from the wheel cache)."""
    with _locked(cache, f"venv-{pkg.key}"):
        return _ensure_venv(lock, pkg, cache, python)


def _ensure_venv(lock: Lockfile, pkg: Package, cache: Path, python: str) -> Path:
    venv = cache / "venvs" / pkg.key
    stamp = venv / ".agentrl-ready"
    deps = lock.deps(pkg)
    if stamp.exists() and stamp.read_text() == "\n".join(deps):
        return venv
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    _pip("download", "--only-binary", ":all:", "-d", str(wheels), *deps)
    subprocess.run([python, "-m", "venv", "--clear", "--without-pip", str(venv)], check=True, timeout=120)
    _pip("--python", str(venv / "bin" / "python"), "install", "--no-index", "--find-links", str(wheels), *deps)
    os.chmod(venv, 0o755)
    stamp.write_text("\n".join(deps))
    return venv
