"""Per-package sandbox images for the docker and kubernetes backends, built offline from the local cache.

Owns: the image name of a package (`image_name`), the fixed path of its test venv inside the image (`IMAGE_VENV`),
the inputs hash that decides whether an image must be rebuilt, and `build_image` (`python -m agentrl_repo_fix
images`). Does not own: the cache itself (lockfile.py fills it: sdists, wheels, host venvs).

    agentrl/repo-fix-<package>:<version>   FROM the agentrl sandbox image (agentrl/python:latest)
        /opt/agentrl/repo-fix/venv          python3 -m venv of the image's interpreter + pytest, pytest-timeout and
                                            the lockfile's test_deps, installed with pip --no-index from the wheels
                                            of the cache (the same distributions as the host venv of `prepare`)

The package itself is never in the image: no sdist, no wheel, no site-packages copy, so the only copy of its code
in a sandbox is the buggy repository the episode unpacks. `docker build --network none`, multi-stage: the wheels
and the pip that installs them stay in the discarded build stage. The image carries the label
`io.agentrl.repo-fix.inputs` = sha256 of (lockfile entry, test deps, wheel hashes, base image id, Dockerfile, pip
version); an image whose label matches is not rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agentrl.errors import ConfigError
from agentrl_repo_fix.lockfile import Lockfile, Package

IMAGE_VENV = "/opt/agentrl/repo-fix/venv"  # the test venv inside every per-package image
DEFAULT_BASE = "agentrl/python:latest"  # the docker backend's default sandbox image
DEFAULT_REPOSITORY = "agentrl/repo-fix"  # images are <repository>-<package>:<version>
LABEL_INPUTS = "io.agentrl.repo-fix.inputs"
LABEL_PACKAGE = "io.agentrl.repo-fix.package"
DOCKER_TIMEOUT_S = 900

DOCKERFILE = f"""\
# agentrl repo_fix sandbox image for one package: its test venv at {IMAGE_VENV}, never the package itself.
ARG BASE_IMAGE
FROM ${{BASE_IMAGE}} AS venv
USER 0:0
COPY wheels /build/wheels
COPY pip /build/pip
COPY requirements.txt /build/requirements.txt
RUN python3 -m venv --without-pip {IMAGE_VENV} \\
 && PYTHONPATH=/build/pip {IMAGE_VENV}/bin/python -m pip install -q --disable-pip-version-check --no-index \\
      --no-cache-dir --find-links /build/wheels -r /build/requirements.txt \\
 && chmod -R a+rX,go-w {IMAGE_VENV} \\
 && {IMAGE_VENV}/bin/python -c "import pytest, pytest_timeout"

FROM ${{BASE_IMAGE}}
COPY --from=venv {IMAGE_VENV} {IMAGE_VENV}
"""


def image_name(package: str, version: str, repository: str = DEFAULT_REPOSITORY) -> str:
    """`<repository>-<package>:<version>`, lower-cased to what a Docker reference allows (`_`/`.` in a name -> `-`,
    `+` in a tag -> `_`)."""
    name = re.sub(r"[^a-z0-9-]+", "-", package.lower()).strip("-")
    tag = re.sub(r"[^A-Za-z0-9_.-]", "_", version)[:128]
    return f"{repository}-{name}:{tag}"


@dataclass
class ImageResult:
    package: str
    image: str
    inputs: str  # the inputs hash (label LABEL_INPUTS)
    built: bool  # False: an image with the same inputs existed
    seconds: float
    size_bytes: int


def _docker(*args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
    if shutil.which("docker") is None:
        raise ConfigError("the docker CLI is not installed: install Docker Engine (e.g. .ci/docker-setup.sh) to "
                          "build repo_fix images")
    proc = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise ConfigError(f"docker {args[0]} failed: {proc.stderr.strip()[-1500:]}")
    return proc


def check_docker() -> None:
    """Raise ConfigError naming the fix when the docker CLI or the engine is not usable."""
    proc = _docker("info", "--format", "{{.ServerVersion}}", check=False)
    if proc.returncode != 0:
        raise ConfigError("the Docker Engine is not reachable (start dockerd, e.g. .ci/docker-setup.sh): "
                          + proc.stderr.strip()[-300:])


def image_id(image: str) -> str | None:
    proc = _docker("image", "inspect", "--format", "{{.Id}}", image, check=False)
    return proc.stdout.strip() if proc.returncode == 0 else None


def image_label(image: str, label: str) -> str | None:
    proc = _docker("image", "inspect", "--format", "{{json .Config.Labels}}", image, check=False)
    if proc.returncode != 0:
        return None
    return (json.loads(proc.stdout or "null") or {}).get(label)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def venv_wheels(venv: Path, wheels: Path) -> list[Path]:
    """The cached wheels of every distribution installed in the package's host venv (what `prepare` resolved)."""
    site = sorted(venv.glob("lib/python*/site-packages"))
    if not site:
        raise ConfigError(f"{venv} has no site-packages: run `python -m agentrl_repo_fix prepare`")
    cached = {}
    for whl in wheels.glob("*.whl"):
        dist, version = whl.name.split("-")[:2]
        cached[(_norm(dist), version)] = whl
    out = []
    for info in sorted(site[0].glob("*.dist-info")):
        dist, _, version = info.name[: -len(".dist-info")].rpartition("-")
        whl = cached.get((_norm(dist), version))
        if whl is None:
            raise ConfigError(f"{dist} {version} is installed in {venv} but its wheel is not in {wheels}: run "
                              "`python -m agentrl_repo_fix prepare` again")
        out.append(whl)
    return out


