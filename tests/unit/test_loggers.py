"""`runtime.loggers`: a real run logs to TensorBoard, W&B (offline) and MLflow (a file store),
and each one's files, read back with its own reader, hold the values of metrics.jsonl."""

from __future__ import annotations

import io
import json
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import hpcmarl
from hpcmarl.api import TrainingError
from hpcmarl.config.loader import load_job
from hpcmarl.errors import ConfigError
from hpcmarl.metrics import MetricsSink
from hpcmarl.testing import faults

from .conftest import TINY

wandb_pb2 = pytest.importorskip("wandb.proto.wandb_internal_pb2")
mlflow_tracking = pytest.importorskip("mlflow.tracking")

ALL = ["runtime.loggers=[tensorboard,wandb,mlflow]"]
SETTINGS = (
    "WANDB_MODE",
    "WANDB_DIR",
    "WANDB_PROJECT",
    "MLFLOW_TRACKING_URI",
    "MLFLOW_EXPERIMENT_NAME",
)
"""The user's environment that would send the loggers elsewhere than their defaults."""
BLOCK = 32768
"""W&B's transaction log (LevelDB's log format): records never straddle blocks this long."""


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[hpcmarl.Run]:
    """A tiny CartPole DQN run in this process with every logger, progress every 0.1 s for
    4 s of training (a 600-step budget ended inside the first 0.1 s on an idle machine:
    one progress step only)."""
    with pytest.MonkeyPatch.context() as env:
        for name in SETTINGS:
            env.delenv(name, raising=False)
        overrides = [*ALL, "learner.batch_size=16", "commander.progress_interval_s=0.1"]
        overrides += ["collector.fragments_per_task=1", "commander.max_wall_time_s=4"]
        overrides += ["commander.max_env_steps=1000000"]
        yield hpcmarl.train(TINY, overrides, run_dir=tmp_path_factory.mktemp("logged"))


def jsonl_points(run: hpcmarl.Run, kind: str, field: str) -> list[tuple[int, float]]:
    return [(r["env_steps"], float(r[field])) for r in run.metrics(kind)]


def wandb_records(run_dir: Path) -> list[Any]:
    """Every record of the run's offline `.wandb` file, as W&B's own protobuf messages."""
    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    data, pos, pending, records = path.read_bytes(), 7, b"", []  # 7: the file's header
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a record header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _, length, part = struct.unpack_from("<IHB", data, pos)
        pending, pos = pending + data[pos + 7 : pos + 7 + length], pos + 7 + length
        if part in (1, 4):  # a full record, or the last part of one
            records.append(wandb_pb2.Record.FromString(pending))
            pending = b""
    return records


def key_of(item: Any) -> str:
    """A history item's key, which W&B may store split at its slashes."""
    return str(item.key or "/".join(item.nested_key))


def wandb_history(records: list[Any], tag: str) -> dict[int, float]:
    """step -> value of `tag` (W&B keeps one row per step: the last value logged at it)."""
    out = {}
    for record in records:
        if record.WhichOneof("record_type") == "history":
            items = {key_of(item): json.loads(item.value_json) for item in record.history.item}
            if tag in items:
                out[record.history.step.num] = float(items[tag])
    return out


def test_each_logger_holds_the_values_of_metrics_jsonl(logged_run: hpcmarl.Run) -> None:
    run_dir = Path(logged_run.run_dir)
    expected = jsonl_points(logged_run, "progress", "episodes")
    assert len({step for step, _ in expected}) >= 2  # the run logged at several steps

    tb = EventAccumulator(str(run_dir / "tb"))
    tb.Reload()
    assert [(e.step, e.value) for e in tb.Scalars("progress/episodes")] == expected

    records = wandb_records(run_dir)
    assert wandb_history(records, "progress/episodes") == dict(expected)
    (header,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert header.display_name == run_dir.name and header.project == "cartpole-dqn"
    exits = [r.exit for r in records if r.WhichOneof("record_type") == "exit"]
    assert [e.exit_code for e in exits] == [0]  # finished by the run, not by atexit

    client = mlflow_tracking.MlflowClient(tracking_uri=(run_dir / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("cartpole-dqn")  # the job's name
    (mlrun,) = client.search_runs([experiment.experiment_id])
    assert (mlrun.info.run_name, mlrun.info.status) == (run_dir.name, "FINISHED")
    history = client.get_metric_history(mlrun.info.run_id, "progress/episodes")
    assert sorted((m.step, m.value) for m in history) == sorted(expected)
    assert json.loads(mlrun.data.params["runtime.loggers"]) == ["tensorboard", "wandb", "mlflow"]
    assert mlrun.data.params["learner.batch_size"] == "16"


def test_a_logger_that_fails_mid_run_is_dropped_with_one_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sink = MetricsSink(str(tmp_path), io.StringIO(), loggers=["tensorboard", "mlflow"], job={})
    row = {"time_s": 1.0, "env_steps": 100, "env_steps_per_s": 50.0, "updates": 0}
    row |= {"updates_per_s": 0.0, "episodes": 1, "replay_fill": 0.5}
    sink.progress(row)
    shutil.rmtree(tmp_path / "mlruns")  # the store is gone: MLflow's next write fails
    for steps in (200, 300):
        sink.progress({**row, "env_steps": steps})
    sink.close()
    warnings = capsys.readouterr().err.splitlines()
    assert len(warnings) == 1
    assert warnings[0].startswith("hpcmarl: warning: the mlflow logger failed (")
    assert warnings[0].endswith("it is dropped and the run goes on (metrics.jsonl keeps every row)")
    tb = EventAccumulator(str(tmp_path / "tb"))
    tb.Reload()
    assert [e.step for e in tb.Scalars("progress/replay_fill")] == [100, 200, 300]
    rows = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["env_steps"] for r in rows] == [100, 200, 300]


def test_a_failed_run_ends_its_mlflow_run_as_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(faults, "_spec", ("collector", 3, "raise"))  # HPCMARL_FAULT, parsed
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    with pytest.raises(TrainingError):
        hpcmarl.train(TINY, ["runtime.loggers=[mlflow]"], run_dir=tmp_path)
    client = mlflow_tracking.MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("cartpole-dqn")
    (mlrun,) = client.search_runs([experiment.experiment_id])
    assert mlrun.info.status == "FAILED"


def test_an_unknown_logger_is_one_line() -> None:
    with pytest.raises(ConfigError) as caught:
        load_job(None, ["runtime.loggers=[tensorboard,neptune]"])
    assert "\n" not in caught.value.message()
    assert caught.value.message().startswith(
        "override runtime.loggers=[tensorboard,neptune]: runtime.loggers = [tensorboard, "
        "neptune] names an unknown logger or one twice: each must be one of tensorboard, "
        "wandb, mlflow"
    )
    with pytest.raises(ConfigError, match="names an unknown logger or one twice"):
        load_job(None, ["runtime.loggers=[wandb,wandb]"])
    assert load_job(None, []).runtime.loggers == ["tensorboard"]  # as every run before
