"""Relative local paths of a run's config become absolute on the driver (`hybridrl.trainer.command_line`): ranks on
other hosts start in their Ray node's working directory (tests/multinode runs such a driver)."""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trainer"))
from ppo_helpers import ppo_config  # noqa: E402

from hybridrl.trainer.command_line import absolute_local_path  # noqa: E402
from hybridrl.trainer.config_checks import resolve_config  # noqa: E402


def test_relative_paths_that_exist_or_are_created_become_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "tiny").mkdir(parents=True)
    (tmp_path / "data.parquet").touch()
    assert absolute_local_path("models/tiny", created=False) == str(tmp_path / "models" / "tiny")
    assert absolute_local_path(["data.parquet", "/abs/x"], created=False) == [str(tmp_path / "data.parquet"), "/abs/x"]
    assert absolute_local_path("runs/new", created=True) == str(tmp_path / "runs" / "new")  # made by the run
    assert absolute_local_path("Qwen/Qwen2.5-0.5B", created=False) == "Qwen/Qwen2.5-0.5B"  # a Hub id, not here
    assert absolute_local_path("hdfs://cluster/ckpt", created=True) == "hdfs://cluster/ckpt"
    assert absolute_local_path("~/x", created=True) == os.path.expanduser("~/x")
    assert absolute_local_path(None, created=True) is None and absolute_local_path(3, created=True) == 3


def test_a_resolved_ppo_config_names_every_local_path_absolutely(arithmetic_data, tiny_model_dir, tmp_path,
                                                                  monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").symlink_to(arithmetic_data)
    (tmp_path / "model").symlink_to(tiny_model_dir)
    config = resolve_config(ppo_config(
        "data.train_files=data/train.parquet", "data.val_files=[data/test.parquet]", "actor_rollout_ref.model.path=model",
        "trainer.project_name=p", "trainer.experiment_name=e", "trainer.device=cpu", "trainer.n_gpus_per_node=1"))
    assert config.trainer.default_local_dir == str(tmp_path / "checkpoints" / "p" / "e")  # verl's relative default
    assert config.actor_rollout_ref.model.path == str(tmp_path / "model")
    assert config.data.train_files == str(tmp_path / "data" / "train.parquet")
    assert list(config.data.val_files) == [str(tmp_path / "data" / "test.parquet")]
    # every role loads the tokenizer from where the driver found it
    assert config.actor_rollout_ref.model.tokenizer_path in (None, str(tmp_path / "model"))
