"""The in-sandbox agent as a package and as one artifact (agentrl/sandbox/artifact.py): the same source gives the same
bytes, the artifact runs under `python3 -I -S` from anywhere, the spawner's and the relay's programs are the package's
own module files, and the host side loads nothing of the agent but its protocol."""

from __future__ import annotations

import base64
import io
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from agentrl.sandbox import artifact
from agentrl.sandbox.agent import protocol
from agentrl.sandbox.kubernetes.pods import agent_configmap, agent_configmap_name


def _copy_package(dst: Path) -> Path:
    out = dst / "agent"
    shutil.copytree(artifact.PACKAGE_DIR, out, ignore=shutil.ignore_patterns("__pycache__"))
    return out


def test_same_source_gives_byte_identical_artifacts(tmp_path: Path) -> None:
    """Built twice, from the tree and from a copy with fresh timestamps and caches around it: the same bytes, sorted
    entries dated 1980-01-01, mode 0644, stored, no __pycache__ (each module's bytecode sits next to it, as an
    unchecked hash-based .pyc); the name carries the content hash."""
    copy = _copy_package(tmp_path)
    os.utime(copy / "server.py", (1_900_000_000, 1_900_000_000))
    (copy / "__pycache__").mkdir()
    (copy / "__pycache__" / "server.cpython-311.pyc").write_bytes(b"junk")
    one, two = artifact.build(), artifact.build(copy)
    assert one == two
    names = zipfile.ZipFile(Path(artifact.artifact_path(tmp_path / "c1", copy))).namelist()
    assert names == sorted(names) and names[0] == "__main__.py" and "agent/protocol.py" in names
    assert not any("__pycache__" in n for n in names)
    sources = [n for n in names if n.endswith(".py")]
    assert sorted(n[:-4] for n in names if n.endswith(".pyc")) == sorted(n[:-3] for n in sources)
    for info in zipfile.ZipFile(artifact.artifact_path(tmp_path / "c1", copy)).infolist():
        assert info.date_time == (1980, 1, 1, 0, 0, 0) and info.external_attr >> 16 == 0o100644
        assert info.compress_type == zipfile.ZIP_STORED
    a, b = artifact.artifact_path(tmp_path / "c1"), artifact.artifact_path(tmp_path / "c2")
    assert a.name == b.name == artifact.artifact_name(one) and a.read_bytes() == b.read_bytes() == one
    assert a.name.startswith("agent-") and a.name.removeprefix("agent-").removesuffix(".pyz") == \
        artifact.digest(one)[:16]
    assert a.stat().st_mode & 0o777 == 0o644
    (copy / "server.py").write_text((copy / "server.py").read_text() + "\n# changed\n")
    assert artifact.artifact_name(artifact.build(copy)) != a.name  # another source, another name


def test_artifact_is_written_once_and_rewritten_when_damaged(tmp_path: Path) -> None:
    path = artifact.artifact_path(tmp_path)
    first = path.stat().st_mtime_ns
    assert artifact.artifact_path(tmp_path) == path and path.stat().st_mtime_ns == first  # not written again
    path.write_bytes(b"truncated")
    assert artifact.artifact_path(tmp_path).read_bytes() == artifact.build()
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp file left behind


def test_artifact_runs_isolated_from_anywhere(tmp_path: Path) -> None:
    """`python3 -I -S agent.pyz`: sys.path is the standard library and the archive; the agent's modules come from
    the zip (zipimport), it answers, and the spawner's program text comes from the zip as well."""
    shipped = tmp_path / "dir" / protocol.ARTIFACT_NAME
    shipped.parent.mkdir()
    shipped.write_bytes(artifact.build())
    probe = ("import agent.spawner as s, agent.handlers as h\n"
             "print(s.__file__); print(len(s.SPAWNER_PROGRAM) > 1000); print(h.agent_home())\n")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", f"import sys; sys.path.insert(0, {str(shipped)!r})\n"
                          + probe], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split()
    assert lines[0] == f"{shipped}/agent/spawner.pyc" and lines[1] == "True", out.stdout  # its bytecode: no compile
    assert lines[2] == str(shipped.parent), out.stdout  # judge-python is looked for next to the artifact
    usage = subprocess.run([sys.executable, "-I", "-S", str(shipped), "--bogus", "x"], capture_output=True,
                           text=True, timeout=60, cwd="/")
    assert usage.returncode == 1 and usage.stderr.startswith("usage:"), usage


