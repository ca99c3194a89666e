"""Reward managers on a real DataProto with the tiny tokenizer: placement, extras, timeouts, DAPO shaping."""

from pathlib import Path

import numpy as np
import pytest
import torch

from hybridrl.protocol import DataProto
from hybridrl.rewards.custom import load_custom_reward_function
from hybridrl.rewards.managers import REWARD_MANAGERS, load_reward_manager

FIXTURE = Path(__file__).parent / "fixtures" / "custom_reward.py"


def _make_batch(tokenizer, prompts, responses, sources, truths, prompt_len=12, response_len=16, extra=None):
    """Left-padded prompts and right-padded responses, as the rollout produces them."""
    pad = tokenizer.pad_token_id
    n = len(prompts)
    prompt_ids = torch.full((n, prompt_len), pad)  # (batch, prompt_len)
    response_ids = torch.full((n, response_len), pad)  # (batch, response_len)
    attention = torch.zeros((n, prompt_len + response_len), dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        p_ids = tokenizer.encode(p, add_special_tokens=False)[-prompt_len:]
        r_ids = tokenizer.encode(r, add_special_tokens=False)[:response_len]
        prompt_ids[i, prompt_len - len(p_ids):] = torch.tensor(p_ids)
        response_ids[i, : len(r_ids)] = torch.tensor(r_ids)
        attention[i, prompt_len - len(p_ids): prompt_len + len(r_ids)] = 1
    return DataProto.from_dict(
        {"prompts": prompt_ids, "responses": response_ids, "attention_mask": attention,
         "response_mask": attention[:, prompt_len:]},
        {"data_source": np.array(sources, dtype=object),
         "reward_model": np.array([{"ground_truth": t, "style": "rule"} for t in truths], dtype=object),
         "extra_info": np.array(extra or [{} for _ in prompts], dtype=object)},
    )


def _last_valid(data):
    return data.batch["attention_mask"][:, data.batch["prompts"].shape[1]:].sum(-1) - 1


def test_naive_puts_each_score_on_the_last_valid_token(tiny_tokenizer):
    data = _make_batch(
        tiny_tokenizer,
        ["What is 2+3?", "What is 7*6?", "Hi"],
        ["<answer>5</answer>", "It is <answer>41</answer>", "<answer>1"],
        ["arithmetic"] * 3, ["5", "42", "1"],
    )
    manager = REWARD_MANAGERS.get("naive")(tiny_tokenizer, num_examine=0)
    rewards = manager(data)
    assert rewards.shape == data.batch["responses"].shape
    last = _last_valid(data)
    expected = torch.zeros_like(rewards)
    expected[0, last[0]] = 1.0  # correct answer; row 1 is wrong (0.0), row 2 has no closed tag (0.0)
    assert torch.equal(rewards, expected)
    assert last[0] < rewards.shape[1] - 1  # the row is padded, so "last valid" is not just the last column


def test_naive_dict_results_become_extra_info_and_examples_print(tiny_tokenizer, capsys):
    fn = load_custom_reward_function(FIXTURE)
    data = _make_batch(tiny_tokenizer, ["q1", "q2"], ["so 42", "so 7"], ["a", "b"], ["42", "42"],
                       extra=[{"detailed": True}, {"detailed": True}])
    out = REWARD_MANAGERS.get("naive")(tiny_tokenizer, num_examine=1, compute_score=fn)(data, return_dict=True)
    last = _last_valid(data)
    assert out["reward_tensor"][0, last[0]] == 1.0 and out["reward_tensor"][1].sum() == 0.0
    assert out["reward_extra_info"] == {"score": [1.0, 0.0], "response_chars": [5, 4]}  # len("so 42"), len("so 7")
    printed = capsys.readouterr().out
    assert "[response] so 42" in printed and "[response] so 7" in printed  # one example per source


def test_batch_manager_calls_once_with_lists(tiny_tokenizer):
    fn = load_custom_reward_function(FIXTURE, "batched_score")
    data = _make_batch(tiny_tokenizer, ["q", "q"], ["abc", "abcdef"], ["s1", "s2"], ["x", "y"])
    out = REWARD_MANAGERS.get("batch")(tiny_tokenizer, compute_score=fn)(data, return_dict=True)
    last = _last_valid(data)
    assert out["reward_tensor"][0, last[0]] == 3.0 and out["reward_tensor"][1, last[1]] == 6.0
    assert out["reward_extra_info"]["source"] == ["s1", "s2"]


def test_prime_survives_hanging_raising_and_dying_scorers(tiny_tokenizer):
    fn = load_custom_reward_function(FIXTURE, "misbehaving_score")
    responses = ["ok 42", "hang", "raise", "die", "ok 42 again", "wrong"]
    data = _make_batch(tiny_tokenizer, ["q"] * 6, responses, ["s"] * 6, ["42"] * 6)
    manager = REWARD_MANAGERS.get("prime")(tiny_tokenizer, compute_score=fn, timeout=2.0, num_processes=2)
    out = manager(data, return_dict=True)
    scores = out["reward_tensor"].sum(-1).tolist()
    assert scores == [1.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    assert out["reward_extra_info"]["reward_timeout"] == [False, True, False, False, False, False]
    assert out["reward_extra_info"]["reward_error"] == [False, False, True, True, False, False]
    assert (manager.num_timeouts, manager.num_errors) == (1, 2)


@pytest.mark.parametrize(
    ("valid_len", "expected_penalty"),
    [
        (8, 0.0),  # 8 <= L - B = 16 - 4 = 12: no penalty
        (12, 0.0),  # exactly at the start of the buffer: -(12 - 12) / 4 * 1.0 = 0
        (14, -0.5),  # -(14 - 12) / 4 * 1.0
        (16, -1.0),  # full buffer: -(16 - 12) / 4 * 1.0
    ],
)
def test_dapo_overlong_penalty_matches_formula(tiny_tokenizer, valid_len, expected_penalty):
    manager = REWARD_MANAGERS.get("dapo")(
        tiny_tokenizer, max_resp_len=16,
        overlong_buffer_cfg={"enable": True, "len": 4, "penalty_factor": 1.0, "log": True},
    )
    assert manager.overlong_penalty(valid_len) == pytest.approx(expected_penalty)


def test_dapo_adds_the_penalty_on_the_last_token(tiny_tokenizer):
    # The long response is cut at 16 tokens before its answer tag: score 0, full-buffer penalty.
    long_response = " x" * 40 + "<answer>5</answer>"
    data = _make_batch(tiny_tokenizer, ["q", "q"], ["<answer>5</answer>", long_response],
                       ["arithmetic"] * 2, ["5", "5"], response_len=16)
    manager = load_reward_manager(
        {"reward_model": {"reward_manager": "dapo",
                          "overlong_buffer": {"enable": True, "len": 4, "penalty_factor": 0.5, "log": True}},
         "data": {"max_response_length": 16}},
        tiny_tokenizer,
    )
    out = manager(data, return_dict=True)
    last = _last_valid(data)
    assert int(last[0]) + 1 <= 12 and int(last[1]) == 15  # short row outside the buffer, long row full
    assert out["reward_tensor"][0, last[0]] == 1.0  # 1.0 + 0 penalty
    assert out["reward_tensor"][1, 15] == pytest.approx(-0.5)  # 0.0 - (16 - 12) / 4 * 0.5
    assert out["reward_extra_info"]["score"] == [1.0, 0.0]  # unshaped scores
    assert out["reward_extra_info"]["overlong"] == [False, True]


def test_rm_scores_pass_through_and_errors_are_clear(tiny_tokenizer):
    data = _make_batch(tiny_tokenizer, ["q"], ["a"], ["s"], ["a"])
    rm = torch.full(data.batch["responses"].shape, 0.25)
    data.batch["rm_scores"] = rm
    assert torch.equal(REWARD_MANAGERS.get("naive")(tiny_tokenizer)(data), rm)
    with pytest.raises(KeyError, match="reward manager 'nope'.*naive"):
        load_reward_manager({"reward_model": {"reward_manager": "nope"}}, tiny_tokenizer)
    bad = _make_batch(tiny_tokenizer, ["q"], ["a"], ["unknown/source"], ["a"])
    with pytest.raises(NotImplementedError, match="unknown/source"):
        REWARD_MANAGERS.get("naive")(tiny_tokenizer)(bad)
