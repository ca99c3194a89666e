"""reward_model.launch_reward_fn_async: the rule-based reward scores in a background thread, with the same
scores and the same errors as in line, while the driver goes on."""

import time

import numpy as np
import pytest
import torch

from hybridrl.protocol import DataProto
from hybridrl.rewards.failures import RewardFailureError
from hybridrl.trainer.dataflow import BackgroundReward, load_reward_manager

SLOW_REWARD = '''
import time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    time.sleep(0.2)
    return float(len(solution_str))

def broken(data_source, solution_str, ground_truth, extra_info=None):
    raise ValueError("broken on purpose")
'''


def batch(tokenizer, responses: list[str]) -> DataProto:
    """One-token prompts (left-padded to 2) and right-padded responses of up to 8 tokens."""
    pad = tokenizer.pad_token_id
    prompts = torch.full((len(responses), 2), pad)  # (rows, 2)
    out = torch.full((len(responses), 8), pad)  # (rows, 8)
    mask = torch.zeros((len(responses), 10), dtype=torch.long)
    for i, text in enumerate(responses):
        ids = tokenizer.encode(text, add_special_tokens=False)[:8]
        prompts[i, 1] = tokenizer.encode("q", add_special_tokens=False)[0]
        out[i, :len(ids)] = torch.tensor(ids)
        mask[i, 1:2 + len(ids)] = 1
    return DataProto.from_dict(
        {"prompts": prompts, "responses": out, "attention_mask": mask},
        {"data_source": np.array(["s"] * len(responses), dtype=object),
         "reward_model": np.array([{"ground_truth": "", "style": "rule"}] * len(responses), dtype=object)})


def manager(tokenizer, path, name="compute_score", **reward_model):
    # reward_fn_workers=0: the calls run in the scoring thread itself, the case with the least isolation
    return load_reward_manager({"reward_model": {"reward_fn_workers": 0, **reward_model},
                                "custom_reward_function": {"path": str(path), "name": name}}, tokenizer)


def test_background_scores_equal_inline_ones_while_the_driver_goes_on(tiny_tokenizer, tmp_path):
    path = tmp_path / "slow.py"
    path.write_text(SLOW_REWARD)
    reward_fn = manager(tiny_tokenizer, path)
    data = batch(tiny_tokenizer, ["12", "3456", "7"])
    background = BackgroundReward(reward_fn)
    try:
        start = time.monotonic()
        pending = background.submit(data)
        submitted = time.monotonic() - start
        # the driver goes on: it adds keys to the batch (as the log-prob pass does) while the thread scores
        data.batch["old_log_probs"] = torch.zeros(3, 8)
        assert submitted < 0.1 and not pending.done()  # three calls of 0.2 s each are still running
        result = pending.result(timeout=10)
    finally:
        background.close()
    inline = reward_fn(data, return_dict=True)
    assert torch.equal(result["reward_tensor"], inline["reward_tensor"])
    assert result["reward_tensor"].sum() > 0


def test_a_reward_error_surfaces_when_the_scores_are_collected(tiny_tokenizer, tmp_path):
    path = tmp_path / "slow.py"
    path.write_text(SLOW_REWARD)
    background = BackgroundReward(manager(tiny_tokenizer, path, "broken", max_failure_share=0.0))
    try:
        pending = background.submit(batch(tiny_tokenizer, ["1", "2"]))
        with pytest.raises(RewardFailureError, match="broken on purpose"):
            pending.result(timeout=10)
    finally:
        background.close()
