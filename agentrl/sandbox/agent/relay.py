"""The agent's side of the relay (`--relay NAME`; the relay's own program is relay_program.py): connecting to it
on its abstract unix socket, checked to be a process of the agent's uid, and waiting for it at start-up."""

from __future__ import annotations

import errno
import os
import socket
import sys
import time

RELAY_TIMEOUT_S = 10.0  # connecting to the relay and getting its answer
RELAY_WAIT_S = 300.0  # at start-up, how long the agent waits for the relay before it gives up (exit 1)


def _peer_uid(conn: socket.socket) -> int:
    return int.from_bytes(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)[4:8], sys.byteorder)


def connect_relay(name: str, timeout_s: float) -> socket.socket:
    """A connection to the relay on the abstract socket `name`, checked to be a process of our uid (a command that
    bound the name is not). Raises OSError (no relay: refused) or PermissionError (another uid holds the name)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(timeout_s)
        conn.connect("\0" + name)
        if _peer_uid(conn) != os.getuid():
            raise PermissionError(errno.EPERM, "the relay's socket is held by a process of another uid (the sandbox "
                                               "container's relay is gone and a command took its name)")
    except BaseException:
        conn.close()
        raise
    return conn


def wait_for_relay(name: str, timeout_s: float = RELAY_WAIT_S) -> None:
    """Block until the relay answers on `name` as a process of our uid (the sandbox container may start after the
    agent's, and a 0.05-CPU container takes a while to start python): the agent listens, so the pod turns ready,
    only after this, and a relay that stops answering later was ended by the commands. Exits when it never comes."""
    end = time.monotonic() + timeout_s
    why = "not started"
    while time.monotonic() < end:
        try:
            connect_relay(name, RELAY_TIMEOUT_S).close()
            return
        except OSError as e:
            why = str(e)
        time.sleep(0.05)
    sys.exit(f"agent: the relay {name!r} in the sandbox container did not answer within {timeout_s:g}s ({why}): "
             "is that container running `python3 -I -S -c <relay_program.py> NAME`?")
