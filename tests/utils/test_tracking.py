"""Tracking backends: what each writes, read back with the backend's own reader where one exists."""

from __future__ import annotations

import importlib.util
import io
import json

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from hybridrl.utils.tracking import (
    LOGGER_BACKENDS,
    StepProgress,
    Tracking,
    format_metrics_table,
    parse_logger_backends,
)

STEP_1 = {"critic/score/mean": 0.5, "actor/pg_loss": torch.tensor(-0.25), "perf/total_num_tokens": np.int64(13)}
STEP_2 = {"critic/score/mean": np.float32(0.75), "actor/pg_loss": float("nan"), "perf/total_num_tokens": 21}


def test_file_backend_round_trip_and_append_on_resume(tmp_path):
    with Tracking("proj", "exp", "file", log_dir=tmp_path) as tracker:
        tracker.log(STEP_1, step=1)
        # written and flushed before log returns: readable while the run is still going
        assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 1
        tracker.log(STEP_2, step=2)
    # a resumed run appends to the same file
    with Tracking("proj", "exp", ["file"], log_dir=tmp_path) as tracker:
        tracker.log({"critic/score/mean": 1.0}, step=3)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows == [
        {"step": 1, "critic/score/mean": 0.5, "actor/pg_loss": -0.25, "perf/total_num_tokens": 13},
        # NaN becomes null so every line is strict JSON
        {"step": 2, "critic/score/mean": 0.75, "actor/pg_loss": None, "perf/total_num_tokens": 21},
        {"step": 3, "critic/score/mean": 1.0},
    ]


def test_a_resumed_run_keeps_one_line_per_step_and_moves_later_lines_aside(tmp_path):
    with Tracking("proj", "exp", "file", log_dir=tmp_path) as tracker:
        for step in (0, 1, 2, 3):  # a run that logged step 3, then died; its last checkpoint is step 2
            tracker.log({"a": float(step)}, step=step)
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "a": ')  # the kill cut a line short
    with Tracking("proj", "exp", "file", log_dir=tmp_path) as tracker:
        tracker.rewind(2)
        tracker.log({"val/acc": 0.5, "a": 9.0}, step=2)  # validating the checkpoint's step again
        tracker.log({"a": 30.0}, step=3)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # step 2's line gains the new key and keeps the value already written for "a"
    assert rows == [{"step": 0, "a": 0.0}, {"step": 1, "a": 1.0}, {"step": 2, "a": 2.0, "val/acc": 0.5},
                    {"step": 3, "a": 30.0}]
    # what the new run logs again is kept aside, the cut line included
    assert (tmp_path / "metrics.jsonl.rolled_back").read_text().splitlines() == ['{"step": 3, "a": 3.0}',
                                                                                 '{"step": 4, "a": ']
    with Tracking("proj", "exp", "file", log_dir=tmp_path) as tracker:
        tracker.rewind(-1)  # a run that starts afresh in the same directory
    assert (tmp_path / "metrics.jsonl").read_text() == ""
    assert len((tmp_path / "metrics.jsonl.rolled_back").read_text().splitlines()) == 2 + 4


def test_file_backend_errors(tmp_path):
    with pytest.raises(ValueError, match="default_local_dir"):
        Tracking("proj", "exp", "file", log_dir=None)
    with Tracking("proj", "exp", "file", log_dir=tmp_path) as tracker, pytest.raises(ValueError, match="'step'"):
        tracker.log({"step": 5.0}, step=5)


