"""Trainer metrics against hand-computed values on small hand-built batches.

The batch used throughout (B=3 rows, prompt width P=3, response width R=4):

    row  prompt mask  response mask  prompt len  response len
    0    0 1 1        1 1 1 1        2           4  (hit max_response_length)
    1    1 1 1        1 1 0 0        3 (full)    2
    2    0 0 1        1 0 0 0        1           1

Padded positions hold large garbage (99, -50) so any masking mistake shows up in the expectations.
"""

from __future__ import annotations

import math
import resource
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from hybridrl.protocol import DataProto
from hybridrl.trainer.metrics import (
    compute_data_metrics,
    compute_memory_metrics,
    compute_mfu_metrics,
    compute_rollout_agreement_metrics,
    compute_throughput_metrics,
    compute_timing_metrics,
    process_validation_metrics,
    reduce_metrics,
    validation_metrics_to_flat,
)
from hybridrl.utils.device import ProcessMemory

PROMPT_MASK = [[0, 1, 1], [1, 1, 1], [0, 0, 1]]
RESPONSE_MASK = [[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]]


def make_batch(response_mask=None, prompt_mask=None, **overrides) -> DataProto:
    response_mask = torch.tensor(response_mask or RESPONSE_MASK)  # (B, R)
    prompt_mask = torch.tensor(prompt_mask or PROMPT_MASK)  # (B, P)
    batch_size, response_len = response_mask.shape
    tensors = {
        "prompts": torch.full(prompt_mask.shape, 5),
        "responses": torch.full((batch_size, response_len), 7),
        "attention_mask": torch.cat([prompt_mask, response_mask], dim=1),  # (B, P + R)
        "response_mask": response_mask,
        # sequence scores 1, 0, 0.5 on each row's last valid token
        "token_level_scores": torch.tensor([[0, 0, 0, 1.0], [0, 0, 0, 0], [0.5, 0, 0, 0]]),
        # a KL-like penalty spread over tokens: row sums 0.6, 0.0, 0.5
        "token_level_rewards": torch.tensor([[-0.1, -0.1, -0.1, 0.9], [-0.2, 0.2, 0, 0], [0.5, 0, 0, 0]]),
        "advantages": torch.tensor([[1.0, 2, 3, 4], [-1, -2, 99, 99], [5, 99, 99, 99]]),
        "returns": torch.tensor([[1.0, 1, 1, 1], [0, 0, -50, -50], [2, -50, -50, -50]]),
        "values": torch.tensor([[1.0, 1, 1, 1], [0, 1, 99, 99], [1, 99, 99, 99]]),
    }
    tensors.update(overrides)
    return DataProto.from_dict(tensors)


def test_data_metrics_match_hand_computation():
    m = compute_data_metrics(make_batch(), use_critic=True)
    # scores [1, 0, 0.5]
    assert m["critic/score/mean"] == pytest.approx(0.5)
    assert (m["critic/score/max"], m["critic/score/min"]) == (1.0, 0.0)
    # rewards [0.6, 0, 0.5] -> mean 1.1 / 3
    assert m["critic/rewards/mean"] == pytest.approx(1.1 / 3)
    assert m["critic/rewards/max"] == pytest.approx(0.6)
    assert m["critic/rewards/min"] == pytest.approx(0.0)
    # valid advantages 1 2 3 4 -1 -2 5: sum 12 over 7 tokens
    assert m["critic/advantages/mean"] == pytest.approx(12 / 7)
    assert (m["critic/advantages/max"], m["critic/advantages/min"]) == (5.0, -2.0)
    # valid returns 1 1 1 1 0 0 2: mean 6/7
    assert m["critic/returns/mean"] == pytest.approx(6 / 7)
    assert (m["critic/returns/max"], m["critic/returns/min"]) == (2.0, 0.0)
    # valid values 1 1 1 1 0 1 1: mean 6/7
    assert m["critic/values/mean"] == pytest.approx(6 / 7)
    assert (m["critic/values/max"], m["critic/values/min"]) == (1.0, 0.0)
    # returns - values = 0 0 0 0 0 -1 1: unbiased var = 2 / 6 = 1/3.
    # returns: deviations from 6/7 are 1/7 (x4), -6/7 (x2), 8/7 -> sum of squares 140/49 = 20/7,
    # unbiased var = (20/7) / 6 = 10/21. explained var = 1 - (1/3) / (10/21 + 1e-5) ~= 0.3
    assert m["critic/vf_explained_var"] == pytest.approx(1 - (1 / 3) / (10 / 21 + 1e-5), rel=1e-5)
    # response lengths 4 2 1 (R = 4): one of three rows is clipped
    assert m["response_length/mean"] == pytest.approx(7 / 3)
    assert (m["response_length/max"], m["response_length/min"]) == (4.0, 1.0)
    assert m["response_length/clip_ratio"] == pytest.approx(1 / 3)
    # prompt lengths 2 3 1 (P = 3): row 1 fills the prompt width
    assert m["prompt_length/mean"] == pytest.approx(2.0)
    assert (m["prompt_length/max"], m["prompt_length/min"]) == (3.0, 1.0)
    assert m["prompt_length/clip_ratio"] == pytest.approx(1 / 3)
    assert m["response/aborted_ratio"] == 0.0
    assert m["response_length_non_aborted/mean"] == pytest.approx(7 / 3)
    assert all(isinstance(v, float) for v in m.values())


