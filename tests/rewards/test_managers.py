"""Reward managers on a real DataProto with the tiny tokenizer: placement, extras, DAPO shaping, and the
guard around the reward function (timeouts, crashes, bad values counted; too many or a fatal one stop)."""

import logging
import re
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from hybridrl.protocol import DataProto
from hybridrl.rewards.failures import RewardFailureError, RewardFunctionFatalError
from hybridrl.rewards.managers import REWARD_MANAGERS, load_custom_reward_function, max_failures
from hybridrl.trainer.dataflow import load_reward_manager

FIXTURE = Path(__file__).parent / "fixtures" / "custom_reward.py"
FAULTY = Path(__file__).parent / "fixtures" / "faulty_reward.py"


@pytest.fixture
def managers():
    """Build managers by name; their worker processes are stopped after the test."""
    built = []

    def make(name, tokenizer, **kwargs):
        built.append(REWARD_MANAGERS.get(name)(tokenizer, **{"num_workers": 2, **kwargs}))
        return built[-1]

    yield make
    for manager in built:
        manager.close()


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


def test_naive_puts_each_score_on_the_last_valid_token(tiny_tokenizer, managers):
    data = _make_batch(
        tiny_tokenizer,
        ["What is 2+3?", "What is 7*6?", "Hi"],
        ["<answer>5</answer>", "It is <answer>41</answer>", "<answer>1"],
        ["arithmetic"] * 3, ["5", "42", "1"],
    )
    manager = managers("naive", tiny_tokenizer, num_examine=0)
    rewards = manager(data)
    assert rewards.shape == data.batch["responses"].shape
    last = _last_valid(data)
    expected = torch.zeros_like(rewards)
    expected[0, last[0]] = 1.0  # correct answer; row 1 is wrong (0.0), row 2 has no closed tag (0.0)
    assert torch.equal(rewards, expected)
    assert last[0] < rewards.shape[1] - 1  # the row is padded, so "last valid" is not just the last column
    metrics = manager(data, return_dict=True)["reward_metrics"]
    assert metrics == {"reward/errors": 0.0, "reward/crashes": 0.0, "reward/timeouts": 0.0, "reward/non_finite": 0.0,
                       "reward/wrong_type": 0.0, "reward/failed": 0.0, "reward/rows": 3.0, "reward/failure_share": 0.0}


def test_naive_dict_results_become_extra_info_and_examples_print(tiny_tokenizer, capsys, managers):
    fn = load_custom_reward_function(FIXTURE)
    data = _make_batch(tiny_tokenizer, ["q1", "q2"], ["so 42", "so 7"], ["a", "b"], ["42", "42"],
                       extra=[{"detailed": True}, {"detailed": True}])
    out = managers("naive", tiny_tokenizer, num_examine=1, compute_score=fn)(data, return_dict=True)
    last = _last_valid(data)
    assert out["reward_tensor"][0, last[0]] == 1.0 and out["reward_tensor"][1].sum() == 0.0
    assert out["reward_extra_info"] == {"score": [1.0, 0.0], "response_chars": [5, 4]}  # len("so 42"), len("so 7")
    printed = capsys.readouterr().out
    assert "[response] so 42" in printed and "[response] so 7" in printed  # one example per source


def test_each_validation_prints_an_example_of_a_prompt_not_shown_before(tiny_tokenizer, capsys, managers):
    fn = load_custom_reward_function(FIXTURE)
    data = _make_batch(tiny_tokenizer, ["q1", "q2"], ["so 42", "so 7"], ["a", "a"], ["42", "42"])
    manager = managers("naive", tiny_tokenizer, num_examine=1, compute_score=fn)
    shown = []
    for _ in range(3):  # the same validation set, scored three times
        manager(data, return_dict=True)
        shown.append(re.findall(r"\[response\] (.*)", capsys.readouterr().out))
    assert shown == [["so 42"], ["so 7"], []]


