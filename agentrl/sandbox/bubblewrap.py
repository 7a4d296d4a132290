"""The bubblewrap command line of a local sandbox: namespaces, mounts, environment and the agent's argv.

Owns: turning a SandboxSpec, the sandbox's state dir and its cgroup plan into the argv that `local.py` starts
(bwrap ... -- python3 -I -S agent.pyz ...; a plain agent process when unsafe), and the whole environment the agent
and its commands get. Pure but for reading which system directories exist on this host. Does not own: starting, watching
or removing sandboxes, state files, the judge's interpreter copy (`local.py`) or limits (`limits.py`); the layout
inside the sandbox is described in `local.py`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from agentrl.sandbox import limits
from agentrl.sandbox.agent.protocol import ARTIFACT_NAME
from agentrl.sandbox.base import SandboxSpec

SANDBOX_UID = 1000
AGENT_CAPS = ("CAP_CHOWN", "CAP_KILL", "CAP_SETGID", "CAP_SETUID")  # chown the workspace root; kill/run as 1000
AGENT_DIR = "/.agentrl"
WORKSPACE = "/workspace"
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime", "timezone", "hosts",
             "nsswitch.conf", "ssl", "ca-certificates", "mime.types", "os-release", "debian_version")


@dataclass(frozen=True)
class Bubblewrap:
    """What the command line takes from the local backend (its settings, read when a sandbox starts)."""

    bwrap: str | None  # the bwrap executable (None only when unsafe)
    python: str  # the agent's interpreter
    agent_file: str  # the agent's artifact (artifact.py), bound read-only at AGENT_DIR/agent.pyz
    unsafe: bool  # no isolation: the agent as a plain process
    uid_separated: bool  # host root: the agent is root with AGENT_CAPS, commands run as SANDBOX_UID
    ro_binds: tuple[str, ...] = ()  # host paths bound read-only at the same place
    path_prepend: tuple[str, ...] = ()  # put before the system PATH (a shared host venv)
    judge_python: str | None = None  # root's execute-only python3 copy, bound at AGENT_DIR/judge-python

    def argv(self, spec: SandboxSpec, path: Path, plan: limits.LimitPlan | None = None) -> list[str]:
        if self.unsafe:
            return [self.python, "-I", "-S", self.agent_file, "--unix", str(path / "run" / "agent.sock"),
                    "--workspace", str(path / "workspace")]
        agent = [self.python, "-I", "-S", f"{AGENT_DIR}/{ARTIFACT_NAME}", "--unix", f"{AGENT_DIR}/run/agent.sock",
                 "--workspace", WORKSPACE]
        if self.uid_separated:
            agent += ["--run-as", f"{SANDBOX_UID}:{SANDBOX_UID}"]
        if spec.writable_dirs:
            agent += ["--writable", ":".join(spec.writable_dirs)]
        separated = plan is not None and plan.separated
        cgroup_binds: list[str] = []
        if plan is not None and separated:
            inside = [f"{AGENT_DIR}/cgroup/{i}" for i in range(len(plan.cgroups))]
            agent += ["--cgroups", ("v2:" if plan.mode == "cgroup2" else "v1:") + ":".join(inside)]
            cgroup_binds = ["--perms", "0700", "--dir", f"{AGENT_DIR}/cgroup"]
            for host_dir, target in zip(plan.cgroups, inside):
                cgroup_binds += ["--bind", host_dir, target]
        # cgroup v2 with nsdelegate: the agent must see `commands` from its cgroup namespace to move commands there
        own_cgroupns = not (plan is not None and separated and plan.mode == "cgroup2")
        assert self.bwrap is not None  # checked in __init__; unsafe sandboxes never build a bwrap argv
        return [self.bwrap, *self._namespace_args(spec, own_cgroupns), *self._mount_args(spec, path, cgroup_binds),
                *self._env_args(), "--chdir", WORKSPACE, "--", *agent]

    def _namespace_args(self, spec: SandboxSpec, own_cgroupns: bool = True) -> list[str]:
        if self.uid_separated:  # no user namespace: the agent is root with a handful of capabilities
            args = ["--cap-drop", "ALL"]
            for cap in AGENT_CAPS:
                args += ["--cap-add", cap]
        else:
            args = ["--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--disable-userns"]
        args += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--hostname", "sandbox",
                 *(["--unshare-cgroup-try"] if own_cgroupns else []), "--die-with-parent", "--new-session"]
        if not spec.network:
            args.append("--unshare-net")
        return args

    def _mount_args(self, spec: SandboxSpec, path: Path, extra_binds: Sequence[str] = ()) -> list[str]:
        args: list[str] = []
        for d in SYSTEM_DIRS:
            if os.path.islink(d):
                args += ["--symlink", os.readlink(d), d]
            elif os.path.isdir(d):
                args += ["--ro-bind", d, d]
        for name in ETC_FILES + (("resolv.conf",) if spec.network else ()):
            args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        disk = str(spec.disk_bytes)
        shm = str(min(spec.disk_bytes, 64 * 1024 * 1024))
        args += ["--ro-bind", str(path / "passwd"), "/etc/passwd", "--ro-bind", str(path / "group"), "/etc/group",
                 "--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", shm, "--tmpfs", "/dev/shm",
                 "--perms", "1777", "--size", disk, "--tmpfs", "/tmp", "--size", disk, "--tmpfs", WORKSPACE]
        extras = self.ro_binds + self._interpreter_binds()
        for parent in self._parent_dirs(extras + spec.writable_dirs):
            args += ["--perms", "0755", "--dir", parent]
        for d in spec.writable_dirs:  # created root-owned when uid-separated: the agent chowns them (CAP_CHOWN)
            args += ["--perms", "0755", "--size", disk, "--tmpfs", d]
        for extra in extras:  # after the tmpfs mounts: a venv under /tmp stays visible
            args += ["--ro-bind", extra, extra]
        if self.judge_python:  # the command user may traverse the agent's directory (not list it) to run it
            args += ["--perms", "0711", "--dir", AGENT_DIR,
                     "--ro-bind", self.judge_python, f"{AGENT_DIR}/judge-python"]
        args += ["--ro-bind", self.agent_file, f"{AGENT_DIR}/{ARTIFACT_NAME}",
                 "--bind", str(path / "run"), f"{AGENT_DIR}/run", *extra_binds,
                 "--remount-ro", "/"]  # the root tmpfs bwrap builds would otherwise be writable (and unlimited)
        return args

    def _parent_dirs(self, targets: Sequence[str]) -> list[str]:
        """Directories bwrap would create on the way to `targets`. As root it creates them 0700, which the sandbox
        user could not traverse: with uid separation they are created 0755 first (in the read-only root)."""
        if not self.uid_separated:
            return []
        covered = ("/dev", "/proc", AGENT_DIR, *SYSTEM_DIRS)  # mounted whole: nothing is created inside them
        tmpfs_roots = ("/tmp", WORKSPACE)  # fresh tmpfs mounts: only their subdirectories are created (e.g. a venv
        out: list[str] = []                # under /tmp, whose parents bwrap would otherwise make 0700)
        for target in targets:
            for parent in reversed(Path(target).parents[:-1] if len(Path(target).parents) > 1 else ()):
                name = str(parent)
                if name in out or name in tmpfs_roots or any(name == c or name.startswith(c + "/") for c in covered):
                    continue
                out.append(name)
        return out

    def _interpreter_binds(self) -> tuple[str, ...]:
        """The agent's interpreter must be visible: outside /usr, bind its installation prefix read-only."""
        real = os.path.realpath(self.python)
        if real.startswith("/usr/") or any(real.startswith(b + "/") for b in self.ro_binds):
            return ()
        return (str(Path(real).parent.parent),)

    def env(self, home: str) -> dict[str, str]:
        """The whole environment of the agent and its commands (nothing of the host's leaks in: no tokens)."""
        path = ":".join((*self.path_prepend, "/usr/local/bin", "/usr/bin", "/bin"))
        return {"PATH": path, "HOME": home, "USER": "agent", "LANG": "C.UTF-8", "TMPDIR": "/tmp"}

    def _env_args(self) -> list[str]:
        args = ["--clearenv"]
        for key, value in self.env(WORKSPACE).items():
            args += ["--setenv", key, value]
        return args
