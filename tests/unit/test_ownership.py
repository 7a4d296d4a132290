"""The owner-liveness rule every backend's sweep applies (agentrl/sandbox/ownership.py), tested once against real
processes of this host; each backend's wiring (labels, annotations, state files) is tested with the backend."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from agentrl.sandbox.ownership import OwnerRecord, alive, host_id, owner_gone, process_start


@pytest.fixture
def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_live_owner_of_this_host_is_not_gone() -> None:
    me = OwnerRecord.here()
    assert me.host == host_id() and me.pid == os.getpid() and me.start == str(process_start(os.getpid()))
    assert not owner_gone(me.host, str(me.pid), me.start)
    assert not owner_gone(me.host, me.pid, int(me.start))  # the local backend's state file keeps numbers


def test_an_owner_that_exited_is_gone(dead_pid: int) -> None:
    assert process_start(dead_pid) is None
    assert owner_gone(host_id(), str(dead_pid), "12345")
    assert owner_gone(host_id(), dead_pid, None)


def test_a_reused_pid_is_a_different_owner() -> None:
    start = process_start(os.getpid())
    assert start is not None
    assert owner_gone(host_id(), str(os.getpid()), str(start + 1))  # same pid, started at another time


def test_owners_of_other_hosts_and_records_without_a_pid_are_left_to_the_ttl(dead_pid: int) -> None:
    assert not owner_gone("another-host", str(dead_pid), "1")
    assert not owner_gone(host_id(), "", "1") and not owner_gone(host_id(), None, None)
    assert not owner_gone(host_id(), "12a", "1")
    assert not owner_gone("pod:ns/name", str(dead_pid), "1", here="node-host")  # a pod's pids are not the node's


def test_a_missing_start_is_judged_by_the_pid_alone(dead_pid: int) -> None:
    assert alive(os.getpid(), None) and alive(str(os.getpid()), "")
    assert not alive(dead_pid, None)  # the old local rule called a gone pid without a start time alive
    assert not owner_gone(host_id(), str(os.getpid()), "")