def test_batch_manager_calls_once_with_lists(tiny_tokenizer, managers):
    fn = load_custom_reward_function(FIXTURE, "batched_score")
    data = _make_batch(tiny_tokenizer, ["q", "q"], ["abc", "abcdef"], ["s1", "s2"], ["x", "y"])
    out = managers("batch", tiny_tokenizer, compute_score=fn)(data, return_dict=True)
    last = _last_valid(data)
    assert out["reward_tensor"][0, last[0]] == 3.0 and out["reward_tensor"][1, last[1]] == 6.0
    assert out["reward_extra_info"]["source"] == ["s1", "s2"]


def test_prime_survives_hanging_raising_and_dying_scorers(tiny_tokenizer, managers):
    fn = load_custom_reward_function(FIXTURE, "misbehaving_score")
    responses = ["ok 42", "hang", "raise", "die", "ok 42 again", "wrong"]
    data = _make_batch(tiny_tokenizer, ["q"] * 6, responses, ["s"] * 6, ["42"] * 6)
    # prime's own argument names (from reward_model.reward_kwargs), and a share that lets 3 of 6 fail
    manager = managers("prime", tiny_tokenizer, compute_score=fn, timeout=2.0, num_processes=2,
                       max_failure_share=0.5)
    out = manager(data, return_dict=True)
    scores = out["reward_tensor"].sum(-1).tolist()
    assert scores == [1.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    assert out["reward_extra_info"]["reward_timeout"] == [False, True, False, False, False, False]
    assert out["reward_extra_info"]["reward_error"] == [False, False, True, True, False, False]
    metrics = out["reward_metrics"]
    assert (metrics["reward/timeouts"], metrics["reward/errors"], metrics["reward/crashes"]) == (1, 1, 1)
    assert metrics["reward/failure_share"] == 0.5  # 3 of 6


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
        {"reward_model": {"reward_manager": "dapo", "reward_fn_workers": 1,
                          "overlong_buffer": {"enable": True, "len": 4, "penalty_factor": 0.5, "log": True}},
         "data": {"max_response_length": 16}},
        tiny_tokenizer,
    )
    out = manager(data, return_dict=True)
    manager.close()
    last = _last_valid(data)
    assert int(last[0]) + 1 <= 12 and int(last[1]) == 15  # short row outside the buffer, long row full
    assert out["reward_tensor"][0, last[0]] == 1.0  # 1.0 + 0 penalty
    assert out["reward_tensor"][1, 15] == pytest.approx(-0.5)  # 0.0 - (16 - 12) / 4 * 0.5
    assert out["reward_extra_info"]["score"] == [1.0, 0.0]  # unshaped scores
    assert out["reward_extra_info"]["overlong"] == [False, True]


def test_rm_scores_pass_through_and_errors_are_clear(tiny_tokenizer, managers):
    data = _make_batch(tiny_tokenizer, ["q"], ["a"], ["s"], ["a"])
    rm = torch.full(data.batch["responses"].shape, 0.25)
    data.batch["rm_scores"] = rm
    assert torch.equal(managers("naive", tiny_tokenizer)(data), rm)
    with pytest.raises(KeyError, match="reward manager 'nope'.*naive"):
        load_reward_manager({"reward_model": {"reward_manager": "nope"}}, tiny_tokenizer)
    # A data source without a scorer is a setup error: it stops at the first row, whatever the share.
    bad = _make_batch(tiny_tokenizer, ["q"] * 3, ["a"] * 3, ["arithmetic", "unknown/source", "arithmetic"], ["1"] * 3)
    manager = managers("naive", tiny_tokenizer, max_failure_share=1.0)
    with pytest.raises(NotImplementedError, match="unknown/source") as caught:
        manager(bad)
    assert isinstance(caught.value, RewardFunctionFatalError)
    assert "row 1 (data_source='unknown/source')" in "\n".join(caught.value.__notes__)


