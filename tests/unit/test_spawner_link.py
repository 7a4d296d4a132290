"""The agent's link to a spawner while that spawner exits: `Spawner.ensure` asks `Link.alive()`, and the reader
thread closes the link's socket at EOF. CI once hit the window between the reader's close and its `lost = True`:
`ensure` polled the closed socket (fileno -1) and the exec failed with an agent error (HTTP 500) instead of starting
a fresh spawner."""

from __future__ import annotations

import socket
import subprocess
import threading
import time

from agentrl.sandbox.agent.process import Proc
from agentrl.sandbox.agent.spawner import Link


def _link() -> tuple[Link, socket.socket, subprocess.Popen]:
    ours, peer = socket.socketpair()
    child = subprocess.Popen(["sleep", "30"])
    link = Link(ours, Proc(child.pid), threading.Condition())
    link.start_reader()
    return link, peer, child


def test_a_link_whose_peer_hung_up_is_not_alive_even_before_the_reader_marks_it_lost() -> None:
    link, peer, child = _link()
    try:
        assert link.alive()
        with link.cond:  # the reader cannot finish its teardown while we hold the condition
            peer.close()
            time.sleep(0.3)  # the reader has seen EOF and waits for the condition
            assert not link.alive()  # polls the socket: still open, hung up (before: closed under us, ValueError)
        deadline = time.monotonic() + 5
        while not link.lost and time.monotonic() < deadline:
            time.sleep(0.01)
        assert link.lost and not link.alive()
        assert link.sock.fileno() == -1  # the reader closed it, after marking the link lost
    finally:
        link.discard()
        child.kill()
        child.wait()
