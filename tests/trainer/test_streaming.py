"""Streaming (async_training.mode=streaming, verl's fully_async): the rollout pool decodes without pause, steps
train the groups that finish first, no trained sample lags more weight versions than the staleness bound allows,
and a run resumed from a checkpoint trains every prompt once: none twice, none lost."""

import json
from collections import Counter
from pathlib import Path

import pytest
from ppo_helpers import ppo_config, tiny_run_overrides

from hybridrl.trainer.async_training import StreamSettings
from hybridrl.trainer.main_ppo import run_ppo

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]

STREAMING = ["trainer.n_gpus_per_node=1", "actor_rollout_ref.hybrid_engine=false", "rollout.n_gpus_per_node=1",
             "async_training.mode=streaming", "data.train_batch_size=0", "async_training.require_batches=2",
             "actor_rollout_ref.rollout.max_num_seqs=8"]


def _trained_prompts(run_dir: Path) -> dict[int, list[str]]:
    """Each step's trained prompts (one entry per group), from trainer.rollout_data_dir's dumps."""
    steps = {}
    for path in sorted((run_dir / "rollouts").glob("*.jsonl")):
        rows = Counter(json.loads(line)["input"] for line in path.read_text().splitlines())
        assert all(count % 4 == 0 for count in rows.values())  # rollout.n = 4 rows per group
        steps[int(path.stem)] = [prompt for prompt, count in rows.items() for _ in range(count // 4)]
    return steps


@pytest.mark.parametrize("partial", [False, True], ids=["drain", "partial"])
def test_steps_train_finished_groups_within_the_staleness_bound(partial, arithmetic_data, tiny_model_dir, tmp_path):
    base = tiny_run_overrides(arithmetic_data, tiny_model_dir, tmp_path / "run")
    history = run_ppo(ppo_config(*base, *STREAMING, "trainer.total_training_steps=6", "trainer.test_freq=3",
                                 "async_training.staleness_threshold=1", f"async_training.partial_rollout={partial}",
                                 f"trainer.rollout_data_dir={tmp_path / 'run' / 'rollouts'}"))
    assert [m["training/global_step"] for m in history] == [1, 2, 3, 4, 5, 6]
    bound = StreamSettings(4, 1, 1.0, partial, 4, 2).max_staleness
    assert bound == 1
    for m in history:
        assert 0 <= m["async/staleness_mean"] <= m["async/staleness_max"] <= bound
        assert m["timing_s/trainer_idle"] >= 0 and m["timing_s/rollout_idle"] >= 0
        assert "rollout_corr/rollout_is_mean" in m  # the default truncated IS weights
    assert history[0]["async/staleness_max"] == 0  # nothing is older than the first weights
    assert max(m["async/staleness_max"] for m in history) == 1  # the rollout ran a window ahead
    assert "val-core/arithmetic/reward/mean@1" in history[2]
    trained = _trained_prompts(tmp_path / "run")
    assert sorted(trained) == [1, 2, 3, 4, 5, 6] and all(len(p) == 4 for p in trained.values())


def test_resume_mid_stream_trains_each_prompt_once(arithmetic_data, tiny_model_dir, tmp_path):
    settings = [*STREAMING, "async_training.staleness_threshold=1", "async_training.partial_rollout=true",
                "trainer.save_freq=2"]
    first = tiny_run_overrides(arithmetic_data, tiny_model_dir, tmp_path / "run")
    run_ppo(ppo_config(*first, *settings, "trainer.total_training_steps=3",
                       f"trainer.rollout_data_dir={tmp_path / 'run' / 'rollouts'}"))
    again = tiny_run_overrides(arithmetic_data, tiny_model_dir, tmp_path / "resumed")
    resumed = run_ppo(ppo_config(*again, *settings, "trainer.total_training_steps=6", "trainer.resume_mode=resume_path",
                                 f"trainer.resume_from_path={tmp_path / 'run' / 'global_step_2'}",
                                 f"trainer.rollout_data_dir={tmp_path / 'resumed' / 'rollouts'}"))
    assert [m["training/global_step"] for m in resumed] == [3, 4, 5, 6]
    before = _trained_prompts(tmp_path / "run")
    after = _trained_prompts(tmp_path / "resumed")
    assert all(len(prompts) == 4 for prompts in after.values())  # every step trains a full step's prompts
    # steps 1-2 before the checkpoint, 3-6 after it: 24 prompts of the first epoch, none twice
    epoch = before[1] + before[2] + [p for step in sorted(after) for p in after[step]]
    assert len(epoch) == 24
    assert Counter(epoch).most_common(1)[0][1] == 1
    # what the checkpoint held (queued groups, prompts in flight or drawn) was trained right after the resume,
    # before any prompt the loader had not handed out yet: so the first run's step 3 is among the resumed steps
    assert set(before[3]) <= set(after[3] + after[4] + after[5] + after[6])