def test_without_critic_there_are_no_value_metrics():
    batch = make_batch()
    batch.batch.pop("values")  # a GRPO batch has no values
    m = compute_data_metrics(batch, use_critic=False)
    assert not any(k.startswith("critic/values") for k in m)
    assert "critic/vf_explained_var" not in m
    assert m["critic/score/mean"] == pytest.approx(0.5)


def test_aborted_rows_leave_score_and_length_stats():
    # row 1 now has an empty response (aborted); its score 0 must not count in critic/score
    response_mask = [[1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 0]]
    m = compute_data_metrics(make_batch(response_mask=response_mask), use_critic=False)
    assert m["critic/score/mean"] == pytest.approx(0.75)  # (1 + 0.5) / 2
    assert m["critic/score/min"] == 0.5
    assert m["response/aborted_ratio"] == pytest.approx(1 / 3)
    assert m["response_length/mean"] == pytest.approx(5 / 3)  # (4 + 0 + 1) / 3, aborted included
    assert m["response_length_non_aborted/mean"] == pytest.approx(2.5)  # (4 + 1) / 2
    assert m["response_length_non_aborted/clip_ratio"] == pytest.approx(0.5)


def test_data_metric_errors_name_the_problem():
    with pytest.raises(ValueError, match="every response in the batch is empty"):
        compute_data_metrics(make_batch(response_mask=[[0] * 4] * 3), use_critic=False)
    batch = make_batch()
    batch.batch.pop("advantages")
    with pytest.raises(KeyError, match="advantages"):
        compute_data_metrics(batch, use_critic=False)


def test_timing_metrics_per_token_denominators():
    # response tokens 4 + 2 + 1 = 7; all tokens 7 + (2 + 3 + 1) = 13
    timing = {"gen": 0.7, "update_actor": 1.3, "reward": 0.2, "step": 3.0}
    m = compute_timing_metrics(make_batch(), timing)
    assert m["timing_s/gen"] == 0.7 and m["timing_s/reward"] == 0.2 and m["timing_s/step"] == 3.0
    assert m["timing_per_token_ms/gen"] == pytest.approx(700 / 7)  # gen counts response tokens
    assert m["timing_per_token_ms/update_actor"] == pytest.approx(1300 / 13)  # all tokens
    assert "timing_per_token_ms/reward" not in m and "timing_per_token_ms/step" not in m


def test_throughput_is_tokens_per_second_per_worker():
    m = compute_throughput_metrics(make_batch(), {"step": 2.6}, n_workers=2)
    # 13 attended tokens / (2.6 s * 2 workers) = 2.5 tokens/s/worker
    assert m == {"perf/total_num_tokens": 13, "perf/time_per_step": 2.6, "perf/throughput": pytest.approx(2.5)}
    with pytest.raises(KeyError, match="'step'"):
        compute_throughput_metrics(make_batch(), {"gen": 1.0}, n_workers=2)
    with pytest.raises(ValueError, match="n_workers"):
        compute_throughput_metrics(make_batch(), {"step": 1.0}, n_workers=0)


