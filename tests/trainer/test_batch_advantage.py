"""Batch-level advantages: every input the batch has goes to the estimator, its settings from the algorithm
config."""

import numpy as np
import pytest
import torch
from ppo_helpers import scored_batch

from hybridrl.protocol import DataProto
from hybridrl.trainer.dataflow import compute_advantage, keep_varied_groups
from hybridrl.trainer.ppo_config import AlgorithmConfig


def test_grpo_on_a_batch_writes_advantages_and_returns():
    data = scored_batch([1.0, 3.0], [[1, 1], [1, 0]], ["p", "p"])
    compute_advantage(data, "grpo", AlgorithmConfig())
    # mean 2, unbiased std sqrt(2): (1 - 2) / 1.414 = -0.7071 on both tokens, +0.7071 on the valid one
    expected = torch.tensor([[-0.70711, -0.70711], [0.70711, 0.0]])
    torch.testing.assert_close(data.batch["advantages"], expected, atol=1e-4, rtol=0)
    torch.testing.assert_close(data.batch["returns"], data.batch["advantages"])


def test_settings_come_from_the_algorithm_config():
    data = scored_batch([0.0, 4.0], [[1, 1], [1, 1]], ["p", "q"])
    compute_advantage(data, "reinforce_plus_plus", AlgorithmConfig(gamma=0.5))
    # row 1 returns: 0.5 * 4 = 2 then 4
    torch.testing.assert_close(data.batch["returns"][1], torch.tensor([2.0, 4.0]))
    with pytest.raises(TypeError, match=r"the algorithm config \(algorithm.\*\); got 0.9"):
        compute_advantage(data, "gae", 0.9)  # verl's positional gamma


def _groups(token_scores: list[list[float]], uids: list[str], **values) -> DataProto:
    batch = DataProto.from_dict({"token_level_scores": torch.tensor(token_scores)})
    batch.non_tensor_batch["uid"] = np.array(uids, dtype=object)
    for name, column in values.items():
        batch.non_tensor_batch[name] = np.array(column, dtype=object)
    return batch


def test_dynamic_sampling_keeps_the_groups_that_vary_on_the_metric():
    # prompt a: token sums 1, 1 (same); b: 0, 1 (varied); c: one sample (never varies)
    scores = [[0.0, 1.0], [1.0, 0.0], [0.0, 0.0], [0.0, 1.0], [0.5, 0.5]]
    uids = ["a", "a", "b", "b", "c"]
    kept, prompts = keep_varied_groups(_groups(scores, uids), "seq_reward")
    assert prompts == 1 and kept.non_tensor_batch["uid"].tolist() == ["b", "b"]
    # a value the reward function returned decides where it differs from the token sums: acc varies in a only
    kept, prompts = keep_varied_groups(_groups(scores, uids, acc=[1, 0, 1, 1, 0]), "acc")
    assert prompts == 1 and kept.non_tensor_batch["uid"].tolist() == ["a", "a"]
    # `score` as returned (before, e.g., an overlong penalty the token scores carry), else the token sums
    kept, _ = keep_varied_groups(_groups(scores, uids, score=[1.0, 0.0, 1.0, 1.0, 0.0]), "score")
    assert kept.non_tensor_batch["uid"].tolist() == ["a", "a"]
    kept, _ = keep_varied_groups(_groups(scores, uids), "score")
    assert kept.non_tensor_batch["uid"].tolist() == ["b", "b"]
    with pytest.raises(KeyError, match="filter_groups.metric='pass'.*returned values: \\['uid'\\]"):
        keep_varied_groups(_groups(scores, uids), "pass")
