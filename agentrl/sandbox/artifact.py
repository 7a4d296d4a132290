"""The in-sandbox agent as one deterministic artifact: the package `agentrl/sandbox/agent/` zipped into `agent.pyz`.

Owns: building the zip application from the package's source files (`build`), writing it once, atomically, into a
cache directory under a name that carries its content hash (`artifact_path`), and the TEXT of the relay's program
(`relay_source`) that the docker and kubernetes backends pass to `python3 -I -S -c`. Host side: it reads the
package's files, it never imports the agent's runtime modules.

The zip holds a root `__main__.py` that runs `agent.__main__.main()` and the package as the top-level package
`agent/` (its modules import one another relatively, so the same files work as `agentrl.sandbox.agent` in tests).
Entries are sorted, dated 1980-01-01, mode 0644, stored uncompressed (no zlib version can change the bytes), with no
__pycache__ and no comment, each module's source with its bytecode as an unchecked hash-based .pyc of the building
interpreter's version (`_unchecked_pyc`: the agent starts without compiling on the same Python minor version, and
compiles the sources on any other): the same source and Python version give byte-identical artifacts, hence the same
hash (the Kubernetes agent ConfigMap is named after it). Every backend ships it read-only and starts it as `python3
-I -S DIR/agent.pyz ARGS`: with -I (isolated: no PYTHON* variables, no user site, no script directory on sys.path
beyond the archive itself) and -S (no site), sys.path is the standard library plus the archive, which the interpreter
always puts first for a zip application; the built-in zipimport imports its modules (checked on Python 3.11, the
images' python3 and Debian bookworm's). Where the agent runs from, `judge-python` is looked for next to the archive
(`handlers.judge_python`).

Cache directory: `$AGENTRL_CACHE/agent`, else `~/.cache/agentrl/agent` (as the model cache), else, when that is
not writable, a per-user directory under the system's temp directory.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

from agentrl.sandbox.agent.protocol import ARTIFACT_NAME

PACKAGE_DIR = Path(__file__).with_name("agent")
PACKAGE = "agent"  # the package's name inside the artifact
ROOT_MAIN = b"import sys\n\nfrom agent.__main__ import main\n\nsys.exit(main())\n"
EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip entry can carry
FILE_MODE = 0o644


def source_files(package_dir: Path = PACKAGE_DIR) -> list[Path]:
    """The package's modules, sorted by name (no subpackages, no caches)."""
    return sorted(p for p in package_dir.iterdir() if p.suffix == ".py" and p.is_file())


def build(package_dir: Path = PACKAGE_DIR) -> bytes:
    """The artifact's bytes: a zip application of `package_dir` (see the module docstring)."""
    import io
    import zipfile  # here: importing agentrl (the backends) need not pay for it

    entries = [("__main__.py", ROOT_MAIN)]
    entries += [(f"{PACKAGE}/{p.name}", p.read_bytes()) for p in source_files(package_dir)]
    entries += [(name[:-3] + ".pyc", _unchecked_pyc(name, source)) for name, source in entries]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, data in sorted(entries):
            info = zipfile.ZipInfo(name, date_time=EPOCH)
            info.create_system = 3  # unix: external_attr carries the mode
            info.external_attr = (0o100000 | FILE_MODE) << 16
            info.compress_type = zipfile.ZIP_STORED
            zf.writestr(info, data)
    return buf.getvalue()


def _unchecked_pyc(name: str, source: bytes) -> bytes:
    """The bytecode of `source` as an unchecked hash-based .pyc (PEP 552: flags 0b01, the source's hash, no
    timestamp): what zipimport loads instead of compiling the .py. Python 3.11's zipimport compiles a module's source
    twice (once for the spec's origin, once to run it); an interpreter of another version rejects the magic number
    and compiles the .py next to it, so the bytecode only ever saves time. marshal's output is deterministic for a
    given Python version (and the artifact's hash with it)."""
    import importlib.util
    import marshal

    code = compile(source, name, "exec", dont_inherit=True)
    return importlib.util.MAGIC_NUMBER + (0b01).to_bytes(4, "little") + importlib.util.source_hash(source) + \
        marshal.dumps(code)


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def artifact_name(data: bytes) -> str:
    """`agent-<first 16 hex digits of its sha256>.pyz`."""
    stem, _, suffix = ARTIFACT_NAME.rpartition(".")
    return f"{stem}-{digest(data)[:16]}.{suffix}"


