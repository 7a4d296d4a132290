"""The agent's wire protocol: what the host side (`agentrl/sandbox/client.py`, the backends) and the agent share.
Stdlib only and nothing of the agent's runtime: the host imports this module alone.

Protocol (JSON bodies, /file's raw bytes; HTTP/1.1 keep-alive with Content-Length). One acceptor thread holds every
new connection until its first request head is complete (bounded count, size and time) and checks the bearer token;
only an authorized connection gets a worker thread (at most MAX_WORKERS), so a connection flood from inside the
sandbox costs no thread:

    GET  /health   -> {ok, pid, version, workspace, writable, uid_separated, command_uid, resources_separated,
                       commands_apart, judge_python, seccomp}   seccomp: the syscall policy's mode (notify, errno,
                       "none: why"; see seccomp.py); commands_apart: --relay, commands run in another container;
                       judge_python: the path of `judge-python` next to this file when the backend
                       put an execute-only interpreter copy there (root's, no read bit: a process the command user
                       starts from it is non-dumpable from its execve on, the kernel's rule for unreadable
                       binaries), else null
    POST /exec     {cmd: str|list, timeout, cwd, env, stdin, output_limit, kill_leftovers}
                   -> {exit_code, stdout, stderr, timed_out, truncated, duration_s, probes, resources}
                   kill_leftovers: after the command, kill every process of the command user (as /kill_all)
                   probes: what was observed since the last report, by name: the syscall policy's refusals
                   (SeccompWatch), signal_foreign / sigio_foreign / signal_unresolved (SignalTargets) and
                   network_attempt (NetAttempts), background processes' included;
                   resources: the commands' counters that moved during the command (ResourceCounters)
    POST /kill_all {} -> {killed: n, probes}   every process in `commands` (resource-separated), else every
                   process of the command user (uid-separated) or every descendant of the agent (single uid), until
                   none is left;
                   also those of concurrent execs; then the SysV IPC objects of the command user; 409 (kind
                   "survivors", "policy processes survived kill") when some survive SIGKILL for 5 s
    PUT  /file?path=P&mode=M   raw body (Content-Length: the file's size) -> {ok, bytes}   P percent-encoded
                   (UTF-8), M decimal (default 420 = 0o644); the body is written FILE_CHUNK bytes at a time as it
                   arrives (the agent never holds the file); an error met on the way (path refused, disk full) is
                   answered after the rest of the body was read and dropped; a body cut short leaves the file
                   with what arrived (the connection is gone: the host knows the write failed)
    GET  /file?path=P&max=N    -> 200 application/octet-stream, Content-Length: S + 1, where S is the file's size
                   by fstat once opened; the body is S bytes of the file, streamed FILE_CHUNK at a time, then one
                   status byte: b"." the file still had exactly S bytes at the end, b"!" it changed size while
                   read (or a read failed): the bytes before it are not the file (zero-padded to S when it shrank,
                   so the answer is never cut short and the host never waits). N (optional): a file larger than N
                   bytes is refused with 413 kind "too_large" naming N, before anything is sent. No limit of the
                   agent's own: its memory for a transfer is FILE_CHUNK whatever the size.
    errors         -> {error: msg[, kind]} with 400 (bad request; kind "not_regular" for a directory, FIFO, socket,
                   device or symlink; kind "bad_path" for a path that cannot be resolved: more than 40 symlinks,
                   too long, NUL, not encodable), 401 (token), 403 (path outside workspace, or not accessible to the
                   command user), 404 (no such file; kind "no_route": no such route), 409 (kind "survivors"),
                   413 (kind "too_large"), 431 (request head too large), 500 (a bug in the agent), 503
                   (MAX_WORKERS connections busy)

Paths are resolved without recursion (at most 40 symlinks, like the kernel) and opened with openat2
RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS below the workspace root where the kernel has it; files are opened
O_NONBLOCK and checked to be regular with fstat (so a FIFO cannot block a read).

After binding, the agent prints READY_LINE on stdout so the starter needs no polling.
"""

from __future__ import annotations

VERSION = 2  # 2: files move as raw bytes (PUT / GET /file); 1 had the JSON /write and /read
READY_LINE = "AGENTRL-AGENT-READY"  # printed on stdout once the agent listens
ARTIFACT_NAME = "agent.pyz"  # the file every backend ships (`python3 -I -S DIR/agent.pyz ARGS`)
MAX_BODY = 256 * 1024 * 1024  # JSON request bodies above this are refused with 413 (file bodies stream: no cap)
MAX_OUTPUT = 64 * 1024 * 1024  # an exec's output_limit (bytes kept per stream) is capped at this
FILE_CHUNK = 1 << 20  # PUT/GET /file move a file this many bytes at a time, on both sides
DEFAULT_OUTPUT_LIMIT = 64 * 1024

# GET /file's last byte: the file kept its size while it was read (FILE_DONE), or it did not (FILE_CHANGED)
FILE_DONE, FILE_CHANGED = b".", b"!"

# routes
HEALTH, EXEC, KILL_ALL, FILE = "/health", "/exec", "/kill_all", "/file"

# error kinds (the `kind` of an error body)
KIND_NOT_REGULAR = "not_regular"  # 400: a directory, FIFO, socket, device or symlink
KIND_BAD_PATH = "bad_path"  # 400: the path cannot be resolved
KIND_NO_ROUTE = "no_route"  # 404: no such route (an agent of another version)
KIND_SURVIVORS = "survivors"  # 409: processes survived SIGKILL
KIND_TOO_LARGE = "too_large"  # 413: a file larger than the reader's `max`

# GET /health's fields
HEALTH_FIELDS = ("ok", "pid", "version", "workspace", "writable", "uid_separated", "command_uid",
                 "resources_separated", "commands_apart", "judge_python", "seccomp")


class HTTPError(Exception):
    """An answer other than 200. `kind` (optional) is a machine-readable class the client maps to an exception."""

    def __init__(self, status: int, message: str, kind: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