# ----- the guard around the reward function ----------------------------------------------------------------
# Response -> what `faulty_reward.by_response` does with it (see tests/rewards/fixtures/faulty_reward.py).
KINDS = {"raise": "errors", "sys.exit": "errors", "exit": "crashes", "hang": "timeouts", "nan": "non_finite",
         "inf": "non_finite", "dictnan": "non_finite", "none": "wrong_type", "text": "wrong_type",
         "nodict": "wrong_type"}


@pytest.mark.parametrize("name", ["naive", "dapo", "prime"])
def test_every_kind_of_failure_scores_zero_and_is_counted(tiny_tokenizer, managers, caplog, name):
    responses = ["7", *KINDS, "bool", "8"]  # "7" right, "bool" returns True (a valid 1.0), "8" wrong
    n = len(responses)
    data = _make_batch(tiny_tokenizer, ["q"] * n, responses, ["s"] * n, ["7"] * n)
    fn = load_custom_reward_function(FAULTY, "by_response")
    manager = managers(name, tiny_tokenizer, compute_score=fn, timeout=1.5, max_failure_share=1.0,
                       **({"max_resp_len": 16} if name == "dapo" else {}))
    with caplog.at_level(logging.WARNING, logger="hybridrl.rewards.failures"):
        out = manager(data, return_dict=True)
    scores = out["reward_tensor"].sum(-1)
    assert torch.isfinite(out["reward_tensor"]).all()  # never NaN in the reward, whatever was returned
    assert scores.tolist() == [1.0] + [0.0] * len(KINDS) + [1.0, 0.0]
    metrics = out["reward_metrics"]
    expected = {kind: float(list(KINDS.values()).count(kind)) for kind in set(KINDS.values())}
    assert {kind: metrics[f"reward/{kind}"] for kind in expected} == expected  # 2 errors, 1 crash, ...
    assert metrics["reward/failed"] == len(KINDS) and metrics["reward/rows"] == n
    assert metrics["reward/failure_share"] == pytest.approx(len(KINDS) / n)
    # one warning per kind, with the first failure's row and traceback
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 5
    error_log = next(w for w in warnings if "failed as error" in w)
    assert "2 of 13 rows" in error_log and "row 1 " in error_log and "ZeroDivisionError" in error_log
    assert "faulty_reward.py" in error_log  # the traceback
    timeout_log = next(w for w in warnings if "failed as timeout" in w)
    assert "reward_model.reward_fn_timeout" in timeout_log and "in <lambda>" in timeout_log  # the hung stack


def test_too_many_failures_stop_with_the_share_the_first_traceback_and_the_key(tiny_tokenizer, managers):
    data = _make_batch(tiny_tokenizer, ["q"] * 4, ["7", "raise", "7", "7"], ["s"] * 4, ["7"] * 4)
    fn = load_custom_reward_function(FAULTY, "by_response")
    # 1 of 4 = 0.25: within a limit of 0.25, over one of 0.2
    out = managers("naive", tiny_tokenizer, compute_score=fn, max_failure_share=0.25)(data, return_dict=True)
    assert out["reward_metrics"]["reward/errors"] == 1
    with pytest.raises(RewardFailureError) as caught:
        managers("naive", tiny_tokenizer, compute_score=fn, max_failure_share=0.2)(data)
    message = str(caught.value)
    # (">=" when the rows after the failure were not run: the limit was passed already)
    assert re.search(r"share (>= )?0.25 > reward_model.max_failure_share=0.2 \(errors=1\)", message)
    assert "row 1 (data_source='s'): the reward function raised ZeroDivisionError" in message
    assert 'File "' in message and "faulty_reward.py" in message  # the traceback
    assert "by_response in" in message and "raise reward_model.max_failure_share" in message


