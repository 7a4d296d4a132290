"""Experiment trackers (issue 35): one real `agentrl train` run logging to TensorBoard, W&B (offline), trackio and
MLflow at once, a crash-like resume, and `agentrl eval` on the run; each tracker's own store is read back.

The module fixture runs, as real CLI processes (tests/integration/trainer_cli.py, the print_number toy env):
1. `train --report-to tensorboard,wandb --report-to trackio --report-to mlflow`, 2 steps, evaluation every 2 steps
   (and after the last step);
2. the checkpoint of step 2 made incomplete (as a crash while saving it leaves it), then `train --resume --steps 3`:
   it continues at step 1, so step 1 (already in every tracker) is redone, and step 2 is new;
3. `eval --checkpoint <run>`: its results go into the same tracker runs at step 3.
Then every tracker must hold every numeric metric of metrics.jsonl at its step, no step twice, the same run id
before and after the resume, histograms of reward / turns / completion length and a trajectory table per step.
"""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from trainer_toys import cached_taught_model

from agentrl.trainer.config import TrainConfig
from agentrl.trainer.metrics import read_metrics
from agentrl.trainer.trackers.record import scalars

HERE = Path(__file__).parent
TRACKER_ENV = ("WANDB_MODE", "WANDB_DIR", "MLFLOW_TRACKING_URI", "TRACKIO_DIR")


