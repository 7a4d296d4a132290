"""`agentrl diff`: pairing by task/sample (not file order), first divergence, metrics without timings, exit codes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from agentrl.cli import main
from agentrl.types import Status, Timing, Trajectory, Turn


def _traj(task: str, k: int, *, step: int | None = None, seed: int = 0) -> Trajectory:
    ids = [100 + k, 101, 102, 7, 8, 200 + seed, 201, 202]  # turn 0: 3 model tokens + 2 tool tokens; turn 1: 3 model
    return Trajectory(
        id=f"{task}-{k}", group_id=f"g-{task}", task_id=task, env="code_tests", status=Status.ok, sample_index=k,
        step=step, prompt_ids=[1, 2, 3], completion_ids=ids, logprobs=[-0.5, -1.25, -0.1, 0.0, 0.0, -2.0, -0.3, -0.01],
        env_mask=[1, 1, 1, 0, 0, 1, 1, 1], reward=0.5,
        turns=[Turn(index=0, start=0, model_len=3, env_len=2), Turn(index=1, start=5, model_len=3)],
        timing=Timing(total_s=1.0 + k), meta={"model": "/nonexistent"})


def _write(path: Path, trajs: list[Trajectory]) -> Path:
    path.write_text("".join(t.model_dump_json() + "\n" for t in trajs))
    return path


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["diff", *args, "--no-decode"])
    return code, capsys.readouterr().out


def test_same_trajectories_in_another_order_and_timing_are_identical(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    trajs = [_traj(t, k) for t in ("a", "b") for k in range(2)]
    slower = [t.model_copy(update={"timing": Timing(total_s=99.0)}) for t in reversed(trajs)]
    code, out = _run(capsys, str(_write(tmp_path / "x.jsonl", trajs)), str(_write(tmp_path / "y.jsonl", slower)))
    assert code == 0 and "4 paired, 0 differ" in out and out.strip().endswith("identical")


def test_reports_first_divergence_with_turn_token_and_logprobs(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    a = [_traj("a", 0), _traj("a", 1)]
    changed = _traj("a", 1)
    changed.logprobs[6] = math.nextafter(changed.logprobs[6], 0.0)  # one ulp, in turn 1
    b = [_traj("a", 0), changed.model_copy(update={"status": Status.max_turns, "reward": 0.25})]
    code, out = _run(capsys, str(_write(tmp_path / "x.jsonl", a)), str(_write(tmp_path / "y.jsonl", b)))
    assert code == 1
    assert "task a sample 1:" in out and "task a sample 0:" not in out
    assert "turn 1, completion token 6 (model): A 201 logprob -0.3 vs B 201 logprob -0.29999999999999993" in out
    assert "status: 'ok' vs 'max_turns'" in out and "reward: 0.5 vs 0.25" in out


def test_token_divergence_and_missing_samples(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = [_traj("a", 0), _traj("a", 1)]
    b = [_traj("a", 0, seed=1), _traj("b", 0)]
    code, out = _run(capsys, str(_write(tmp_path / "x.jsonl", a)), str(_write(tmp_path / "y.jsonl", b)))
    assert code == 1
    assert "turn 1, completion token 5 (model): A 200 logprob -2.0 vs B 201 logprob -2.0" in out
    assert "only in A: task a sample 1" in out and "only in B: task b sample 0" in out


def _run_dir(root: Path, name: str, rows: list[dict]) -> Path:
    d = root / name
    d.mkdir()
    _write(d / "trajectories.jsonl", [_traj("a", k, step=s) for s in range(2) for k in range(2)])
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def test_run_dirs_compare_metrics_except_timings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [{"step": s, "loss": 0.1 * s, "reward_mean": 0.5, "time_train_s": 1.0} for s in range(2)]
    timed = [{**r, "time_train_s": 7.5} for r in rows]
    lossy = [rows[0], {**rows[1], "loss": 0.2}]
    a, b, c = _run_dir(tmp_path, "a", rows), _run_dir(tmp_path, "b", timed), _run_dir(tmp_path, "c", lossy)
    code, out = _run(capsys, str(a), str(b))
    assert code == 0 and "metrics: 2 steps compared (timings ignored), 0 differ" in out
    code, out = _run(capsys, str(a), str(c))
    assert code == 1 and "step 1: loss 0.1 vs 0.2" in out and "trajectories: 4 in A, 4 in B, 4 paired, 0 differ" in out


def test_missing_input_is_an_error_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["diff", str(tmp_path / "nope.jsonl"), str(tmp_path / "nope2.jsonl")])
    assert code == 2 and "nope.jsonl" in capsys.readouterr().err


def _nudged(trajs: list[Trajectory], delta: float) -> list[Trajectory]:
    """The same trajectories with every model token's logprob moved by `delta` (a real server's seeded rerun)."""
    return [t.model_copy(update={"logprobs": [lp + delta if m else lp for lp, m in zip(t.logprobs, t.env_mask)]})
            for t in trajs]


def test_logprob_tolerance_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Logprobs 4e-5 apart: different bit for bit, the same within --logprob-tol 1e-4; the largest gap is printed."""
    trajs = [_traj(t, k) for t in ("a", "b") for k in range(2)]
    a, b = _write(tmp_path / "a.jsonl", trajs), _write(tmp_path / "b.jsonl", _nudged(trajs, 4e-5))
    code, out = _run(capsys, str(a), str(b))
    assert code == 1 and out.strip().endswith("runs differ")
    assert "fields that differ: logprobs in 4" in out
    assert "logprobs: max |A - B| 4e-05 over 32 tokens sampled alike; compared bit for bit" in out
    code, out = _run(capsys, str(a), str(b), "--logprob-tol", "1e-4")
    assert code == 0 and "4 paired, 0 differ" in out and out.strip().endswith("identical (logprobs within 0.0001)")
    assert "logprobs: max |A - B| 4e-05 over 32 tokens sampled alike; tolerance 0.0001" in out
    code, out = _run(capsys, str(a), str(_write(tmp_path / "c.jsonl", _nudged(trajs, 3e-4))), "--logprob-tol", "1e-4")
    assert code == 1 and "logprobs: max |A - B| 0.0003" in out