def test_a_failed_batch_stops_its_other_calls_instead_of_waiting_for_them(tiny_tokenizer, managers, tmp_path):
    # 8 rows, 2 workers, 1 s timeout, at most 2 failures (0.25 x 8). Rows start in the order 0, 4, 2, 6, 1, 5,
    # 3, 7 (processing_order). Row 0 answers at once, so the batch is not taken for a hung function; the
    # third timeout ends the batch. Started by then: row 0, the three hung rows that timed out, and at most
    # one more running on the other worker (which rows exactly depends on when each worker process came
    # up); the rest never start, so the batch does not take 4 waves.
    extra = [{"marker_dir": str(tmp_path), "row": i, "answers": i == 0} for i in range(8)]
    data = _make_batch(tiny_tokenizer, ["q"] * 8, ["x"] * 8, ["s"] * 8, ["7"] * 8, extra=extra)
    fn = load_custom_reward_function(FAULTY, "record_and_hang")
    manager = managers("naive", tiny_tokenizer, compute_score=fn, timeout=1.0, max_failure_share=0.25)
    with pytest.raises(RewardFailureError, match=r"at least 3 of 8 rows .*share >= 0.38 > .*=0.25 \(timeouts=3\)"):
        manager(data)
    started = {p.name for p in tmp_path.iterdir()}
    assert "row0" in started and 4 <= len(started) <= 5, started
    assert started <= {f"row{i}" for i in (0, 4, 2, 6, 1)}, started  # the first five of the order


def test_a_batch_that_hangs_from_its_first_calls_stops_after_one_timeout(tiny_tokenizer, managers, tmp_path):
    # every row hangs: the two workers' first calls (rows 0 and 4) time out side by side, and the batch stops
    # there rather than after the 3 timeouts (2 waves) the share needs. Row 2 may have started on the first
    # replacement worker when row 4's worker started a little later; it is stopped with the rest.
    extra = [{"marker_dir": str(tmp_path), "row": i} for i in range(8)]
    data = _make_batch(tiny_tokenizer, ["q"] * 8, ["x"] * 8, ["s"] * 8, ["7"] * 8, extra=extra)
    fn = load_custom_reward_function(FAULTY, "record_and_hang")
    manager = managers("naive", tiny_tokenizer, compute_score=fn, timeout=1.0, max_failure_share=0.25)
    with pytest.raises(RewardFailureError, match=r"hangs: the first 2 calls of this batch of 8 rows all timed out"
                                                 r"(.|\n)*other 6 rows were not scored(.|\n)*in record_and_hang"):
        manager(data)
    assert {"row0", "row4"} <= {p.name for p in tmp_path.iterdir()} <= {"row0", "row4", "row2"}


def test_a_fatal_error_stops_at_once_as_itself_or_as_a_reward_failure(tiny_tokenizer, managers):
    fn = load_custom_reward_function(FAULTY, "by_response")
    manager = managers("naive", tiny_tokenizer, compute_score=fn, max_failure_share=1.0)
    data = _make_batch(tiny_tokenizer, ["q"] * 3, ["7", "fatal", "7"], ["s"] * 3, ["7"] * 3)
    with pytest.raises(RewardFunctionFatalError, match="verifier service is offline") as caught:
        manager(data)
    assert "faulty_reward.py" in "\n".join(caught.value.__notes__)  # the worker's traceback
    # a subclass defined in the user's file cannot be rebuilt in the driver: its text travels instead
    data = _make_batch(tiny_tokenizer, ["q"], ["userfatal"], ["s"], ["7"])
    with pytest.raises(RewardFailureError, match=r"fatal error(.|\n)*VerifierOffline: the verifier service"):
        manager(data)


def test_in_the_driver_failures_are_counted_the_same_way(tiny_tokenizer, managers):
    # reward_fn_workers=0: no pickling (a lambda works), same counting; no timeout, so nothing here hangs
    fn = load_custom_reward_function(FAULTY, "by_response")
    data = _make_batch(tiny_tokenizer, ["q"] * 4, ["7", "raise", "nan", "none"], ["s"] * 4, ["7"] * 4)
    out = managers("naive", tiny_tokenizer, compute_score=fn, num_workers=0, max_failure_share=1.0)(
        data, return_dict=True)
    assert out["reward_tensor"].sum(-1).tolist() == [1.0, 0.0, 0.0, 0.0]
    metrics = out["reward_metrics"]
    assert (metrics["reward/errors"], metrics["reward/non_finite"], metrics["reward/wrong_type"]) == (1, 1, 1)
    lam = managers("naive", tiny_tokenizer, compute_score=lambda **kw: 0.5, num_workers=0)
    assert lam(data).sum().item() == 2.0
    with pytest.raises(ValueError, match="cannot be sent to a worker process.*reward_fn_workers=0"):
        managers("naive", tiny_tokenizer, compute_score=lambda **kw: 0.5)


