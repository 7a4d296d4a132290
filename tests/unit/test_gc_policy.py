"""The collector policy: what `tune()` changes, what `GcMonitor` reports, and that the CLI roots apply it."""

from __future__ import annotations

import gc

import pytest

from agentrl.cli.gc_policy import GcMonitor, process_monitor, tune


@pytest.fixture
def restore_gc():
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


def test_tune_freezes_what_is_alive_and_raises_only_gen0(restore_gc: None) -> None:
    before = gc.get_threshold()
    keep = [[i] for i in range(1000)]  # alive at tune time: frozen, never scanned by a collection again
    done = tune(12_345)
    assert gc.get_threshold() == (12_345, before[1], before[2])
    # frozen objects can still be freed by reference counting (another thread's garbage), which lowers the count
    # (a suite run saw 830,003 frozen and 830,001 a moment later)
    assert 1000 <= gc.get_freeze_count() <= done["frozen_objects"]
    assert not any(obj is keep[0] for obj in gc.get_objects())  # the frozen generation is not in any scanned one
    with pytest.raises(ValueError, match="gen0"):
        tune(0)


def test_cycles_made_after_tune_are_still_collected(restore_gc: None) -> None:
    import weakref

    tune(10)

    class Node:
        pass

    gc.disable()  # no automatic collection may promote the cycle to an older generation before it is garbage
    try:
        a, b = Node(), Node()
        a.other, b.other = b, a
        ref = weakref.ref(a)
        del a, b
        assert ref() is not None  # a cycle: reference counting alone does not free it
        gc.collect(0)  # a young collection frees it: objects made after the freeze are in the young generation
    finally:
        gc.enable()
    assert ref() is None


def test_monitor_counts_collections_and_pauses() -> None:
    with GcMonitor() as mon:
        gc.collect()
        gc.collect(0)
    after = mon.collections[:]
    gc.collect()  # uninstalled: not counted
    assert after[2] >= 1 and after[0] >= 1 and mon.collections == after
    s = mon.summary()
    assert s["gc_collections"] == after and s["gc_s"] >= 0 and s["gc_full_max_pause_ms"] >= 0


def test_cli_roots_apply_the_policy_unless_turned_off(restore_gc: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from agentrl.cli import wiring
    from agentrl.config import RolloutConfig
    from agentrl.trainer.config import TrainConfig

    assert RolloutConfig(env="code_tests").gc_tune is True
    assert TrainConfig.model_fields["gc_tune"].default is True
    calls: list[int] = []
    monkeypatch.setattr("agentrl.cli.gc_policy.tune", lambda: calls.append(1) or {})
    assert wiring.tune_gc(False) is process_monitor()  # measured even when the policy is off
    assert calls == []
    assert wiring.tune_gc(True) is process_monitor()
    assert calls == [1]
    assert process_monitor()._callback in gc.callbacks


def test_take_reports_each_window_once() -> None:
    with GcMonitor() as mon:
        gc.collect()
        first = mon.take()
        empty = mon.take()  # nothing collected since: a new window starts at zero
        gc.collect()
        gc.collect()
        second = mon.take()
    assert first["time_gc_s"] > 0 and first["time_gc_max_pause_s"] > 0
    assert empty == {"time_gc_s": 0.0, "time_gc_max_pause_s": 0.0}
    assert second["time_gc_s"] >= second["time_gc_max_pause_s"] > 0
    assert mon.collections[2] == 3  # the totals are kept across windows


def test_step_metrics_carry_the_collectors_share_as_timing() -> None:
    from agentrl.trainer.metrics import METRIC_KEYS, is_timing, step_metrics

    row = step_metrics(0, [], {"loss": 0.1}, rollout_s=1.0, train_s=2.0, sync_s=0.0,
                       gc={"time_gc_s": 0.25, "time_gc_max_pause_s": 0.05})
    assert (row["time_gc_s"], row["time_gc_max_pause_s"]) == (0.25, 0.05)
    assert {"time_gc_s", "time_gc_max_pause_s"} <= set(METRIC_KEYS)
    assert is_timing("time_gc_s") and is_timing("time_gc_max_pause_s")  # not compared between identical runs
    bare = step_metrics(0, [], {"loss": 0.1}, rollout_s=1.0, train_s=2.0, sync_s=0.0)
    assert bare["time_gc_s"] is None and bare["time_gc_max_pause_s"] is None
    lagged = step_metrics(0, [], {"loss": 0.1}, rollout_s=1.0, train_s=2.0, sync_s=0.0,
                          lag={"time_loop_lag_p99_s": 0.01, "time_loop_lag_max_s": 0.2})
    assert (lagged["time_loop_lag_p99_s"], lagged["time_loop_lag_max_s"]) == (0.01, 0.2)
    assert is_timing("time_loop_lag_p99_s") and {"time_loop_lag_p99_s", "time_loop_lag_max_s"} <= set(METRIC_KEYS)
