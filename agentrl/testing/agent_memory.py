"""The in-sandbox agent's peak memory as the host sees it, for tests and benchmarks (issue 31: the agent's memory
must not depend on the data it carries).

The agent is found on the host as the top-most process below a sandbox's root process (bubblewrap for the local
backend, the container's init for docker) whose command line runs the agent's artifact (`agent.pyz`); its peak
resident memory is the kernel's VmHWM in /proc/<pid>/status (KiB), which only grows. Linux only; the caller must be
allowed to read the process's status (root, or the same uid).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agentrl.sandbox.artifact import is_agent_path


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def agent_pid(root: int) -> int:
    """The host pid of the agent below (or at) `root`: the first python process, breadth first, that runs the agent's
    artifact (an init such as docker-init names it among its arguments too)."""
    queue = [root]
    while queue:
        pid = queue.pop(0)
        argv = _cmdline(pid)
        if argv and "python" in argv[0].rsplit("/", 1)[-1] and any(is_agent_path(a) for a in argv[1:]):
            return pid
        queue += _children(pid)
    raise LookupError(f"no process running the agent (agent.pyz) below pid {root}")


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(f"/proc/{pid}/status has no {field}")


def peak_kib(pid: int) -> int:
    """The process's peak resident memory so far (VmHWM, KiB)."""
    return _status_kib(pid, "VmHWM")


def rss_kib(pid: int) -> int:
    """The process's resident memory now (VmRSS, KiB)."""
    return _status_kib(pid, "VmRSS")


def docker_root_pid(container: str, base_url: str | None = None) -> int:
    """The host pid of a running container's main process (docker inspect State.Pid), on the machine's engine or
    the one at `base_url` (e.g. the dev cluster's own dockerd, whose containers are the pods' on this host)."""
    import docker

    client = docker.DockerClient(base_url=base_url, timeout=30) if base_url else docker.from_env(timeout=30)
    try:
        return int(client.api.inspect_container(container)["State"]["Pid"])
    finally:
        client.close()


# ---------------------------------------------------------------- scenarios shared by the local and docker tiers

PEAK_BOUND = 48 << 20  # what carrying any amount of data may add to the agent's peak (FILE_CHUNK buffers, threads)


async def file_round_trip(sb: Any, pid: int, size: int) -> int:
    """Write `size` random bytes through the agent and read them back byte-exact (also checked inside the sandbox
    by sha256sum); returns how many bytes the agent's peak memory grew meanwhile."""
    before = peak_kib(pid)
    blob = os.urandom(size)
    await sb.write_file("big.bin", blob)
    res = await sb.exec(["sha256sum", "big.bin"], timeout=120)
    assert res.stdout.split()[:1] == [hashlib.sha256(blob).hexdigest()], res
    back = await sb.read_bytes("big.bin")
    assert len(back) == size and back == blob, "the file read back differs"
    await sb.exec(["rm", "-f", "big.bin"])
    return (peak_kib(pid) - before) * 1024


async def edit_and_undo(sb: Any, pid: int, run_editor: Callable[..., Awaitable[Any]], size: int) -> int:
    """repo_fix's editor on a `size`-byte file: str_replace near its end, then undo_edit; the file is checked
    byte-exact after each. Returns how many bytes the agent's peak memory grew meanwhile."""
    from agentrl.types import ToolCall

    line = b"x = 'abcdefghijklmnopqrstuvwxyz0123456789'\n"
    text = line * (size // len(line)) + b"MARKER = 1\n"
    path = "/workspace/big_module.py"
    before = peak_kib(pid)
    await sb.write_file(path, text)

    async def editor(**args: Any) -> Any:
        result = await run_editor(sb, ToolCall(id="c", name="str_replace_editor", arguments={"path": path, **args}),
                                  limit=4000)
        assert result.error is None, result.output
        return result

    await editor(command="str_replace", old_str="MARKER = 1", new_str="MARKER = 2")
    assert await sb.read_bytes(path) == text.replace(b"MARKER = 1", b"MARKER = 2")
    kept = await sb.exec("stat -c %s /workspace/.agentrl/undo.json; find /workspace/.agentrl/undo -type f | wc -l")
    index_bytes, copies = kept.stdout.split()
    assert int(index_bytes) < 4096 and copies == "1", kept  # the copy is on the sandbox's disk, its name in the index
    await editor(command="undo_edit")
    assert await sb.read_bytes(path) == text
    return (peak_kib(pid) - before) * 1024


async def tree_round_trip(sb: Any, pid: int, size: int, files: int = 200) -> int:
    """What repo_fix's fresh grading and its collect do with a tree of `size` bytes in `files` random files: one tar
    written through the agent, unpacked and packed again in the sandbox, the packed tar read back and its files
    checked byte-exact. Returns how many bytes the agent's peak memory grew meanwhile."""
    import io
    import tarfile

    buf, digest = io.BytesIO(), hashlib.sha256()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for i in range(files):
            data = os.urandom(size // files)
            digest.update(data)
            info = tarfile.TarInfo(f"pkg/mod_{i:03d}.bin")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    before = peak_kib(pid)
    await sb.write_file("tree.tar", buf.getbuffer())
    res = await sb.exec("mkdir -p tree && tar -xf tree.tar -C tree && rm tree.tar && tar -C tree -cf packed.tar .",
                        timeout=300)
    assert res.exit_code == 0, res
    packed = await sb.read_bytes("packed.tar")
    check = hashlib.sha256()
    with tarfile.open(fileobj=io.BytesIO(packed), mode="r:") as got:
        for member in sorted((m for m in got.getmembers() if m.isfile()), key=lambda m: m.name):
            f = got.extractfile(member)
            assert f is not None
            check.update(f.read())
    assert check.hexdigest() == digest.hexdigest(), "the tree read back differs"
    await sb.exec(["rm", "-rf", "tree", "packed.tar"], timeout=120)
    return (peak_kib(pid) - before) * 1024
