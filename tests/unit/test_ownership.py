"""The sweep rules every backend applies (agentrl/sandbox/ownership.py): owner liveness, tested once against real
processes of this host; the TTL, the run / all-runs / orphans selection and the caller's run id. Each backend's
wiring (labels, annotations, state files) is tested with the backend."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import pytest

from agentrl.sandbox.ownership import (
    OwnerRecord,
    alive,
    caller_run_id,
    host_id,
    owner_gone,
    process_start,
    sweep_selects,
    ttl_passed,
)


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


@pytest.mark.parametrize("created, ttl, passed", [
    (100.0, 50, False), (100.0, 10, True), ("100.0", "10", True), ("100", "50", False),  # labels hold strings
    (None, 10, False), (100.0, None, False), ("yesterday", "10", False), ({}, 1, False),  # unreadable: no TTL
])
def test_ttl_passed_reads_numbers_or_strings_and_never_crashes(created: object, ttl: object, passed: bool) -> None:
    assert ttl_passed(created, ttl, now=120.0) is passed


def test_a_sweep_selects_all_runs_or_exactly_one_run_or_else_the_orphans() -> None:
    asked: list[bool] = []

    def orphaned(answer: bool) -> Callable[[], bool]:  # a probe of whether the sweep asked
        def ask() -> bool:
            asked.append(answer)
            return answer
        return ask

    assert sweep_selects(run="r1", run_id=None, all_runs=True, orphaned=orphaned(False))
    assert sweep_selects(run="r1", run_id="r1", all_runs=False, orphaned=orphaned(False))
    assert not sweep_selects(run="r1", run_id="r2", all_runs=False, orphaned=orphaned(True))  # an orphan of another run
    assert not sweep_selects(run=None, run_id="r2", all_runs=False, orphaned=orphaned(True))
    assert asked == [], "with all_runs or a run id, whether a sandbox is orphaned is never asked"
    assert sweep_selects(run="r1", run_id=None, all_runs=False, orphaned=orphaned(True))
    assert not sweep_selects(run="r1", run_id=None, all_runs=False, orphaned=orphaned(False))


def test_the_run_id_is_the_first_non_empty_of_the_backends_keys() -> None:
    keys = ("agentrl/run-id", "agentrl.run_id", "run_id")
    assert caller_run_id({"run_id": "c", "agentrl.run_id": "b"}, keys) == "b"
    assert caller_run_id({"agentrl/run-id": "", "run_id": "c"}, keys) == "c"
    assert caller_run_id({"agentrl/run-id": 7}, keys) == "7"
    assert caller_run_id({"other": "x"}, keys) == ""
