"""Continuous batching (streaming mode's HF decoding): rows admitted as others finish, across calls, give what
the model gives each prompt alone; every token's log-prob is the model's, through column moves and a weight
change in flight; every token carries the version it was sampled under."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hybridrl.protocol import DataProto
from hybridrl.workers.rollout import HFRollout
from hybridrl.workers.rollout.continuous import ContinuousBatch

from .helpers import full_forward_log_probs, make_prompts

TEXTS = ["What is 12 + 7?", "hi", "Compute 3 * 4 please, step by step.", "a b c", "seven", "x y", "1 2 3 4 5",
         "the sum of two and two"]


def _prompts(tokenizer, **meta) -> DataProto:
    prompts = make_prompts(tokenizer, TEXTS, length=16, **meta)
    prompts.non_tensor_batch["uid"] = np.array([f"p{i}" for i in range(len(TEXTS))], dtype=object)
    return prompts


def _drain(rollout: HFRollout, prompts: DataProto | None, version: int = 0, max_steps: int = 5) -> list[DataProto]:
    out, first = [], prompts
    for _ in range(500):
        got = rollout.stream(first, version, max_steps=max_steps)
        first = None
        if got is not None:
            out.append(got)
        if rollout.continuous.in_flight == 0:
            return out
    raise AssertionError("the continuous batch never emptied")


def _by_uid(parts: list[DataProto]) -> dict[str, DataProto]:
    whole = DataProto.concat(parts)
    uids = list(dict.fromkeys(whole.non_tensor_batch["uid"]))
    return {u: whole.select_rows([i for i, v in enumerate(whole.non_tensor_batch["uid"]) if v == u]) for u in uids}


def test_greedy_rows_admitted_as_others_finish_equal_each_prompt_decoded_alone(tiny_model, tiny_tokenizer,
                                                                               monkeypatch):
    # tokens 4..39 stop a response too, so rows end at different steps; two rows decode at once, and prompts of
    # 16 columns with responses of 32 move the shared column past the buffers' end
    config = {"response_length": 32, "prompt_length": 16, "do_sample": False, "max_num_seqs": 2, "dtype": "float32",
              "ignore_eos": True, "stop_token_ids": list(range(4, 40))}
    compactions = []
    original = ContinuousBatch._compact
    monkeypatch.setattr(ContinuousBatch, "_compact", lambda self: (compactions.append(1), original(self)))
    streamed = _by_uid(_drain(HFRollout(tiny_model, config, tiny_tokenizer), _prompts(tiny_tokenizer)))
    lengths = set()
    for i, text in enumerate(TEXTS):
        alone = HFRollout(tiny_model, config, tiny_tokenizer).generate_sequences(
            _prompts(tiny_tokenizer).select_rows([i]))
        got = streamed[f"p{i}"]
        assert torch.equal(got.batch["responses"], alone.batch["responses"]), text
        assert torch.equal(got.batch["input_ids"], alone.batch["input_ids"])
        assert torch.equal(got.batch["position_ids"], alone.batch["position_ids"])
        torch.testing.assert_close(got.batch["rollout_log_probs"], alone.batch["rollout_log_probs"],
                                   atol=1e-4, rtol=0)
        lengths.add(int(got.batch["response_mask"].sum()))
    assert len(lengths) > 2  # rows really ended at different steps
    assert compactions  # the shared column reached the buffers' end and rows moved left


@pytest.mark.parametrize("n", [1, 3])
def test_sampled_tokens_log_probs_are_the_models_through_a_weight_change_in_flight(n, tiny_model, tiny_tokenizer):
    config = {"response_length": 20, "prompt_length": 16, "n": n, "max_num_seqs": 2 * n + 1, "dtype": "float32", "temperature": 1.0,
              "stop_token_ids": list(range(4, 40))}
    rollout = HFRollout(tiny_model, config, tiny_tokenizer)
    parts = [rollout.stream(_prompts(tiny_tokenizer), version=0, max_steps=4)]
    assert rollout.continuous.rows > 0  # rows are in flight when the weights change
    parts += _drain(rollout, None, version=1, max_steps=3)
    out = DataProto.concat([p for p in parts if p is not None])
    assert sorted(set(out.non_tensor_batch["uid"])) == sorted(f"p{i}" for i in range(len(TEXTS)))
    assert len(out) == n * len(TEXTS)
    assert list(out.non_tensor_batch["uid"][::n]) == list(out.non_tensor_batch["uid"][::n])
    for start in range(0, len(out), n):  # a prompt's n samples come back together
        assert len(set(out.non_tensor_batch["uid"][start: start + n])) == 1
    mask = out.batch["response_mask"].bool()
    expected = full_forward_log_probs(tiny_model, out)
    torch.testing.assert_close(out.batch["rollout_log_probs"][mask], expected[mask], atol=1e-4, rtol=0)
    versions = out.batch["rollout_versions"]
    assert bool((versions[~mask] == -1).all())
    assert set(versions[mask].tolist()) == {0, 1}
    # a row's tokens move from version 0 to 1 at most once (some rows did), and its version is its oldest token's
    assert any(len(set(versions[row][mask[row]].tolist())) == 2 for row in range(len(out)))
    for row in range(len(out)):
        valid = versions[row][mask[row]].tolist()
        assert valid == sorted(valid)
        assert int(out.batch["weight_version"][row]) == valid[0]


def test_without_partial_rollout_new_weights_with_rows_in_flight_are_refused(tiny_model, tiny_tokenizer):
    rollout = HFRollout(tiny_model, {"response_length": 20, "max_num_seqs": 2}, tiny_tokenizer)
    rollout.stream(_prompts(tiny_tokenizer), version=0, max_steps=2, partial=False)
    with pytest.raises(RuntimeError, match="without partial rollout"):
        rollout.stream(None, version=1, max_steps=2, partial=False)
    unfinished = rollout.continuous.unfinished_prompts()  # what a checkpoint saves to generate again
    assert list(unfinished.non_tensor_batch["uid"]) == [f"p{i}" for i in range(len(TEXTS))]


@pytest.mark.gpu
def test_on_the_gpu_the_continuous_batch_samples_the_models_log_probs(tiny_model_dir, tiny_tokenizer):
    from hybridrl.models.loading import load_causal_lm

    model = load_causal_lm(tiny_model_dir, dtype="float32").eval().to("cuda")
    config = {"response_length": 20, "prompt_length": 16, "n": 2, "max_num_seqs": 5, "dtype": "float32",
              "stop_token_ids": list(range(4, 40))}
    rollout = HFRollout(model, config, tiny_tokenizer)
    parts = [rollout.stream(_prompts(tiny_tokenizer).to("cuda"), version=0, max_steps=4)]
    parts += _drain(rollout, None, version=1, max_steps=3)
    out = DataProto.concat([p for p in parts if p is not None])
    assert len(out) == 2 * len(TEXTS) and out.batch["responses"].device.type == "cuda"
    mask = out.batch["response_mask"].bool()
    expected = full_forward_log_probs(model, out)
    torch.testing.assert_close(out.batch["rollout_log_probs"][mask], expected[mask], atol=1e-4, rtol=0)
