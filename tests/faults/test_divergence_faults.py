"""Divergence (issue 19, item 3): a learning rate of 1e3 ruins the 1M model within a step.

Before the guard, such a run went on with NaN gradient norms, rc 0 and no warning, saving the ruined
model as the latest checkpoint every step; and a resumed run trained at the checkpoint's learning rate,
whatever the command line said. Now a non-finite step stops the run (or, within
trainer.max_consecutive_skipped_steps, is counted, logged and not saved) before anything is saved over
the last good checkpoint, and a learning rate changed on resume applies and is reported.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from pathlib import Path

import pytest
from fault_helpers import fault_run_overrides, ppo_config

from hybridrl.trainer.main_ppo import run_ppo
from hybridrl.trainer.metrics import DivergenceGuard, TrainingDivergedError, unhealthy_metrics

BAD_LR = "actor_rollout_ref.actor.optim.lr=1e3"


def read_rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def digest(directory: Path) -> dict[str, str]:
    """Every file under `directory` by relative path -> sha256 of its bytes."""
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def test_unhealthy_metrics_are_non_finite_losses_and_grad_norms_or_skipped_updates():
    metrics = {"actor/pg_loss": math.nan, "critic/vf_loss": 0.5, "actor/grad_norm": math.inf, "train/loss": 1.0,
               "critic/grad_norm": 2.0, "actor/skipped_step": 0.5, "critic/skipped_step": 0.0,
               "actor/entropy": math.nan}  # entropy is neither a loss nor a gradient norm
    assert set(unhealthy_metrics(metrics)) == {"actor/pg_loss", "actor/grad_norm", "actor/skipped_step"}


def test_the_guard_counts_unhealthy_steps_in_a_row_and_stops_past_the_limit():
    guard = DivergenceGuard(2, last_checkpoint=lambda: "/runs/x/global_step_3", hint="Lower the lr")
    bad, good = {"actor/grad_norm": math.nan}, {"actor/grad_norm": 1.0}
    # healthy, bad, healthy (resets), bad, bad: tolerated; the third bad in a row stops
    assert [guard.check(step, dict(m)) for step, m in enumerate([good, bad, good, bad, bad], 1)] == \
        [True, False, True, False, False]
    with pytest.raises(TrainingDivergedError, match=r"step 6: actor/grad_norm=nan .* 3 such step\(s\) in a row, and "
                       r"trainer.max_consecutive_skipped_steps=2 .* is /runs/x/global_step_3; .* Lower the lr"):
        guard.check(6, dict(bad))
    with pytest.raises(ValueError, match="trainer.max_consecutive_skipped_steps must be 0 or more"):
        DivergenceGuard(-1, last_checkpoint=lambda: None, hint="")


def test_divergence_on_resume_stops_before_saving_and_the_new_lr_applies(fault_data, tiny_model_dir, tmp_path,
                                                                          caplog):
    run = tmp_path / "run"
    base = [*fault_run_overrides(fault_data, tiny_model_dir, run), "trainer.save_freq=1"]
    run_ppo(ppo_config(*base, "trainer.total_training_steps=1"))  # a good checkpoint of step 1 at lr 1e-3
    good = digest(run / "global_step_1")

    with caplog.at_level(logging.WARNING), pytest.raises(TrainingDivergedError) as err:
        run_ppo(ppo_config(*base, "trainer.total_training_steps=3", BAD_LR))
    message = str(err.value)
    assert "training diverged at step 2: actor/grad_norm=nan" in message
    assert f"The last checkpoint is {run / 'global_step_1'};" in message
    assert "actor_rollout_ref.actor.optim.lr=1000.0" in message and "max_consecutive_skipped_steps" in message
    # the changed setting was reported, and applied: step 2 trained at 1e3, not at the checkpoint's 1e-3
    assert "actor_rollout_ref.actor.optim.lr: 0.001 -> 1000.0" in caplog.text
    rows = read_rows(run)
    assert [row["step"] for row in rows] == [1, 2]  # the diverged step is logged, once
    assert rows[1]["actor/lr"] == 1000.0
    assert rows[1]["actor/grad_norm"] is None and rows[1]["training/consecutive_skipped_steps"] == 1
    # nothing saved over the last good checkpoint
    assert (run / "latest_checkpointed_iteration.txt").read_text() == "1"
    assert sorted(p.name for p in run.glob("global_step_*")) == ["global_step_1"]
    assert digest(run / "global_step_1") == good


def test_tolerated_skips_are_counted_logged_and_never_saved(fault_data, tiny_model_dir, tmp_path, caplog):
    run = tmp_path / "run"
    overrides = [*fault_run_overrides(fault_data, tiny_model_dir, run), "trainer.save_freq=1", BAD_LR,
                 "trainer.total_training_steps=3", "trainer.max_consecutive_skipped_steps=1"]
    with caplog.at_level(logging.WARNING), pytest.raises(TrainingDivergedError, match="at step 2.* 2 such step"):
        run_ppo(ppo_config(*overrides))
    assert "step 1: actor/grad_norm=nan" in caplog.text and "its update was skipped and it is not checkpointed" \
        in caplog.text
    rows = read_rows(run)
    assert [(row["step"], row["training/consecutive_skipped_steps"]) for row in rows] == [(1, 1), (2, 2)]
    assert not list(run.glob("global_step_*")) and not (run / "latest_checkpointed_iteration.txt").exists()


def test_sft_stops_at_its_first_non_finite_step_without_saving_it(fault_data, tiny_model_dir, tmp_path):
    from hydra import compose, initialize_config_dir
    from ppo_helpers import CONFIG_DIR

    from hybridrl.trainer.main_sft import run_sft

    run = tmp_path / "sft"
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        config = compose("sft_trainer", overrides=[
            f"data.train_files={fault_data / 'train.parquet'}", f"model.partial_pretrain={tiny_model_dir}",
            f"trainer.default_local_dir={run}", "trainer.backend=local", "trainer.logger=[file]",
            "data.train_batch_size=8", "data.micro_batch_size_per_gpu=8", "trainer.total_training_steps=4",
            "trainer.save_freq=1", "trainer.max_ckpt_to_keep=null", "optim.lr_warmup_steps_ratio=0", "optim.lr=1e3"])
    with pytest.raises(TrainingDivergedError, match=r"train/grad_norm=nan.*optim.lr \(now 1000.0\)") as err:
        run_sft(config)
    rows = read_rows(run)
    diverged = rows[-1]["step"]
    assert f"diverged at step {diverged}:" in str(err.value)
    assert rows[-1]["train/grad_norm"] is None and rows[-1]["train/skipped_step"] == 1  # NaN is written as null
    assert [row["step"] for row in rows] == list(range(1, diverged + 1))
    # every step before it was saved, the diverged one never
    assert sorted(p.name for p in run.glob("global_step_*")) == [f"global_step_{s}" for s in range(1, diverged)]
    assert (run / "latest_checkpointed_iteration.txt").read_text() == str(diverged - 1)
