"""Paths of file requests: resolved without recursion and bounded (`real_path`), confined to the workspace and the
extra writable directories (`resolve_in_workspace`), opened as regular files only, through openat2
RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS where the kernel has it (`open_regular`)."""

from __future__ import annotations

import ctypes
import errno
import os
import stat

from .protocol import KIND_BAD_PATH, KIND_NOT_REGULAR, HTTPError

MAX_PATH_CHARS = 4096  # a requested path longer than this is refused (the kernel's PATH_MAX)
MAX_SYMLINK_HOPS = 40  # symbolic links followed while resolving one path (the kernel's own limit, ELOOP)
MAX_PATH_STEPS = 4096  # path components looked at while resolving one path, symlink targets included
SYS_OPENAT2 = 437  # the same number on every architecture (Linux >= 5.6)
RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS, RESOLVE_BENEATH = 0x02, 0x04, 0x08


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


class _Openat2:
    """openat2(2) through ctypes, probed once: unusable where the kernel or a seccomp filter lacks it."""

    _usable: bool | None = None
    _libc: ctypes.CDLL | None = None

    @classmethod
    def usable(cls) -> bool:
        if cls._usable is None:
            try:
                cls._libc = ctypes.CDLL(None, use_errno=True)
                fd = cls._call(-100, "/", os.O_PATH | os.O_CLOEXEC, 0, 0)  # AT_FDCWD
                os.close(fd)
                cls._usable = True
            except (OSError, AttributeError):
                cls._usable = False
        return cls._usable

    @classmethod
    def _call(cls, dirfd: int, path: str, flags: int, mode: int, resolve: int) -> int:
        assert cls._libc is not None, "usable() loads libc first"
        how = _OpenHow(flags, mode, resolve)
        fd = cls._libc.syscall(ctypes.c_long(SYS_OPENAT2), ctypes.c_int(dirfd), ctypes.c_char_p(os.fsencode(path)),
                               ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), path)
        return fd

    @classmethod
    def beneath(cls, root: str, rel: str, flags: int, mode: int) -> int:
        """Open `rel` under the directory `root` with no symlink followed and nothing outside `root` reached."""
        dirfd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            return cls._call(dirfd, rel, flags, mode, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)
        finally:
            os.close(dirfd)


def _bad_path(shown: object, why: str) -> HTTPError:
    return HTTPError(400, f"path {shown!r} {why}", KIND_BAD_PATH)


def real_path(path: str, shown: object) -> str:
    """os.path.realpath of the absolute `path` (missing components taken literally), without recursion and bounded:
    at most MAX_SYMLINK_HOPS symbolic links and MAX_PATH_STEPS components; 400 (kind "bad_path") beyond that."""
    todo = [c for c in reversed(path.split("/")) if c]  # a stack: the next component is last
    parts: list[str] = []
    hops = steps = 0
    while todo:
        steps += 1
        if steps > MAX_PATH_STEPS:
            raise _bad_path(shown, f"has more than {MAX_PATH_STEPS} components to resolve (symlink targets included)")
        name = todo.pop()
        if name == ".":
            continue
        if name == "..":
            if parts:
                parts.pop()
            continue
        candidate = "/" + "/".join((*parts, name))
        try:
            st = os.lstat(candidate)
        except OSError:  # missing or not searchable: the rest is taken as written (open answers 404 / 403)
            parts.append(name)
            continue
        if not stat.S_ISLNK(st.st_mode):
            parts.append(name)
            continue
        hops += 1
        if hops > MAX_SYMLINK_HOPS:
            raise _bad_path(shown, f"goes through more than {MAX_SYMLINK_HOPS} symbolic links (a loop or a chain); "
                                   "replace the link by the file")
        target = os.readlink(candidate)
        if target.startswith("/"):
            parts = []
        todo.extend(c for c in reversed(target.split("/")) if c)
    return "/" + "/".join(parts)


def resolve_in_workspace(root: str, path: object, extra: tuple[str, ...] = ()) -> str:
    """The real path of `path` (relative to `root`, or absolute inside it or inside one of the `extra` writable
    directories); 403 when it resolves outside all of them, 400 (kind "bad_path") when it cannot be resolved."""
    if not isinstance(path, str) or not path:
        raise HTTPError(400, "field 'path' must be a non-empty string")
    if "\x00" in path or len(path) > MAX_PATH_CHARS:
        raise _bad_path(path[:200], f"contains a NUL byte or is longer than {MAX_PATH_CHARS} characters")
    try:
        os.fsencode(path)
    except UnicodeError:
        raise _bad_path(path, "is not encodable as a file name") from None
    real = real_path(os.path.join(root, path), path)
    if _root_of(real, (root, *extra)) is None:
        where = " or ".join((root, *extra))
        raise HTTPError(403, f"path {path!r} resolves outside the workspace {where} (to {real}); use a path inside it")
    return real


def _root_of(real: str, roots: tuple[str, ...]) -> str | None:
    inside = [r for r in roots if real == r or real.startswith(r.rstrip("/") + "/")]
    return max(inside, key=len) if inside else None


def open_regular(real: str, roots: tuple[str, ...], flags: int, mode: int, shown: str) -> int:
    """Open the resolved path `real` (inside one of `roots`) as a regular file: never blocks on a FIFO or device
    (O_NONBLOCK), follows no symlink on the way (one swapped in after resolution is refused, not followed: openat2
    RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS where the kernel has it, else O_NOFOLLOW on the last component), and
    refuses anything but a regular file (400, kind "not_regular")."""
    flags |= os.O_NONBLOCK | os.O_CLOEXEC
    root = _root_of(real, roots)
    try:
        if root is not None and _Openat2.usable():
            fd = _Openat2.beneath(root, real[len(root):].lstrip("/") or ".", flags, mode)
        else:
            fd = os.open(real, flags | os.O_NOFOLLOW, mode)
    except OSError as e:
        if e.errno in (errno.ENXIO, errno.EISDIR):
            raise HTTPError(400, f"path {shown!r} is not a regular file ({e.strerror})", KIND_NOT_REGULAR) from None
        if e.errno in (errno.ELOOP, errno.EXDEV, errno.EAGAIN):  # EAGAIN: openat2 saw a rename race
            raise _bad_path(shown, "changed into a symbolic link while it was opened; try again") from None
        raise
    kind = stat.S_IFMT(os.fstat(fd).st_mode)
    if kind != stat.S_IFREG:
        os.close(fd)
        what = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket",
                stat.S_IFCHR: "a device", stat.S_IFBLK: "a device"}.get(kind, "not a regular file")
        raise HTTPError(400, f"path {shown!r} is not a regular file ({what})", KIND_NOT_REGULAR)
    os.set_blocking(fd, True)
    return fd