def _proc_status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(field)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_memory_metric_is_the_peak_rss_in_gib():
    m = compute_memory_metrics()
    # /proc's VmHWM is the kernel's own peak-RSS counter (KiB), read independently of getrusage
    peak_gib = _proc_status_kib("VmHWM") / 1024**2
    assert m["perf/max_memory_rss_gb"] == pytest.approx(peak_gib, rel=0.05)
    # a peak is at least the current resident size
    assert m["perf/max_memory_rss_gb"] >= _proc_status_kib("VmRSS") / 1024**2 * 0.99
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss > 0
    if not torch.cuda.is_available():
        assert "perf/max_memory_allocated_gb" not in m


def test_memory_metrics_cover_every_process_once():
    driver = ProcessMemory("a", 1, 0.5)
    workers = [ProcessMemory("a", 2, 2.0), ProcessMemory("a", 3, 3.0),
               ProcessMemory("a", 2, 2.0),  # the critic's view of rank 0's process: the same process
               ProcessMemory("b", 2, 4.0)]  # pid 2 on another node: a different process
    m = compute_memory_metrics(workers, driver=driver)
    assert m == {"perf/max_memory_rss_gb": 0.5,  # the driver alone, as before
                 "perf/max_memory_rss_gb/worker_max": 4.0,
                 "perf/max_memory_rss_gb/workers_sum": 2.0 + 3.0 + 4.0,
                 "perf/max_memory_rss_gb/all_processes": 0.5 + 9.0}
    # local backend: the only worker is the driver's own process, counted once
    local = compute_memory_metrics([ProcessMemory("a", 1, 0.5)], driver=driver)
    assert local["perf/max_memory_rss_gb/workers_sum"] == local["perf/max_memory_rss_gb/all_processes"] == 0.5


def test_gpu_memory_is_the_largest_process_peak_and_absent_on_cpu():
    driver = ProcessMemory("a", 1, 0.5)
    on_gpu = [ProcessMemory("a", 2, 2.0, 10.0, 12.0), ProcessMemory("a", 3, 2.0, 11.0, 11.5)]
    m = compute_memory_metrics(on_gpu, driver=driver)
    assert m["perf/max_memory_allocated_gb"] == 11.0 and m["perf/max_memory_reserved_gb"] == 12.0
    cpu = compute_memory_metrics([ProcessMemory("a", 2, 2.0)], driver=driver)
    assert not any("allocated" in k or "reserved" in k for k in cpu)


def test_mfu_metrics_by_hand():
    # actor: 1.2e10 FLOPs in 0.5 s on 6e10 FLOP/s -> 0.4; rollout: 2e9 in 1 s on 1e10 -> 0.2
    m = compute_mfu_metrics({"actor": 1.2e10, "rollout": 2e9}, {"actor": 0.5, "rollout": 1.0},
                            {"actor": 6e10, "rollout": 1e10, "ref": 1e10})
    assert m == {"perf/mfu/actor": pytest.approx(0.4), "perf/mfu/rollout": pytest.approx(0.2)}
    assert compute_mfu_metrics({"actor": 1.0}, {}, {"actor": 1.0}) == {}  # not timed: no figure


def test_rollout_agreement_only_when_both_log_probs_exist():
    assert compute_rollout_agreement_metrics(make_batch()) == {}
    rollout = torch.tensor([[-1.0, -1, -1, -1], [-2, -2, 0, 0], [-3, 0, 0, 0]])
    old = torch.tensor([[-1.0, -1, -1, -1.5], [-2, -2.25, 7, 7], [-3, 7, 7, 7]])
    m = compute_rollout_agreement_metrics(make_batch(rollout_log_probs=rollout, old_log_probs=old))
    # |diff| on the 7 valid tokens: 0 0 0 .5 0 .25 0 -> max .5, mean .75 / 7
    assert m["rollout/log_prob_diff_max"] == pytest.approx(0.5)
    assert m["rollout/log_prob_diff_mean"] == pytest.approx(0.75 / 7)


