"""Helpers of the docker tier shared by its conftest and tests: which containers a process owns, and restarting
the local dockerd the way it was started."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

IMAGE = "agentrl/python:latest"
RUN_ID = f"pytest-{uuid.uuid4().hex[:8]}"
DOCKERD_LOG = Path(os.environ.get("AGENTRL_DOCKERD_LOG", "/var/log/agentrl-dockerd.log"))


def containers_owned_by(pid: int) -> list[str]:
    """Names of agentrl containers (running or not) whose owner process is `pid` on this host."""
    import docker

    client = docker.from_env(timeout=30)
    try:
        found = client.api.containers(all=True, filters={"label": [f"agentrl.owner_pid={pid}",
                                                                   f"agentrl.owner_host={socket.gethostname()}"]})
    finally:
        client.close()
    return [c["Names"][0].lstrip("/") for c in found]


# ---------------------------------------------------------------- restarting dockerd (used by one test)


def _docker_info_ok() -> bool:
    return subprocess.run(["docker", "info"], capture_output=True, check=False).returncode == 0


def _wait_for_engine(timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not _docker_info_ok():
        if time.monotonic() > deadline:
            raise RuntimeError(f"dockerd did not come back within {timeout_s:.0f}s (log: {DOCKERD_LOG})")
        time.sleep(0.5)


def _dockerd_pid() -> int | None:
    try:
        pid = int(Path("/var/run/docker.pid").read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _running(pid) and Path(f"/proc/{pid}/comm").read_text().strip() == "dockerd" else None


def _running(pid: int) -> bool:
    """Exists and is not a zombie (an init that does not reap would leave one behind)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def restart_problem() -> str | None:
    """Why this test process cannot restart dockerd, or None."""
    if os.geteuid() != 0:
        return "restarting dockerd needs root"
    if os.environ.get("DOCKER_HOST", "unix://").split("://")[0] not in ("unix", ""):
        return "DOCKER_HOST points at a remote engine"
    if shutil.which("systemctl") and subprocess.run(["systemctl", "is-active", "--quiet", "docker"],
                                                    capture_output=True, check=False).returncode == 0:
        return None
    return None if _dockerd_pid() is not None else "no dockerd pid file (/var/run/docker.pid) to restart from"


def restart_dockerd(timeout_s: float = 60.0) -> None:
    """Restart the local dockerd the way it was started: systemd if it manages docker, else SIGTERM the daemon,
    wait for it to exit, and start it again with the same command line (in its own session, logging to
    DOCKERD_LOG). Returns once `docker info` answers."""
    if shutil.which("systemctl") and subprocess.run(["systemctl", "is-active", "--quiet", "docker"],
                                                    capture_output=True, check=False).returncode == 0:
        subprocess.run(["systemctl", "restart", "docker"], check=True)
        _wait_for_engine(timeout_s)
        return
    pid = _dockerd_pid()
    if pid is None:
        raise RuntimeError("no running dockerd found via /var/run/docker.pid")
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _running(pid):
        if time.monotonic() > deadline:
            raise RuntimeError(f"dockerd (pid {pid}) did not exit within {timeout_s:.0f}s of SIGTERM")
        time.sleep(0.2)
    with open(DOCKERD_LOG, "ab") as logf:  # setsid -f: detached, outlives the tests, nobody waits on it
        subprocess.run(["setsid", "-f", *(a.decode() for a in argv)], stdin=subprocess.DEVNULL, stdout=logf,
                       stderr=logf, check=True)
    _wait_for_engine(timeout_s)
