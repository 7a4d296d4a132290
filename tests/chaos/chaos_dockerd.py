"""The chaos soak's dockerd restarts: a private Docker Engine of the soak's own, restarted as a fault.

`PrivateDockerd` runs a dockerd with its own socket, data root, exec root, pid file and config (no bridge, no
iptables: the sandboxes have no network), with the sandbox image loaded into it by `docker save | docker load`, so
restarting it touches no other job's containers; the machine's dockerd is never touched. `Restarter` gives it
SIGTERM (no live-restore: it stops every container) every N seconds of a run and starts it again; before each
SIGTERM it records the attempts in flight (the sandboxes running in that engine, by the marker each trajectory's
first command writes, and the leased ones with no marker yet). The private engine is stopped, unmounted and removed
at the end (atexit too). Needs root.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos_plan import MARKER

class PrivateDockerd:
    """A dockerd of this benchmark's own (socket, data root, exec root, pid file and config under `root`; no bridge, no
    iptables: the sandboxes have no network), so restarting it touches no other job's containers. `restart()` is the
    fault: SIGTERM (no live-restore: dockerd stops every container), wait for it to exit, start it again with the same
    command line. `cleanup()` leaves the machine as it was: the daemon and its containerd stopped, the mounts under
    `root` unmounted, `root` removed (also from atexit, if the benchmark dies before its `finally`)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.sock, self.log = root / "docker.sock", root / "dockerd.log"
        self.host = f"unix://{self.sock}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.argv = ["dockerd", "-H", self.host, "--data-root", str(root / "data"), "--exec-root", str(root / "exec"),
                     "--pidfile", str(root / "dockerd.pid"), "--config-file", str(root / "daemon.json"),
                     "--bridge", "none", "--iptables=false", "--ip-masq=false", "--ip-forward=false",
                     "--storage-driver", "overlay2", "--exec-opt", "native.cgroupdriver=cgroupfs",
                     "--containerd-namespace", "agentrl-chaos", "--containerd-plugins-namespace",
                     "agentrl-chaos-plugins", "--log-level", "warn"]

    @staticmethod
    def problem() -> str | None:
        """Why a private dockerd cannot run here, or None."""
        if os.geteuid() != 0:
            return "a private dockerd needs root"
        if shutil.which("dockerd") is None or shutil.which("docker") is None:
            return "dockerd / docker not installed"
        return None

    def docker(self, *args: str, **kw: Any) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(["docker", "-H", self.host, *args], capture_output=True, check=False, **kw)

    def start(self, timeout_s: float = 120.0) -> float:
        """Start the daemon; return once it answers (seconds it took)."""
        t0 = time.monotonic()
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "daemon.json").write_text("{}")  # not the machine's /etc/docker/daemon.json
        with self.log.open("ab") as logf:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                                         start_new_session=True)
        while self.docker("version", timeout=30).returncode != 0:
            if self.proc.poll() is not None or time.monotonic() - t0 > timeout_s:
                raise RuntimeError(f"private dockerd did not start (rc {self.proc.poll()}): "
                                   f"{self.log.read_text(errors='replace')[-1500:]}")
            time.sleep(0.2)
        return time.monotonic() - t0

    def stop(self, timeout_s: float = 90.0) -> None:
        """SIGTERM and wait (dockerd stops its containers first); SIGKILL past `timeout_s`."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def restart(self) -> float:
        """The fault: stop, start again; returns the seconds the engine was away."""
        t0 = time.monotonic()
        self.stop()
        self.start()
        return time.monotonic() - t0

    def load(self, image: str) -> None:
        """`docker save IMAGE | docker -H <private> load` (offline: no registry)."""
        save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
        assert save.stdout is not None
        load = subprocess.run(["docker", "-H", self.host, "load"], stdin=save.stdout, capture_output=True,
                              check=False)
        save.stdout.close()
        if save.wait() != 0 or load.returncode != 0:
            raise RuntimeError(f"loading {image} into the private dockerd failed: {load.stderr.decode()[-500:]}")

    def container_pids(self) -> list[tuple[str, int]]:
        """(name, host pid of its init) of each running container (two calls, however many containers: a snapshot
        taken while the run goes on must be quick)."""
        ids = self.docker("ps", "-q", timeout=60).stdout.decode().split()
        if not ids:
            return []
        r = self.docker("inspect", "--format", "{{.Name}} {{.State.Pid}}", *ids, timeout=60)
        rows = [line.split() for line in r.stdout.decode().splitlines()]
        return [(row[0].lstrip("/"), int(row[1])) for row in rows if len(row) == 2 and row[1].isdigit()
                and int(row[1]) > 0]

    def cleanup(self) -> list[str]:
        """Stop the daemon, end what it left running (its containerd and shims, found by this root in their command
        line), unmount everything under `root` (deepest first) and remove it. Returns what was left to do by hand."""
        self.stop()
        root = str(self.root)
        for pid in _pids_mentioning(root):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for mount in sorted(_mounts_under(root), reverse=True):
            if subprocess.run(["umount", mount], capture_output=True, check=False).returncode:
                subprocess.run(["umount", "-l", mount], capture_output=True, check=False)
        shutil.rmtree(self.root, ignore_errors=True)
        left = [f"mount {m}" for m in _mounts_under(root)] + [f"pid {p}" for p in _pids_mentioning(root)]
        if self.root.exists():
            left.append(f"dir {root}")
        return left


def _mounts_under(root: str) -> list[str]:
    prefix = root.rstrip("/") + "/"
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        target = line.split()[1].replace("\\040", " ")
        if target.startswith(prefix):
            found.append(target)
    return found


def _pids_mentioning(root: str) -> list[int]:
    """Processes whose command line names `root` (the private dockerd's containerd and its shims: this run's own)."""
    needle, out = root.encode(), []
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                if needle in Path(f"/proc/{pid}/cmdline").read_bytes():
                    out.append(int(pid))
            except OSError:
                continue
    return out


@dataclass
class RestartRecord:
    t_s: float  # when dockerd got SIGTERM, seconds since the run started
    down_s: float = 0.0  # until the restarted engine answered
    affected: list[str] = field(default_factory=list)  # attempt ids whose sandbox was running (their marker)
    unmarked_leased: list[str] = field(default_factory=list)  # leased containers (names) with no marker yet
    warm: int = 0  # unleased warm containers (they die too; the pool replaces them)
    note: str = ""


class Restarter:
    """Restarts the private dockerd every `every_s` seconds while a run lasts. Before each SIGTERM it records which
    trajectory attempts had a sandbox in that engine (the marker each one's first command writes, read through the
    agent's /proc/<pid>/root); an attempt that already asked the reward service is done with its sandbox and is not
    counted."""

    def __init__(self, dockerd: PrivateDockerd, every_s: float, t0: float, reward_answers: dict[str, list[int]]
                 ) -> None:
        self.dockerd, self.every_s, self.t0, self.answers = dockerd, every_s, t0, reward_answers
        self.records: list[RestartRecord] = []
        self.stopping = asyncio.Event()

    async def run(self) -> None:
        """Until `stopping` is set; a restart in progress is finished first (it runs on a thread)."""
        while True:
            try:
                await asyncio.wait_for(self.stopping.wait(), self.every_s)
                return
            except TimeoutError:
                pass
            rec = RestartRecord(t_s=0.0)
            try:
                await asyncio.to_thread(self._snapshot, rec)
                rec.t_s = time.perf_counter() - self.t0
                self.records.append(rec)
                rec.down_s = round(await asyncio.to_thread(self.dockerd.restart), 2)
            except Exception as exc:  # noqa: BLE001 - recorded; the run goes on
                rec.note = f"{type(exc).__name__}: {exc}"

    def _snapshot(self, rec: RestartRecord) -> None:
        for name, init in self.dockerd.container_pids():  # docker-init shares the agent's mount namespace
            root = f"/proc/{init}/root"
            try:
                marker = Path(f"{root}{MARKER}").read_text()
            except OSError:
                marker = ""
            if marker:
                if marker not in self.answers:
                    rec.affected.append(marker)
            elif os.path.exists(f"{root}/workspace/solution.py"):  # env.setup wrote it: leased
                rec.unmarked_leased.append(name)
            else:
                rec.warm += 1


SANDBOX_IMAGE = "agentrl/python:latest"


def start_private_dockerd(image: str) -> PrivateDockerd:
    """A private dockerd under a fresh temp dir, with `image` loaded from the machine's engine; removed at exit even
    when the benchmark dies before its `finally` (atexit)."""
    problem = PrivateDockerd.problem()
    if problem:
        raise SystemExit(f"--dockerd-restart-every: {problem}")
    dockerd = PrivateDockerd(Path(tempfile.mkdtemp(prefix="agentrl-chaos-dockerd-", dir="/tmp")))
    atexit.register(dockerd.cleanup)
    t0 = time.monotonic()
    dockerd.start()
    dockerd.load(image)
    print(f"private dockerd at {dockerd.host}, {image} loaded ({time.monotonic() - t0:.1f} s)", file=sys.stderr)
    return dockerd

