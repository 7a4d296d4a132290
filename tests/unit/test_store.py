"""The store: group-atomic appends, tail repair after a torn write, tolerant reading, refusing to clobber."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.errors import StoreError
from agentrl.store import LineError, TrajectoryStore, iter_records, read_trajectories
from agentrl.types import SCHEMA_VERSION, Status, Trajectory


def _traj(group: str, k: int, size: int = 2, task: str = "t") -> Trajectory:
    return Trajectory(id=f"{group}-{k}", group_id=group, task_id=task, env="e", status=Status.ok, sample_index=k,
                      prompt_ids=[1, 2], completion_ids=[3, 4], logprobs=[-0.1, 0.0], env_mask=[1, 0],
                      reward=0.5, meta={"group_size": size})


def test_roundtrip_groups(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with TrajectoryStore(path) as store:
        store.append_group([_traj("g1", 0), _traj("g1", 1)])
        store.append_group([_traj("g2", 0), _traj("g2", 1)])
    got = read_trajectories(path)
    assert [t.id for t in got] == ["g1-0", "g1-1", "g2-0", "g2-1"]
    assert got[0] == _traj("g1", 0)


def test_refuses_to_clobber_without_resume(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with TrajectoryStore(path) as store:
        store.append_group([_traj("g1", 0), _traj("g1", 1)])
    with pytest.raises(StoreError, match="--resume"):
        TrajectoryStore(path)
    assert len(read_trajectories(path)) == 2  # nothing lost


@pytest.mark.parametrize("cut", [1, 10, 200])
def test_resume_repairs_torn_group(tmp_path: Path, cut: int) -> None:
    path = tmp_path / "t.jsonl"
    with TrajectoryStore(path) as store:
        store.append_group([_traj("g1", 0), _traj("g1", 1)])
    good = path.read_bytes()
    torn = b"".join(_traj("g2", k).model_dump_json().encode() + b"\n" for k in range(2))
    path.write_bytes(good + torn[: len(torn) - cut])  # a crash mid-write of group g2
    with TrajectoryStore(path, resume=True) as store:
        assert store.repaired_bytes == len(torn) - cut
        assert [t.group_id for t in store.completed()] == ["g1", "g1"]
        store.append_group([_traj("g3", 0), _traj("g3", 1)])
    assert [t.id for t in read_trajectories(path)] == ["g1-0", "g1-1", "g3-0", "g3-1"]


def test_reader_reports_bad_lines_and_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    future = json.loads(_traj("g9", 0).model_dump_json())
    future["schema_version"] = SCHEMA_VERSION + 1
    bad_field = json.loads(_traj("g8", 0).model_dump_json())
    bad_field["env_mask"] = [1]
    lines = [_traj("g1", 0).model_dump_json(), "{not json", json.dumps(future), json.dumps(bad_field),
             "[1, 2]", _traj("g1", 1).model_dump_json(), '{"schema_version": 1, "id": "x"'][:7]
    path.write_text("\n".join(lines) + "\n")
    recs = list(iter_records(path))
    errors = [r for r in recs if isinstance(r, LineError)]
    assert [t.id for t in recs if isinstance(t, Trajectory)] == ["g1-0", "g1-1"]
    assert [e.line for e in errors] == [2, 3, 4, 5, 7]
    assert "newer than this agentrl reads" in errors[1].message
    assert "env_mask" in str(errors[2]) or "equal length" in str(errors[2])
    assert str(errors[0]).startswith(f"{path}:2:")


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="does not exist"):
        read_trajectories(tmp_path / "nope.jsonl")
