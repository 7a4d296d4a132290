"""The docker backend's directories on the host: per-sandbox socket dirs and the sandboxes' host cgroups.

Owns: where the socket dirs live (`default_socket_root`, one root per engine), making one safely, removing only
directories of ours (a label is data, not a path to trust blindly), and sweeping stale ones whose container is gone.
Blocking file-system calls: the backend runs them on its threads.

The socket directory is created by the host root:root 0700: the agent (container root, the owner) binds its socket
there and commands (uid 1000) cannot enter it, so they can neither replace the socket nor write to the host's disk
through it. A non-root host user runs sandboxes under its own uid:gid with no separation (so the 0600 socket is
reachable; `uid_separated: false`) and keeps the directory under $XDG_RUNTIME_DIR (a small per-user tmpfs) when that
is set; the directory is its own throughout.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tempfile
from pathlib import Path

from agentrl.errors import ConfigError
from agentrl.sandbox import limits

STALE_DIR_S = 300.0  # a socket dir with no container is removed by sweep() only when older than this


def default_socket_root(docker_host: str | None = None) -> Path:
    """Where per-sandbox socket dirs live: the temp dir for root, else $XDG_RUNTIME_DIR (a per-user tmpfs). One
    directory per engine (`docker_host`; None and $DOCKER_HOST mean the default one): a sweep removes the dirs of
    sandboxes its engine does not know, so two engines must never share one."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    host = docker_host or os.environ.get("DOCKER_HOST") or ""
    suffix = "-" + hashlib.sha256(host.encode()).hexdigest()[:8] if host else ""
    if os.geteuid() != 0 and runtime and os.path.isdir(runtime):
        return Path(runtime) / f"agentrl-docker{suffix}"
    return Path(tempfile.gettempdir()) / f"agentrl-docker-{os.geteuid()}{suffix}"


def make_sock_dir(socket_root: Path, sock_dir: Path) -> None:
    socket_root.mkdir(mode=0o711, parents=True, exist_ok=True)
    st = socket_root.lstat()  # in a shared temp dir: refuse a planted symlink or someone else's dir
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise ConfigError(f"sandbox socket directory {socket_root} is not a directory owned by uid "
                          f"{os.geteuid()}; remove it or pass another state_dir")
    sock_dir.mkdir(mode=0o700)  # ours (root:root when separated): only the agent, as container root, enters


def remove_sock_dir(socket_root: Path, path: str | None) -> None:
    """Remove a socket dir, but only one of ours (a label is data, not a path to trust blindly)."""
    if not path:
        return
    target = Path(path)
    if target.parent == socket_root and target.name.startswith("agentrl-"):
        shutil.rmtree(target, ignore_errors=True)


def remove_cgroups(limiter: limits.Limiter | None, joined: str | None) -> None:
    """Remove a sandbox's host cgroups named by its label, but only directories of ours (a label is data)."""
    if not joined or limiter is None:
        return
    ours = [d for d in joined.split(":") if Path(d).parent.as_posix() in limiter.parents
            and Path(d).name.startswith("agentrl-")]
    limits.remove_cgroups(ours)


def sweep_stale_dirs(socket_root: Path, limiter: limits.Limiter | None, live: set[str], now: float) -> None:
    """Socket dirs (and host cgroups) whose container is gone (removed outside agentrl) and that are old enough not
    to belong to a create in progress."""
    for parent in limiter.parents if limiter is not None else ():
        for d in Path(parent).glob("agentrl-*"):
            try:
                stale = d.name not in live and now - d.lstat().st_mtime > STALE_DIR_S
            except OSError:
                continue
            if stale:
                limits.remove_cgroups([str(d)])
    if not socket_root.is_dir():
        return
    for d in socket_root.iterdir():
        try:
            stale = d.name not in live and now - d.lstat().st_mtime > STALE_DIR_S
        except OSError:
            continue
        if stale:
            remove_sock_dir(socket_root, str(d))
