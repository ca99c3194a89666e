"""trainer.rollout_data_dir / validation_data_dir: what a run writes, checked against the data and the reward."""

import importlib.util
import json

import pyarrow.parquet as pq
from ppo_helpers import FIXTURES, ppo_config, tiny_run_overrides

from hybridrl.trainer.main_ppo import run_ppo


def _reward_module():
    spec = importlib.util.spec_from_file_location("digit_reward", FIXTURES / "digit_reward.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_rollout_and_validation_generations_are_dumped_as_jsonl(arithmetic_data, tiny_model_dir, tmp_path):
    rollouts, validations = tmp_path / "rollouts", tmp_path / "validations"
    run_ppo(ppo_config(
        *tiny_run_overrides(arithmetic_data, tiny_model_dir, tmp_path / "run"),
        "trainer.backend=local", "trainer.n_gpus_per_node=1", "trainer.total_training_steps=1",
        "trainer.val_before_train=true", "trainer.test_freq=1",
        f"trainer.rollout_data_dir={rollouts}", f"trainer.validation_data_dir={validations}",
    ))
    score = _reward_module().compute_score
    train_truths = {str(r["ground_truth"]) for r in pq.read_table(arithmetic_data / "train.parquet")
                    .column("reward_model").to_pylist()}
    test_truths = sorted(str(r["ground_truth"]) for r in pq.read_table(arithmetic_data / "test.parquet")
                         .column("reward_model").to_pylist())

    assert sorted(p.name for p in rollouts.iterdir()) == ["1.jsonl"]
    rows = _read(rollouts / "1.jsonl")
    assert len(rows) == 4 * 4  # data.train_batch_size x rollout.n
    for row in rows:
        assert row["step"] == 1 and "Compute " in row["input"] and row["gts"] in train_truths
        # the dumped score is the reward function's own value for the dumped text
        assert abs(row["score"] - score("arithmetic", row["output"], row["gts"])) < 1e-6
    # the 4 samples of one prompt sit together and share its prompt and ground truth
    for start in range(0, 16, 4):
        assert len({(r["input"], r["gts"]) for r in rows[start:start + 4]}) == 1

    assert sorted(p.name for p in validations.iterdir()) == ["0.jsonl", "1.jsonl"]
    for step in (0, 1):
        rows = _read(validations / f"{step}.jsonl")
        assert sorted(r["gts"] for r in rows) == test_truths  # every held-out prompt once (greedy, n=1)
        assert all(r["step"] == step for r in rows)
        assert all(abs(r["score"] - score("arithmetic", r["output"], r["gts"])) < 1e-6 for r in rows)