def _pip_dir() -> Path:
    import pip

    return Path(pip.__file__).parent


def inputs_hash(pkg: Package, deps: list[str], wheels: list[Path], base_id: str) -> str:
    """What an image is made of: equal hashes mean an existing image can be reused as it is."""
    import pip

    h = hashlib.sha256()
    for part in (pkg.model_dump_json(), json.dumps(deps), base_id, DOCKERFILE, pip.__version__):
        h.update(part.encode() + b"\0")
    for whl in sorted(wheels, key=lambda p: p.name):
        h.update(whl.name.encode() + b"\0" + hashlib.sha256(whl.read_bytes()).digest())
    return h.hexdigest()


def _stage(ctx: Path, deps: list[str], wheels: list[Path]) -> None:
    (ctx / "wheels").mkdir()
    for whl in wheels:
        shutil.copy2(whl, ctx / "wheels" / whl.name)
    shutil.copytree(_pip_dir(), ctx / "pip" / "pip", ignore=shutil.ignore_patterns("__pycache__"))
    (ctx / "requirements.txt").write_text("\n".join(deps) + "\n")
    (ctx / "Dockerfile").write_text(DOCKERFILE)


def host_venv(pkg: Package, cache: Path) -> Path:
    venv = cache / "venvs" / pkg.key
    if not (venv / ".agentrl-ready").exists():
        raise ConfigError(f"the cache has no test venv for {pkg.key} ({venv}): run `python -m agentrl_repo_fix "
                          f"prepare --packages {pkg.name}` first")
    return venv


def build_image(lock: Lockfile, pkg: Package, cache: Path, *, base: str = DEFAULT_BASE,
                repository: str = DEFAULT_REPOSITORY, force: bool = False,
                say: Callable[[str], None] = lambda _msg: None) -> ImageResult:
    """Build (or reuse) the package's image. Offline: `docker build --network none` from the cache's wheels."""
    t0 = time.monotonic()
    image = image_name(pkg.name, pkg.version, repository)
    deps = lock.deps(pkg)
    wheels = venv_wheels(host_venv(pkg, cache), cache / "wheels")
    base_id = image_id(base)
    if base_id is None:
        raise ConfigError(f"the base image {base} is missing: build it with `sandbox_images/build.sh "
                          "--offline-base` (or pass --base-image)")
    inputs = inputs_hash(pkg, deps, wheels, base_id)
    if not force and image_label(image, LABEL_INPUTS) == inputs:
        say(f"{image}: up to date ({inputs[:12]})")
        return ImageResult(pkg.name, image, inputs, False, time.monotonic() - t0, _size(image))
    say(f"{image}: building ({len(wheels)} wheels, base {base})")
    with tempfile.TemporaryDirectory(prefix="agentrl-repo-fix-image-") as tmp:
        ctx = Path(tmp)
        _stage(ctx, deps, wheels)
        proc = _docker("build", "--network", "none", "--pull=false", "--build-arg", f"BASE_IMAGE={base}",
                       "--label", f"{LABEL_INPUTS}={inputs}", "--label", f"{LABEL_PACKAGE}={pkg.key}",
                       "-t", image, str(ctx), timeout=DOCKER_TIMEOUT_S, check=False)
    if proc.returncode != 0:
        raise ConfigError(f"docker build of {image} failed:\n{(proc.stdout + proc.stderr).strip()[-2000:]}")
    result = ImageResult(pkg.name, image, inputs, True, time.monotonic() - t0, _size(image))
    say(f"{image}: built in {result.seconds:.1f}s, {result.size_bytes / 1e6:.0f} MB")
    return result


def _size(image: str) -> int:
    proc = _docker("image", "inspect", "--format", "{{.Size}}", image, check=False)
    return int(proc.stdout.strip() or 0) if proc.returncode == 0 else 0
