"""Per-package sandbox images for the docker and kubernetes backends, built offline from the local cache.

Owns: the image name of a package (`image_name`), the fixed path of its test venv inside the image (`IMAGE_VENV`),
the inputs hash that decides whether an image must be rebuilt, and `build_image` (`python -m agentrl_repo_fix
images`). Does not own: the cache itself (lockfile.py fills it: sdists, wheels, host venvs).

    agentrl/repo-fix-base:latest           FROM the agentrl sandbox image (agentrl/python:latest) + git (episodes
                                            start from a one-commit git repository): the .deb files of git and of
                                            its dependencies missing from the base, fetched once into the cache
                                            with `apt-get download` (the host's suite must be the image's), then
                                            installed offline; only their files reach the image, not the .debs
    agentrl/repo-fix-<package>:<version>   FROM agentrl/repo-fix-base
        /opt/agentrl/repo-fix/venv          python3 -m venv of the image's interpreter + pytest, pytest-timeout and
                                            the lockfile's test_deps, installed with pip --no-index from the wheels
                                            of the cache (the same distributions as the host venv of `prepare`)

The package itself is never in the image: no sdist, no wheel, no site-packages copy, so the only copy of its code in
a sandbox is the buggy repository the episode unpacks. The Dockerfiles are in data/images/. `docker build --network
none`, multi-stage: the wheels and the pip that installs them stay in the discarded build stage. The image carries
the label `io.agentrl.repo-fix.inputs` = sha256 of what it is made of (base: the .debs' hashes, the sandbox image's
id, the Dockerfile; package: lockfile entry, test deps, wheel hashes, the base's id, Dockerfile, pip version); an
image whose label matches is not rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
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
BASE_PACKAGES = ("git",)  # Debian packages the episode needs on top of the sandbox image
LABEL_INPUTS = "io.agentrl.repo-fix.inputs"
LABEL_PACKAGE = "io.agentrl.repo-fix.package"
DOCKER_TIMEOUT_S = 900

IMAGE_FILES = Path(__file__).with_name("data") / "images"  # base.Dockerfile, stage_debs.py, package.Dockerfile
BASE_DOCKERFILE = IMAGE_FILES / "base.Dockerfile"
PACKAGE_DOCKERFILE = IMAGE_FILES / "package.Dockerfile"
STAGE_DEBS = IMAGE_FILES / "stage_debs.py"


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
        found = cached.get((_norm(dist), version))
        if found is None:
            raise ConfigError(f"{dist} {version} is installed in {venv} but its wheel is not in {wheels}: run "
                              "`python -m agentrl_repo_fix prepare` again")
        out.append(found)
    return out


def _pip_dir() -> Path:
    import pip

    return Path(pip.__file__).parent


def inputs_hash(pkg: Package, deps: list[str], wheels: list[Path], base_id: str) -> str:
    """What an image is made of: equal hashes mean an existing image can be reused as it is."""
    import pip

    h = hashlib.sha256()
    for part in (pkg.model_dump_json(), json.dumps(deps), base_id, PACKAGE_DOCKERFILE.read_text(), pip.__version__):
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


def _codename(text: str) -> str:
    return next((line.split("=", 1)[1].strip().strip('"') for line in text.splitlines()
                 if line.startswith("VERSION_CODENAME=")), "")


def _candidates(names: list[str]) -> dict[str, str]:
    """The version the host's apt would fetch for each package."""
    out = subprocess.run(["apt-cache", "policy", *names], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    found, current = {}, ""
    for line in out.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            current = line[:-1]
        elif line.strip().startswith("Candidate:") and current:
            found[current] = line.split(":", 1)[1].strip()
    return found


def _missing_debs(base: str) -> list[str]:
    """Debian packages of BASE_PACKAGES' dependency closure that `base` lacks or has at another version than the
    host's apt serves (e.g. perl-base without the security update git's perl needs). The host must serve the
    image's suite."""
    if shutil.which("apt-get") is None or shutil.which("apt-cache") is None:
        raise ConfigError("building the repo_fix base image needs apt (a Debian host) to fetch git's .deb files once")
    image = _docker("run", "--rm", "--network", "none", "--entrypoint", "sh", base, "-c",
                    "cat /etc/os-release; echo ---; dpkg-query -W -f '${Package} ${Version}\\n'", timeout=120).stdout
    release, _, listing = image.partition("---")
    host = Path("/etc/os-release").read_text() if Path("/etc/os-release").exists() else ""
    if _codename(release) != _codename(host):
        raise ConfigError(f"{base} is Debian {_codename(release) or '?'} but this host's apt serves "
                          f"{_codename(host) or 'no Debian suite'}: fetch the .debs on a matching host")
    closure = subprocess.run(["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests",
                              "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances", *BASE_PACKAGES],
                             capture_output=True, text=True, timeout=120, check=True).stdout
    wanted = sorted({line.strip() for line in closure.splitlines() if line and not line.startswith((" ", "<"))})
    installed = dict(line.split(" ", 1) for line in listing.strip().splitlines() if " " in line)
    candidates = _candidates(wanted)
    return [name for name in wanted if installed.get(name) != candidates.get(name)]


def ensure_debs(cache: Path, base: str, say: Callable[[str], None]) -> list[Path]:
    """The .debs of BASE_PACKAGES missing from `base`, in `cache/debs` (fetched with `apt-get download` once)."""
    debs = cache / "debs"
    stamp = debs / ".agentrl-ready"
    if stamp.exists():
        listed = [debs / name for name in stamp.read_text().split()]
        if all(p.exists() for p in listed):
            return listed
    names = _missing_debs(base)
    say(f"fetching {len(names)} .deb files for {' '.join(BASE_PACKAGES)} (once): {' '.join(names)}")
    debs.mkdir(parents=True, exist_ok=True)
    os.chmod(debs, 0o755)  # apt's _apt user downloads into it
    proc = subprocess.run(["apt-get", "download", *names], cwd=debs, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise ConfigError(f"apt-get download failed (needs a Debian mirror once): {proc.stderr.strip()[-800:]}")
    files = sorted(p for p in debs.glob("*.deb") if p.name.split("_")[0] in names)
    stamp.write_text("\n".join(p.name for p in files))
    return files


def build_base(cache: Path, *, base: str = DEFAULT_BASE, repository: str = DEFAULT_REPOSITORY, force: bool = False,
               say: Callable[[str], None] = lambda _msg: None) -> ImageResult:
    """`<repository>-base:latest`: the sandbox image + git (BASE_DOCKERFILE), built or reused."""
    t0 = time.monotonic()
    base_id = image_id(base)
    if base_id is None:
        raise ConfigError(f"the sandbox image {base} is missing: build it with `sandbox_images/build.sh "
                          "--offline-base` (or pass --base-image)")
    debs = ensure_debs(cache, base, say)
    h = hashlib.sha256(f"{base_id}\0{BASE_DOCKERFILE.read_text()}\0{STAGE_DEBS.read_text()}\0".encode())
    for deb in debs:
        h.update(deb.name.encode() + b"\0" + hashlib.sha256(deb.read_bytes()).digest())
    return _build(f"{repository}-base:latest", h.hexdigest(), "base", base, BASE_DOCKERFILE,
                  lambda ctx: _stage_base(ctx, debs), force=force, say=say, t0=t0)


def _stage_base(ctx: Path, debs: list[Path]) -> None:
    (ctx / "debs").mkdir()
    for deb in debs:
        shutil.copy2(deb, ctx / "debs" / deb.name)
    shutil.copy2(STAGE_DEBS, ctx / STAGE_DEBS.name)


def _build(image: str, inputs: str, what: str, base: str, dockerfile: Path, stage: Callable[[Path], None], *,
           force: bool, say: Callable[[str], None], t0: float) -> ImageResult:
    """docker build --network none of `dockerfile` on `base` with a context made by `stage`, unless `image`
    already carries the label LABEL_INPUTS == inputs."""
    if not force and image_label(image, LABEL_INPUTS) == inputs:
        say(f"{image}: up to date ({inputs[:12]})")
        return ImageResult(what, image, inputs, False, time.monotonic() - t0, _size(image))
    say(f"{image}: building on {base}")
    with tempfile.TemporaryDirectory(prefix="agentrl-repo-fix-image-") as tmp:
        ctx = Path(tmp)
        stage(ctx)
        shutil.copy2(dockerfile, ctx / "Dockerfile")
        # --force-rm: a failed build leaves no intermediate container behind
        proc = _docker("build", "--network", "none", "--pull=false", "--force-rm",
                       "--build-arg", f"BASE_IMAGE={base}",
                       "--label", f"{LABEL_INPUTS}={inputs}", "--label", f"{LABEL_PACKAGE}={what}",
                       "-t", image, str(ctx), timeout=DOCKER_TIMEOUT_S, check=False)
    if proc.returncode != 0:
        raise ConfigError(f"docker build of {image} failed:\n{(proc.stdout + proc.stderr).strip()[-2000:]}")
    result = ImageResult(what, image, inputs, True, time.monotonic() - t0, _size(image))
    say(f"{image}: built in {result.seconds:.1f}s, {result.size_bytes / 1e6:.0f} MB")
    return result


def host_venv(pkg: Package, cache: Path) -> Path:
    venv = cache / "venvs" / pkg.key
    if not (venv / ".agentrl-ready").exists():
        raise ConfigError(f"the cache has no test venv for {pkg.key} ({venv}): run `python -m agentrl_repo_fix "
                          f"prepare --packages {pkg.name}` first")
    return venv


def build_image(lock: Lockfile, pkg: Package, cache: Path, *, base: str = DEFAULT_BASE,
                repository: str = DEFAULT_REPOSITORY, force: bool = False,
                say: Callable[[str], None] = lambda _msg: None) -> ImageResult:
    """Build (or reuse) the package's image on `<repository>-base:latest` (built or reused first). Offline:
    `docker build --network none` from the cache's wheels."""
    deps = lock.deps(pkg)
    wheels = venv_wheels(host_venv(pkg, cache), cache / "wheels")  # first: a cache not prepared fails fast
    repo_base = build_base(cache, base=base, repository=repository, force=False, say=say).image
    t0 = time.monotonic()
    inputs = inputs_hash(pkg, deps, wheels, image_id(repo_base) or "")
    return _build(image_name(pkg.name, pkg.version, repository), inputs, pkg.key, repo_base, PACKAGE_DOCKERFILE,
                  lambda ctx: _stage(ctx, deps, wheels), force=force, say=say, t0=t0)


def _size(image: str) -> int:
    proc = _docker("image", "inspect", "--format", "{{.Size}}", image, check=False)
    return int(proc.stdout.strip() or 0) if proc.returncode == 0 else 0