def test_reduce_metrics_means_and_extremes():
    out = reduce_metrics(
        {
            "actor/pg_loss": [1.0, 2.0, 3.0],  # mean 2
            "response_length/max": [3, 7],  # max 7: the mean of maxima is no maximum
            "perf/max_memory_rss_gb": [1.0, 2.5],  # max 2.5
            "critic/values/min": [-1.0, 4.0],  # min -1
            "actor/pg_clipfrac": [0.1, 0.3],  # mean 0.2 ("clipfrac" is not "min")
            "actor/lr": 1e-6,  # a bare scalar is its own mean
            "actor/grad_norm": [],
        }
    )
    assert out["actor/pg_loss"] == pytest.approx(2.0)
    assert out["response_length/max"] == 7.0
    assert out["perf/max_memory_rss_gb"] == 2.5
    assert out["critic/values/min"] == -1.0
    assert out["actor/pg_clipfrac"] == pytest.approx(0.2)
    assert out["actor/lr"] == pytest.approx(1e-6)
    assert math.isnan(out["actor/grad_norm"])


# ----- validation ----------------------------------------------------------------------------------


def test_single_sample_gives_mean_and_pass_at_1_only():
    out = process_validation_metrics(
        ["a", "a", "b"], ["u0", "u1", "u2"], {"acc": [True, False, True], "reward": [1.0, 0.0, 0.5]}
    )
    assert out["a"]["acc"] == {"mean@1": 0.5, "pass@1": 0.5}  # prompt u0 right, u1 wrong
    assert out["a"]["reward"] == {"mean@1": 0.5}  # pass@k only for the core variable (acc)
    assert out["b"]["acc"] == {"mean@1": 1.0, "pass@1": 1.0}
    flat = validation_metrics_to_flat(out)
    assert flat == {
        "val-core/a/acc/mean@1": 0.5,
        "val-core/a/acc/pass@1": 0.5,
        "val-aux/a/reward/mean@1": 0.5,
        "val-core/b/acc/mean@1": 1.0,
        "val-core/b/acc/pass@1": 1.0,
        "val-aux/b/reward/mean@1": 0.5,
    }


def test_all_correct_and_all_wrong_prompts_are_deterministic():
    # prompt p answers right 4 times out of 4, prompt q wrong 4 times out of 4
    uids = ["p"] * 4 + ["q"] * 4
    out = process_validation_metrics(["src"] * 8, uids, {"reward": [1.0] * 4 + [0.0] * 4})["src"]["reward"]
    # each prompt's best@k and worst@k equal its constant score (1 or 0), with zero spread;
    # the source averages the two prompts: 0.5
    for k in (2, 4):
        for kind in ("best", "worst"):
            assert out[f"{kind}@{k}/mean"] == pytest.approx(0.5)
            assert out[f"{kind}@{k}/std"] == 0.0
        assert out[f"pass@{k}"] == 0.5
    assert out["mean@4"] == 0.5 and out["std@4"] == 0.0 and out["pass@1"] == 0.5
    assert not any(k.startswith("maj@") for k in out)  # no pred column -> no majority vote


def test_pass_at_k_by_hand():
    # prompt x: 1 correct of 4; prompt y: 2 correct of 4 (correct = reward > 0)
    rewards = [1.0, 0.0, 0.0, 0.0] + [0.0, 0.5, 0.0, 2.0]
    out = process_validation_metrics(["s"] * 8, ["x"] * 4 + ["y"] * 4, {"reward": rewards})["s"]["reward"]
    # pass@1 = c/n: (1/4 + 2/4) / 2 = 0.375
    assert out["pass@1"] == pytest.approx(0.375)
    # pass@2 = 1 - C(n-c, 2)/C(4, 2): x: 1 - 3/6 = 1/2; y: 1 - 1/6 = 5/6; mean 2/3
    assert out["pass@2"] == pytest.approx(2 / 3)
    # pass@4: both prompts have a correct sample among all 4
    assert out["pass@4"] == 1.0