def test_console_prints_an_aligned_grouped_table(capsys):
    with Tracking("proj", "exp", "console") as tracker:
        tracker.log({"critic/score/mean": 0.5, "critic/score/max": 1.0, "timing_s/gen": 1.23456789,
                     "actor/lr": 1e-6, "perf/total_num_tokens": 1234}, step=7)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("---- step 7 ")
    by_group = {line.split("|")[0].strip(): line for line in lines[1:]}
    assert set(by_group) == {"actor", "critic", "perf", "timing_s"}
    # compact numbers: 4 significant digits, scientific when tiny, ints as they are
    assert "lr 1e-06" in by_group["actor"]
    assert "gen 1.235" in by_group["timing_s"]
    assert "total_num_tokens 1234" in by_group["perf"]
    assert "score/max    1" in by_group["critic"] and "score/mean 0.5" in by_group["critic"]
    # the group column has one width, so every '|' lines up
    assert len({line.index("|") for line in lines[1:]}) == 1


def test_console_table_wraps_long_groups():
    data = {f"actor/metric_{i:02d}": i / 3 for i in range(20)}
    lines = format_metrics_table(data, step=1, width=80).splitlines()
    assert len(lines) > 2  # header plus several rows for the one group
    assert all(len(line) <= 80 for line in lines)
    assert lines[1].startswith("actor | ") and lines[2].startswith("      | ")  # label on the first row only
    assert sum(line.count("metric_") for line in lines) == 20


def test_tensorboard_events_read_back(tmp_path, monkeypatch):
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    monkeypatch.delenv("TENSORBOARD_DIR", raising=False)
    with Tracking("proj", "exp", "tensorboard", log_dir=tmp_path) as tracker:
        tracker.log({"critic/score/mean": 0.5, "val-core/arith/acc/mean@4": 0.25}, step=1)
        tracker.log({"critic/score/mean": 0.75}, step=2)
    acc = event_accumulator.EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    score = [(e.step, e.value) for e in acc.Scalars("critic/score/mean")]
    assert score == [(1, 0.5), (2, 0.75)]
    assert [(e.step, e.value) for e in acc.Scalars("val-core/arith/acc/mean@4")] == [(1, 0.25)]


def test_tensorboard_dir_env_var_wins(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    monkeypatch.setenv("TENSORBOARD_DIR", str(tmp_path / "tb_env"))
    with Tracking("proj", "exp", "tensorboard", log_dir=tmp_path / "run") as tracker:
        tracker.log({"x/y": 1.0}, step=0)
    assert any(p.name.startswith("events.out.tfevents") for p in (tmp_path / "tb_env").iterdir())
    assert not (tmp_path / "run" / "tensorboard").exists()


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed")
def test_wandb_missing_names_the_extra(tmp_path):
    with pytest.raises(ImportError, match=r'pip install "hybridrl\[wandb\]"'):
        Tracking("proj", "exp", ["console", "wandb"], log_dir=tmp_path)


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb is not installed")
def test_wandb_offline_writes_a_local_run(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):  # keep the home directory clean
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    with Tracking("proj", "exp", "wandb", config={"trainer": {"total_epochs": 1}}, log_dir=tmp_path) as tracker:
        tracker.log({"critic/score/mean": 0.5}, step=1)
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))


@pytest.mark.skipif(importlib.util.find_spec("mlflow") is not None, reason="mlflow is installed")
def test_mlflow_missing_names_the_extra(tmp_path):
    with pytest.raises(ImportError, match=r'pip install "hybridrl\[mlflow\]"'):
        Tracking("proj", "exp", "mlflow", log_dir=tmp_path)


@pytest.mark.skipif(importlib.util.find_spec("mlflow") is None, reason="mlflow is not installed")
def test_mlflow_local_store_round_trip(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    config = OmegaConf.create({"algorithm": {"adv_estimator": "grpo"}, "trainer": {"total_epochs": 2}})
    tracker = Tracking("proj", "exp", "mlflow", config=config, log_dir=tmp_path)
    tracker.log({"val-core/arith/acc/mean@4": 0.25}, step=3)
    tracker.finish()
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path.resolve() / 'mlflow' / 'mlflow.db'}")
    run = client.get_run(tracker.loggers["mlflow"].run_id)
    assert run.data.params == {"algorithm.adv_estimator": "grpo", "trainer.total_epochs": "2"}
    history = client.get_metric_history(run.info.run_id, "val-core/arith/acc/mean_at_4")
    assert [(m.step, m.value) for m in history] == [(3, 0.25)]
    assert run.info.status == "FINISHED"