def test_program_modules_are_the_programs_text() -> None:
    """The spawner's `-c` text is seccomp.py's then spawner_program.py's (it starts itself at the end), and the relay's
    is relay_program.py's; each imports only builtins and ctypes, and is an ordinary module too."""
    from agentrl.sandbox.agent import relay_program, seccomp, spawner, spawner_program

    assert spawner.SPAWNER_PROGRAM == (artifact.PACKAGE_DIR / "seccomp.py").read_text() + \
        (artifact.PACKAGE_DIR / "spawner_program.py").read_text()
    assert "agentrl command spawner" in spawner.SPAWNER_PROGRAM  # what the tests find its process by
    assert artifact.relay_source() == (artifact.PACKAGE_DIR / "relay_program.py").read_text()
    assert callable(spawner_program.main) and callable(relay_program.main)
    assert spawner_program.install is seccomp.install
    check = ("import sys\nbefore = set(sys.modules)\nexec(compile(sys.argv[1], 'p', 'exec'), {'__name__': 'x'})\n"
             "print(sorted(m for m in set(sys.modules) - before if not m.startswith('_')))")
    for text in (spawner.SPAWNER_PROGRAM, artifact.relay_source()):
        out = subprocess.run([sys.executable, "-I", "-S", "-c", check, text], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out.stderr
        loaded = set(eval(out.stdout))  # besides builtins: os (frozen, what -S leaves unloaded), ctypes, select
        assert loaded <= {"ctypes", "ctypes._endian", "struct", "types", "select", "errno", "os", "os.path",
                          "posixpath", "genericpath", "stat"}, out.stdout


def test_host_side_loads_only_the_protocol() -> None:
    """Importing the backends and the client loads `agentrl.sandbox.agent` (an empty package) and its protocol, never
    the agent's runtime modules."""
    code = ("import sys, agentrl.config, agentrl.sandbox.local, agentrl.sandbox.client, agentrl.sandbox.artifact\n"
            "print(sorted(m for m in sys.modules if m.startswith('agentrl.sandbox.agent')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == "['agentrl.sandbox.agent', 'agentrl.sandbox.agent.protocol']", out.stdout


def test_kubernetes_configmap_carries_the_artifact_as_binary_data() -> None:
    data = artifact.build()
    cm = agent_configmap(agent_configmap_name(data), data, "ns")
    assert base64.b64decode(cm["binaryData"][protocol.ARTIFACT_NAME]) == data and "data" not in cm
    assert cm["metadata"]["name"] == "agentrl-agent-" + artifact.digest(data)[:12] and cm["immutable"] is True
    assert len(cm["binaryData"][protocol.ARTIFACT_NAME]) < 1 << 20  # a ConfigMap holds at most 1 MiB


def test_agent_paths_are_recognized() -> None:
    assert artifact.is_agent_path("/agentrl/agent.pyz") and artifact.is_agent_path(b"/.agentrl/agent.pyz")
    assert artifact.is_agent_path(str(artifact.artifact_path()))
    assert not artifact.is_agent_path("/x/agent.py") and not artifact.is_agent_path("/x/agent-.pyz")
    assert not artifact.is_agent_path("/x/agent-zz.pyz")


def test_an_unwritable_cache_falls_back_to_a_private_temp_dir(tmp_path: Path, monkeypatch) -> None:
    import tempfile

    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")
    monkeypatch.setenv("AGENTRL_CACHE", str(blocked))  # its agent/ cannot be created
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    path = artifact.artifact_path()
    assert path.parent == tmp_path / "tmp" / f"agentrl-agent-{os.geteuid()}" and path.read_bytes() == artifact.build()
    assert path.parent.stat().st_mode & 0o777 == 0o700


def test_an_interpreter_of_another_version_compiles_the_sources(tmp_path: Path) -> None:
    """The .pyc entries are the building interpreter's: another Python rejects their magic number and zipimport
    compiles the .py next to each (simulated here by a foreign magic number)."""
    foreign = tmp_path / protocol.ARTIFACT_NAME
    with zipfile.ZipFile(io.BytesIO(artifact.build())) as src, zipfile.ZipFile(foreign, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            dst.writestr(info, b"\x00\x00\r\n" + data[4:] if info.filename.endswith(".pyc") else data)
    out = subprocess.run([sys.executable, "-I", "-S", "-c", f"import sys; sys.path.insert(0, {str(foreign)!r})\n"
                          "import agent.handlers as h; print(h.__file__)"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == f"{foreign}/agent/handlers.py", out