def test_token_ids_status_and_reward_differ_whatever_the_tolerance(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    a = [_traj("a", 0), _traj("a", 1), _traj("a", 2)]
    b = _nudged([_traj("a", 0, seed=1), _traj("a", 1), _traj("a", 2)], 4e-5)
    b[1] = b[1].model_copy(update={"status": Status.max_turns})
    b[2] = b[2].model_copy(update={"reward": 0.25})
    code, out = _run(capsys, str(_write(tmp_path / "x.jsonl", a)), str(_write(tmp_path / "y.jsonl", b)),
                     "--logprob-tol", "1")
    assert code == 1 and "3 paired, 3 differ" in out
    assert "A 200 logprob -2.0 vs B 201 logprob -1.99996" in out
    assert "fields that differ: completion_ids in 1, status in 1, reward in 1" in out
    assert "over 21 tokens sampled alike" in out  # sample 0 compared up to its first differing token (5 + 8 + 8)


def test_logprob_tolerance_applies_to_logprob_metrics_only(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    rows = [{"step": 0, "loss": 0.1, "mismatch_logprob_abs_mean": 2e-5, "is_ratio_mean": 1.0}]
    near = [{**rows[0], "mismatch_logprob_abs_mean": 5e-5, "is_ratio_mean": 1.00004}]
    lossy = [{**near[0], "loss": 0.10001}]
    a, b, c = _run_dir(tmp_path, "a", rows), _run_dir(tmp_path, "b", near), _run_dir(tmp_path, "c", lossy)
    code, out = _run(capsys, str(a), str(b))
    assert code == 1 and "mismatch_logprob_abs_mean 2e-05 vs 5e-05" in out
    code, out = _run(capsys, str(a), str(b), "--logprob-tol", "1e-4")
    assert code == 0 and "0 differ" in out
    code, out = _run(capsys, str(a), str(c), "--logprob-tol", "1e-4")
    assert code == 1 and "loss 0.1 vs 0.10001" in out


@pytest.mark.parametrize("bad", ["-1e-4", "nan", "inf", "x"])
def test_bad_tolerance_is_an_error_naming_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   bad: str) -> None:
    f = _write(tmp_path / "x.jsonl", [_traj("a", 0)])
    with pytest.raises(SystemExit) as e:
        main(["diff", str(f), str(f), f"--logprob-tol={bad}"])
    assert e.value.code == 2 and f"--logprob-tol {bad!r}: give a finite number of nats >= 0" in capsys.readouterr().err