def test_backend_names_accept_verls_forms():
    assert parse_logger_backends("console") == ["console"]
    assert parse_logger_backends(["console", "file", "console"]) == ["console", "file"]
    assert parse_logger_backends(OmegaConf.create({"logger": ["console", "file"]}).logger) == ["console", "file"]
    assert parse_logger_backends(None) == [] and parse_logger_backends([]) == []
    with pytest.raises(ValueError, match="unknown backend.*'wandbb'.*valid: console, file, mlflow, tensorboard, wandb"):
        parse_logger_backends(["console", "wandbb"])
    assert set(LOGGER_BACKENDS.names()) == {"console", "file", "mlflow", "tensorboard", "wandb"}


def test_log_to_selected_backends_only(tmp_path, capsys):
    with Tracking("proj", "exp", ["console", "file"], log_dir=tmp_path) as tracker:
        tracker.log({"a/b": 1.0}, step=1, backend=["file"])
    assert capsys.readouterr().out == ""
    assert json.loads((tmp_path / "metrics.jsonl").read_text()) == {"step": 1, "a/b": 1.0}


def test_non_scalar_metrics_are_rejected_by_name(tmp_path):
    with Tracking("proj", "exp", "file", log_dir=tmp_path) as tracker:
        with pytest.raises(TypeError, match="'actor/entropy' is a tensor of shape \\(2,\\)"):
            tracker.log({"actor/entropy": torch.tensor([1.0, 2.0])}, step=1)
        with pytest.raises(TypeError, match="'note' has type str"):
            tracker.log({"note": "hello"}, step=1)
    assert (tmp_path / "metrics.jsonl").read_text() == ""  # nothing half-written


def test_progress_bar_shows_score_and_step_time():
    out = io.StringIO()
    bar = StepProgress(total_steps=5, initial_step=1, file=out)  # resumed after step 1
    bar.update(2, {"critic/score/mean": 0.5, "timing_s/step": 1.234})
    bar.update(3, {"critic/score/mean": 0.625})
    bar.close()
    text = out.getvalue()
    assert "3/5" in text
    assert "score=0.500" in text and "step_s=1.23" in text and "score=0.625" in text


def test_progress_bar_shows_the_chosen_metrics():
    out = io.StringIO()
    bar = StepProgress(total_steps=600, file=out, desc="SFT",
                       postfix={"loss": ("train/loss", ".4f"), "step_s": ("timing_s/step", ".2f")})
    bar.update(1, {"train/loss": 4.18762, "timing_s/step": 0.2049, "critic/score/mean": 0.5})
    bar.close()
    text = out.getvalue()
    assert "SFT:" in text and "1/600" in text
    assert "loss=4.1876" in text and "step_s=0.20" in text and "score" not in text


def test_tensorboard_hides_the_steps_a_resumed_run_logs_again(tmp_path, monkeypatch):
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    monkeypatch.delenv("TENSORBOARD_DIR", raising=False)
    with Tracking("proj", "exp", "tensorboard", log_dir=tmp_path) as tracker:  # killed after step 4
        for step in range(1, 5):
            tracker.log({"critic/score/mean": float(step)}, step=step)
    with Tracking("proj", "exp", "tensorboard", log_dir=tmp_path) as tracker:  # resumed from step 2's checkpoint
        tracker.rewind(2)
        for step in (3, 4, 5):
            tracker.log({"critic/score/mean": 10.0 * step}, step=step)
    acc = event_accumulator.EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("critic/score/mean")] == [(1, 1.0), (2, 2.0), (3, 30.0),
                                                                              (4, 40.0), (5, 50.0)]
