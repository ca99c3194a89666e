"""PF-PPO's resampling: weights from scores by hand, rows drawn whole, in proportion, reproducibly."""

import numpy as np
import pytest
import torch

from hybridrl.algos import compute_pf_ppo_reweight_data
from hybridrl.algos.advantage import pf_ppo_weights
from hybridrl.protocol import DataProto


def test_weights_by_hand():
    scores = torch.tensor([-2.0, 0.5, 1.0, 1.0, -2.0])
    torch.testing.assert_close(pf_ppo_weights(scores, "pow", 2.0), torch.tensor([4.0, 0.25, 1.0, 1.0, 4.0]))
    torch.testing.assert_close(pf_ppo_weights(scores, "max_min"), torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0]))
    torch.testing.assert_close(pf_ppo_weights(scores, "max_random"), torch.tensor([0.1, 0.1, 0.4, 0.4, 0.1]))
    with pytest.raises(ValueError, match="reweight_method must be one of"):
        pf_ppo_weights(scores, "median")


def scored_batch(scores):
    rows = len(scores)
    token_scores = torch.zeros(rows, 3)
    token_scores[:, -1] = torch.tensor(scores)
    return DataProto.from_dict({"token_level_scores": token_scores, "row": torch.arange(rows)},
                               non_tensors={"uid": np.array([f"u{i}" for i in range(rows)], dtype=object)})


def test_rows_are_drawn_whole_and_in_proportion_to_their_weights():
    scores = [1.0, 0.0] * 500  # |s|^2: ones drawn, zeros only through the 1e-8 floor
    resampled = compute_pf_ppo_reweight_data(scored_batch(scores), generator=torch.Generator().manual_seed(0))
    assert len(resampled) == 1000
    rows = resampled.batch["row"]
    assert torch.all(rows % 2 == 0)  # every drawn row has score 1
    assert list(resampled.non_tensor_batch["uid"]) == [f"u{i}" for i in rows.tolist()]  # columns follow rows
    torch.testing.assert_close(resampled.batch["token_level_scores"][:, -1], torch.ones(1000))
    # weights 4 : 1 (scores 2 and 1) -> about 80% of the draws are the score-2 row
    skewed = compute_pf_ppo_reweight_data(scored_batch([2.0, 1.0] * 500), generator=torch.Generator().manual_seed(1))
    share = (skewed.batch["row"] % 2 == 0).float().mean().item()
    assert share == pytest.approx(0.8, abs=0.04)


def test_the_same_generator_seed_redraws_the_same_rows_and_zero_scores_draw_uniformly():
    batch = scored_batch([0.0] * 8)
    first = compute_pf_ppo_reweight_data(batch, generator=torch.Generator().manual_seed(5)).batch["row"]
    again = compute_pf_ppo_reweight_data(batch, generator=torch.Generator().manual_seed(5)).batch["row"]
    torch.testing.assert_close(first, again)
    assert first.unique().numel() > 1