def is_agent_path(arg: str | bytes) -> bool:
    """`arg` names the agent's artifact: `.../agent.pyz` as shipped into a sandbox, or a cached `agent-<hash>.pyz`
    (what a sandbox without isolation runs directly). For finding the agent's process by its command line."""
    base = os.fsdecode(arg).rpartition("/")[2]
    stem, _, suffix = ARTIFACT_NAME.rpartition(".")
    if base == ARTIFACT_NAME:
        return True
    head, _, tail = base.partition("-")
    hexdigits = tail[:-len(suffix) - 1]
    return (head == stem and tail.endswith("." + suffix) and bool(hexdigits)
            and all(c in "0123456789abcdef" for c in hexdigits))


def default_cache_dir() -> Path:
    root = os.environ.get("AGENTRL_CACHE")
    return (Path(root).expanduser() if root else Path.home() / ".cache" / "agentrl") / "agent"


def _private_temp_dir() -> Path:
    """A directory of this user's alone under the temp directory (0700, owned by us), for an unwritable cache."""
    import tempfile

    path = Path(tempfile.gettempdir(), f"agentrl-agent-{os.geteuid()}")
    path.mkdir(mode=0o700, exist_ok=True)
    st = path.lstat()
    if not path.is_dir() or path.is_symlink() or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise PermissionError(f"{path} is not a private directory of uid {os.geteuid()}")
    return path


def artifact_path(cache_dir: Path | None = None, package_dir: Path = PACKAGE_DIR) -> Path:
    """The artifact of `package_dir`, built and written into `cache_dir` (default: `default_cache_dir()`, or a private
    temp directory when that cannot be written) unless a file of the same bytes is there already. Atomic: a temp file
    in the same directory renamed over the name, so a concurrent start never sees half a file."""
    data = build(package_dir)
    name = artifact_name(data)
    places = [lambda: cache_dir] if cache_dir is not None else [default_cache_dir, _private_temp_dir]
    error: Exception | None = None
    for place in places:
        try:
            target_dir = place()
            target_dir.mkdir(parents=True, exist_ok=True)
            return _write_once(target_dir / name, data)
        except (OSError, RuntimeError) as e:  # RuntimeError: no home directory to be found
            error = e
    raise OSError(f"cannot write the agent's artifact {name} ({error})") from error


def _write_once(path: Path, data: bytes) -> Path:
    import tempfile

    try:
        if path.read_bytes() == data:
            return path
    except OSError:
        pass
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def shipped(agent_file: str | os.PathLike[str] | None = None) -> Path:
    """The file a backend ships: this tree's artifact (None), the artifact of an agent package directory, or a given
    file as it is (an artifact, or an older single-file agent to compare with: python runs either)."""
    if agent_file is None:
        return artifact_path()
    path = Path(agent_file)
    return artifact_path(package_dir=path) if path.is_dir() else path


def shipped_bytes(agent_file: str | os.PathLike[str] | None = None) -> bytes:
    """The bytes `shipped(agent_file)` would ship, without writing a cache file (the Kubernetes ConfigMap's)."""
    if agent_file is None:
        return build()
    path = Path(agent_file)
    return build(path) if path.is_dir() else path.read_bytes()


@functools.cache
def relay_source(package_dir: Path = PACKAGE_DIR) -> str:
    """The relay's program as TEXT (`python3 -I -S -c TEXT NAME`: the docker commands' container's and a sandbox
    pod's main process)."""
    return (package_dir / "relay_program.py").read_text()