def test_failed_rows_get_zero_extras_so_per_sample_metrics_have_no_holes(tiny_tokenizer, managers):
    fn = load_custom_reward_function(FAULTY, "detailed")
    data = _make_batch(tiny_tokenizer, ["q"] * 2, ["abc", "raise"], ["s"] * 2, ["7"] * 2)
    out = managers("naive", tiny_tokenizer, compute_score=fn, max_failure_share=1.0)(data, return_dict=True)
    assert out["reward_extra_info"] == {"score": [1.0, 0.0], "acc": [True, False], "chars": [3, 0],
                                        "pred": ["abc", ""]}


def test_batch_manager_failures_fail_the_whole_call_or_one_item(tiny_tokenizer, managers):
    data = _make_batch(tiny_tokenizer, ["q"] * 3, ["ab", "nan", "abcd"], ["s"] * 3, ["7"] * 3)
    fn = load_custom_reward_function(FAULTY, "batched")
    out = managers("batch", tiny_tokenizer, compute_score=fn, max_failure_share=0.5)(data, return_dict=True)
    assert out["reward_tensor"].sum(-1).tolist() == [2.0, 0.0, 4.0]  # len("ab"), the NaN item, len("abcd")
    assert out["reward_metrics"]["reward/non_finite"] == 1
    for mode, message in [("raise", r"errors=3(.|\n)*KeyError: 'batched verifier broke'"),
                          ("short", r"wrong_type=3(.|\n)*returned 2 results for 3 responses")]:
        manager = managers("batch", tiny_tokenizer, compute_score=fn, mode=mode)
        with pytest.raises(RewardFailureError, match=message):
            manager(data)


def test_config_keys_reach_the_manager_and_bad_values_name_them(tiny_tokenizer):
    fn_path = {"path": str(FAULTY), "name": "by_response"}
    config = {"reward_model": {"reward_fn_timeout": 0.5, "reward_fn_workers": 1, "max_failure_share": 1.0},
              "custom_reward_function": fn_path}
    manager = load_reward_manager(config, tiny_tokenizer)
    data = _make_batch(tiny_tokenizer, ["q"] * 2, ["hang", "7"], ["s"] * 2, ["7"] * 2)
    start = time.monotonic()
    out = manager(data, return_dict=True)
    manager.close()
    # the hanging row sleeps 10,000 s: returning within minutes shows the timeout cut it (a loose bound, so a busy
    # machine cannot fail it)
    assert out["reward_metrics"]["reward/timeouts"] == 1 and time.monotonic() - start < 120
    for key, value, message in [("max_failure_share", 1.5, r"reward_model.max_failure_share must be in \[0, 1\]"),
                                ("reward_fn_workers", -1, "reward_model.reward_fn_workers must be >= 0"),
                                ("reward_fn_timeout", 0, "reward_model.reward_fn_timeout must be positive")]:
        with pytest.raises(ValueError, match=message):
            load_reward_manager({"reward_model": {key: value}}, tiny_tokenizer)


@pytest.mark.parametrize(("share", "rows", "expected"), [
    (0.1, 16, 1),  # 1/16 = 0.0625 <= 0.1 < 2/16
    (0.29, 100, 29),  # 0.29 * 100 = 28.999999999999996 in floats; 29/100 is still within the limit
    (0.0, 8, 0), (1.0, 8, 8), (0.5, 0, 0),
])
def test_max_failures_is_the_largest_count_within_the_share(share, rows, expected):
    assert max_failures(share, rows) == expected