@pytest.fixture(scope="module")
def tracked(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    pytest.importorskip("tensorboard", reason="needs the [trackers] extra")
    model = cached_taught_model(smollm2_path)
    tmp = tmp_path_factory.mktemp("trackers")
    out = tmp / "run"
    cfg = TrainConfig.model_validate({
        "model": str(model), "env": "print_number", "env_options": {"tasks": 8}, "group_size": 4, "batch_size": 2,
        "steps": 2, "learning_rate": 2e-3, "sampling": {"temperature": 1.0, "max_new_tokens": 24},
        "budgets": {"max_turns": 2, "max_completion_tokens": 80, "tool_timeout_s": 120},
        "sandbox": {"warm": 2, "max_sandboxes": 8}, "max_trajectories": 8, "output_dir": str(out), "seed": 0,
        "pipeline": {"max_staleness": 0}, "eval_every": 2, "eval": {"tasks": 2, "samples": 1, "greedy": False},
        "tracking": {"project": "agentrl-test", "table_rows": 3}})
    config = tmp / "job.yaml"
    config.write_text(json.dumps(json.loads(cfg.model_dump_json())))  # JSON is YAML
    env = {k: v for k, v in os.environ.items() if k not in TRACKER_ENV}  # the defaults: offline, under the run

    def cli(*args: str) -> str:
        r = subprocess.run([sys.executable, str(HERE / "trainer_cli.py"), *args], capture_output=True, text=True,
                           timeout=900, check=False, env=env, cwd=tmp)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        return r.stdout

    first = cli("train", "--config", str(config), "--report-to", "tensorboard,wandb", "--report-to", "trackio",
                "--report-to", "mlflow")
    before = {"rows": read_metrics(out / "metrics.jsonl"), "state": json.loads((out / "trackers.json").read_text())}
    (out / "checkpoints" / "checkpoint-2" / "trainer_state.json").unlink()  # checkpoint 2 was cut by a "crash"
    resumed = cli("train", "--config", str(config), "--resume", "--steps", "3", "--report-to",
                  "tensorboard,wandb,trackio,mlflow")
    evaluated = cli("eval", "--checkpoint", str(out), "--tasks", "2", "--samples", "1", "--no-greedy")
    return {"out": out, "before": before, "rows": read_metrics(out / "metrics.jsonl"),
            "state": json.loads((out / "trackers.json").read_text()), "stdout": (first, resumed, evaluated)}


def expected(tracked: dict[str, Any], *, rewinds: bool) -> dict[int, dict[str, float]]:
    """step -> every numeric metric of that step. After the resume, step 1 was redone: TensorBoard holds the redone
    row (metrics.jsonl now), the others the row they logged first."""
    rows = {r["step"]: r for r in tracked["rows"]}
    if not rewinds:
        rows[1] = tracked["before"]["rows"][1]
    return {step: scalars(row) for step, row in rows.items()}


def assert_series(series: dict[str, list[tuple[int, float]]], want: dict[int, dict[str, float]], rel: float) -> None:
    """Every expected (key, step) is there once, with the metrics.jsonl value."""
    assert want and all(want.values())
    for step, values in want.items():
        for key, value in values.items():
            got = [v for s, v in series.get(key, []) if s == step]
            assert len(got) == 1, (key, step, series.get(key))
            assert math.isclose(got[0], value, rel_tol=rel, abs_tol=rel), (key, step, got[0], value)
    for key, points in series.items():
        assert not [s for s, n in Counter(s for s, _ in points).items() if n > 1], f"{key}: a step logged twice"


def test_run_records_where_each_tracker_wrote_and_keeps_ids_across_resume(tracked: dict[str, Any]) -> None:
    out, before, state = tracked["out"], tracked["before"]["state"], tracked["state"]
    assert [r["step"] for r in tracked["rows"]] == [0, 1, 2]
    assert set(state) == {"tensorboard", "wandb", "trackio", "mlflow"}
    assert state["wandb"]["id"] == before["wandb"]["id"] and state["wandb"]["mode"] == "offline"
    assert state["mlflow"]["run_id"] == before["mlflow"]["run_id"]
    assert state["trackio"]["run"] == before["trackio"]["run"]
    assert state["mlflow"]["tracking_uri"] == f"sqlite:///{(out / 'mlflow' / 'mlflow.db').resolve()}"
    assert Path(state["trackio"]["dir"]) == (out / "trackio").resolve()
    assert all(Path(d).parent == out / "wandb" for d in state["wandb"]["dirs"]) and len(state["wandb"]["dirs"]) == 3
    assert all(info["last_step"] == 2 for info in state.values())
    assert "trackers (trackers.json): tensorboard: tensorboard --logdir" in tracked["stdout"][0]
    assert "eval: logged at step 3 to tensorboard, wandb, trackio, mlflow" in tracked["stdout"][2]
    row = tracked["rows"][0]  # what the per-step record carries for the trackers
    assert {"pass_at_g", "tokens_per_s", "infra_error_frac", "time_loop_lag_max_s",
            "integrity_test_tamper_alarm", "integrity_test_tamper_frac"} <= set(row)


def test_tensorboard_scalars_histograms_and_table_match_metrics(tracked: dict[str, Any]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tracked["out"] / "tensorboard"), size_guidance={"scalars": 0, "histograms": 0,
                                                                              "tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    series = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in tags["scalars"]}
    assert_series({k: v for k, v in series.items() if k.startswith("train/")}, expected(tracked, rewinds=True),
                  rel=1e-6)  # TensorBoard stores float32
    for hist in ("train/reward", "train/turns", "train/completion_len"):
        assert [e.step for e in acc.Histograms(hist)] == [0, 1, 2]
    assert sum(e.histogram_value.num for e in acc.Histograms("train/turns")) == 24  # 3 steps x 8 trajectories
    from tensorboard.backend.event_processing import plugin_event_accumulator

    ui = plugin_event_accumulator.EventAccumulator(str(tracked["out"] / "tensorboard"), size_guidance={"tensors": 0})
    ui.Reload()  # what TensorBoard's UI reads: the text plugin's view purges the redone step's first table
    table = ui.Tensors("train/trajectory_table/text_summary")
    assert [e.step for e in table] == [0, 1, 2]
    assert "| step | task_id |" in table[0].tensor_proto.string_val[0].decode()
    assert [s for s, _ in series["eval/sampled/mean"]] == [0, 2, 3]
    assert [s for s, _ in series["eval_cli/sampled/mean"]] == [3] and "eval_cli/sampled/ci_high" in series


def _wandb_records(path: Path) -> Any:
    """The records of a W&B transaction log (`run-<id>.wandb`: a LevelDB-style log of wandb's own protobuf
    Records, 32 KiB blocks, 7-byte headers), parsed with wandb's protobuf classes."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert struct.unpack("<4sHB", data[:7])[:2] == (b":W&B", 0xBEE1)
    pos, buf = 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # block trailer
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:
            break
        buf += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # full / last fragment
            record = pb.Record()
            record.ParseFromString(buf)
            buf = b""
            yield record


def test_wandb_offline_run_holds_metrics_histograms_and_tables(tracked: dict[str, Any]) -> None:
    state = tracked["state"]["wandb"]
    series: dict[str, list[tuple[int, float]]] = {}
    types: dict[str, set[int]] = {}
    run_ids = set()
    for d in state["dirs"]:
        for record in _wandb_records(Path(d) / f"run-{state['id']}.wandb"):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run_ids.add(record.run.run_id)
            if kind != "history":
                continue
            step = record.history.step.num
            for item in record.history.item:
                key, value = item.key or "/".join(item.nested_key), json.loads(item.value_json)
                if key.endswith("/_type"):
                    types.setdefault(f"{key[:-6]}:{value}", set()).add(step)
                elif isinstance(value, (int, float)) and not key.startswith("_"):
                    series.setdefault(key, []).append((step, float(value)))
    assert run_ids == {state["id"]}
    media = [f"{key.split(':')[0]}/" for key in types]  # a histogram's or table's own fields are not metrics
    assert_series({k: v for k, v in series.items() if k.startswith("train/") and not k.startswith(tuple(media))},
                  expected(tracked, rewinds=False), rel=1e-9)
    for hist in ("train/reward", "train/turns", "train/completion_len"):
        assert types[f"{hist}:histogram"] == {0, 1, 2}
    assert types["train/trajectory_table:table-file"] == {0, 1, 2}
    assert sorted(s for s, _ in series["eval/sampled/mean"]) == [0, 2, 3]
    assert [s for s, _ in series["eval_cli/sampled/mean"]] == [3]


def test_mlflow_run_holds_metrics_histograms_and_tables(tracked: dict[str, Any]) -> None:
    from mlflow.tracking import MlflowClient

    state = tracked["state"]["mlflow"]
    client = MlflowClient(tracking_uri=state["tracking_uri"])
    run = client.get_run(state["run_id"])
    want = expected(tracked, rewinds=False)
    keys = {k for values in want.values() for k in values} | {"eval/sampled/mean", "eval_cli/sampled/mean"}
    series = {k: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, k)] for k in keys}
    assert_series({k: v for k, v in series.items() if k.startswith("train/")}, want, rel=1e-9)
    assert sorted(s for s, _ in series["eval/sampled/mean"]) == [0, 2, 3]
    assert [s for s, _ in series["eval_cli/sampled/mean"]] == [3]
    artifacts = {a.path for d in ("histograms", "trajectories") for a in client.list_artifacts(run.info.run_id, d)}
    assert {f"{d}/step-{s:06d}.json" for d in ("histograms", "trajectories") for s in (0, 1, 2)} <= artifacts
    table = json.loads(Path(client.download_artifacts(run.info.run_id, "trajectories/step-000002.json")).read_text())
    assert table["columns"][:3] == ["step", "task_id", "sample"] and len(table["data"]) == 3


def test_trackio_store_holds_metrics_histograms_and_tables(tracked: dict[str, Any]) -> None:
    state = tracked["state"]["trackio"]
    code = ("import json, sys; from trackio.sqlite_storage import SQLiteStorage; "
            "print(json.dumps(SQLiteStorage.get_logs(sys.argv[1], sys.argv[2]), default=str))")
    env = {**os.environ, "TRACKIO_DIR": state["dir"]}  # trackio reads its directory when it is imported
    r = subprocess.run([sys.executable, "-c", code, state["project"], state["run"]], capture_output=True, text=True,
                       env=env, timeout=120, check=True)
    logs = json.loads(r.stdout)
    series: dict[str, list[tuple[int, float]]] = {}
    kinds: dict[str, set[int]] = {}
    for entry in logs:
        for key, value in entry.items():
            if isinstance(value, (int, float)) and key not in ("step", "timestamp"):
                series.setdefault(key, []).append((entry["step"], float(value)))
            elif isinstance(value, dict) and "_type" in value:
                kinds.setdefault(f"{key}:{value['_type']}", set()).add(entry["step"])
    assert_series({k: v for k, v in series.items() if k.startswith("train/")}, expected(tracked, rewinds=False),
                  rel=1e-9)
    assert {"train/reward", "train/turns", "train/completion_len"} <= {k.split(":")[0] for k in kinds}
    assert all(steps == {0, 1, 2} for k, steps in kinds.items() if k.startswith("train/"))
    assert any(k.startswith("train/trajectory_table:") for k in kinds)
    assert [s for s, _ in series["eval_cli/sampled/mean"]] == [3]