def _reference_bootstrap(values, k, reduce_fn, seed=42, n=1000):
    """The definition, one resample at a time: k draws with replacement, reduce, then mean and std."""
    rng = np.random.RandomState(seed)
    results = [reduce_fn([values[i] for i in rng.choice(len(values), size=k, replace=True)]) for _ in range(n)]
    return np.mean(results), np.std(results)


def _majority_value(sample):
    """Value of the first response that gave the most frequent prediction (ties: seen first)."""
    counts = Counter(pred for _, pred in sample)
    winner = max(counts, key=counts.__getitem__)
    return next(val for val, pred in sample if pred == winner)


def test_bootstrap_matches_the_one_resample_at_a_time_definition():
    acc = [1.0, 0.0, 0.0, 1.0, 0.0]
    preds = ["7", "3", "3", "7", "9"]
    out = process_validation_metrics(["s"] * 5, ["u"] * 5, {"acc": acc, "pred": preds})["s"]
    assert set(out) == {"acc"}  # string-valued `pred` is a vote key, not a metric
    metrics = out["acc"]
    for k in (2, 4, 5):  # powers of two below n = 5, then n
        assert (metrics[f"best@{k}/mean"], metrics[f"best@{k}/std"]) == pytest.approx(
            _reference_bootstrap(acc, k, max)
        )
        assert (metrics[f"worst@{k}/mean"], metrics[f"worst@{k}/std"]) == pytest.approx(
            _reference_bootstrap(acc, k, min)
        )
        pairs = list(zip(acc, preds, strict=True))
        assert (metrics[f"maj@{k}/mean"], metrics[f"maj@{k}/std"]) == pytest.approx(
            _reference_bootstrap(pairs, k, _majority_value)
        )
    # best@2 estimates P(at least one of 2 draws is correct) = 1 - (3/5)^2 = 0.64
    assert metrics["best@2/mean"] == pytest.approx(0.64, abs=0.05)
    assert metrics["mean@5"] == pytest.approx(0.4) and metrics["std@5"] == pytest.approx(np.std(acc))


def test_flat_names_follow_verls_core_rule():
    rewards = [1.0, 0.0, 1.0, 1.0]
    nested = process_validation_metrics(
        ["gsm8k"] * 4, ["u"] * 4, {"acc": rewards, "reward": rewards, "pred": ["1", "2", "1", "1"]}
    )
    flat = validation_metrics_to_flat(nested)
    core = {k.removeprefix("val-core/gsm8k/") for k in flat if k.startswith("val-core/")}
    # core: the core variable (acc), mean/maj/best/pass metrics, at the largest n (4)
    assert core == {
        "acc/mean@4", "acc/best@4/mean", "acc/best@4/std", "acc/maj@4/mean", "acc/maj@4/std", "acc/pass@4",
    }
    assert "val-aux/gsm8k/acc/best@2/mean" in flat and "val-aux/gsm8k/acc/std@4" in flat
    assert "val-aux/gsm8k/acc/worst@4/mean" in flat and "val-aux/gsm8k/reward/mean@4" in flat
    assert flat["val-core/gsm8k/acc/mean@4"] == pytest.approx(0.75)


def test_numpy_columns_from_non_tensor_batch_work():
    # the trainer passes non_tensor_batch columns: numpy object/str arrays and numpy bools
    out = process_validation_metrics(
        np.array(["a", "a"]), np.array(["u", "u"], dtype=object), {"acc": np.array([True, False])}
    )
    assert list(out) == ["a"] and type(next(iter(out))) is str
    assert out["a"]["acc"]["mean@2"] == 0.5 and out["a"]["acc"]["pass@2"] == 1.0


def test_validation_input_lengths_must_agree():
    with pytest.raises(ValueError, match="acc has 2 entries but data_sources has 3"):
        process_validation_metrics(["a"] * 3, ["u"] * 3, {"acc": [1, 0]})
