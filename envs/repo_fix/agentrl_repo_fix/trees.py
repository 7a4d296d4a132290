"""Source trees as data on the host: {relative path: bytes}. Extracting an sdist (regular files only, nothing outside
its root), unified diffs between trees (applyable by `git apply`), applying a diff, and tar archives to ship a tree
into a sandbox. Never executes anything from a tree.
"""

from __future__ import annotations

import difflib
import io
import subprocess
import tarfile
import tempfile
from pathlib import Path

Tree = dict[str, bytes]
SKIP_PARTS = ("__pycache__", ".git", ".tox", ".pytest_cache", ".eggs")
MAX_TREE_BYTES = 64 * 1024 * 1024


def from_sdist(path: Path) -> Tree:
    """The regular files of an sdist, relative to its top directory; .pyc files and caches are left out."""
    tree: Tree = {}
    with tarfile.open(path, "r:*") as tar:
        for member in tar.getmembers():
            if not member.isfile():
                continue
            parts = member.name.split("/")[1:]
            rel = "/".join(parts)
            if not rel or ".." in parts or any(p in SKIP_PARTS for p in parts) or rel.endswith((".pyc", ".pyo")):
                continue
            f = tar.extractfile(member)
            if f is not None:
                tree[rel] = f.read()
    return tree


def from_tar(data: bytes, *, max_bytes: int = MAX_TREE_BYTES) -> tuple[Tree, list[str]]:
    """The regular files of a tar archive made in a sandbox (untrusted): returns (tree, skipped), where skipped
    names links, devices and unsafe paths, which are never followed."""
    tree: Tree = {}
    skipped: list[str] = []
    total = 0
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for member in tar.getmembers():
            name = member.name[2:] if member.name.startswith("./") else member.name
            parts = name.split("/")
            if member.isdir() or name in ("", "."):
                continue
            if not member.isfile() or name.startswith("/") or ".." in parts:
                skipped.append(name)
                continue
            if any(p in SKIP_PARTS for p in parts) or name.endswith((".pyc", ".pyo")):
                continue
            total += member.size
            if total > max_bytes:
                raise ValueError(f"the repository holds more than {max_bytes} bytes of files")
            f = tar.extractfile(member)
            tree[name] = f.read() if f is not None else b""
    return tree, skipped


def to_tar(tree: Tree, prefix: str = "") -> bytes:
    """A deterministic tar of `tree` (sorted, fixed mtime/owner, mode 0644)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(tree):
            info = tarfile.TarInfo(prefix + name)
            info.size, info.mtime, info.mode = len(tree[name]), 0, 0o644
            tar.addfile(info, io.BytesIO(tree[name]))
    return buf.getvalue()


def diff(old: Tree, new: Tree) -> str:
    """A unified diff (git style a/ b/ paths) turning `old` into `new`, files in sorted order."""
    out: list[str] = []
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name), new.get(name)
        if a == b:
            continue
        out.append(_file_diff(name, a, b))
    return "".join(out)


def _file_diff(name: str, a: bytes | None, b: bytes | None) -> str:
    head = f"diff --git a/{name} b/{name}\n"
    if a is None:
        head += "new file mode 100644\n"
    elif b is None:
        head += "deleted file mode 100644\n"
    al = _lines(a)
    bl = _lines(b)
    body = list(difflib.unified_diff(al, bl, "a/" + name if a is not None else "/dev/null",
                                     "b/" + name if b is not None else "/dev/null", n=3))
    fixed: list[str] = []
    for line in body:
        fixed.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return head + "".join(fixed)


def _lines(data: bytes | None) -> list[str]:
    return [] if data is None else data.decode("utf-8", "surrogateescape").splitlines(keepends=True)


def apply_diff(tree: Tree, patch: str, *, reverse: bool = False) -> Tree:
    """`tree` with `patch` applied by `git apply` in a scratch directory. Raises ValueError when it does not apply."""
    with tempfile.TemporaryDirectory(prefix="repo-fix-apply-") as tmp:
        root = Path(tmp, "t")
        write(tree, root)
        argv = ["git", "-c", "core.hooksPath=/dev/null", "apply", "--whitespace=nowarn"]
        if reverse:
            argv.append("-R")
        proc = subprocess.run(argv, cwd=root, input=patch.encode("utf-8", "surrogateescape"), capture_output=True,
                              timeout=60)
        if proc.returncode != 0:
            raise ValueError(f"the diff does not apply: {proc.stderr.decode(errors='replace').strip()[:500]}")
        return read(root)


def write(tree: Tree, root: Path) -> None:
    for name, data in tree.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def read(root: Path) -> Tree:
    tree: Tree = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_file() and not path.is_symlink() and not any(p in SKIP_PARTS for p in rel.split("/")) \
                and not rel.endswith((".pyc", ".pyo")):
            tree[rel] = path.read_bytes()
    return tree
