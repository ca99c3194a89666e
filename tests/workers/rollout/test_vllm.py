"""The vLLM engine: never imported by accident; where vllm exists, same layout and log-probs as HF.

The hand-off through the worker is tested in tests/workers/test_rollout_handoff.py, and GRPO with it
in tests/trainer/test_ppo_vllm.py.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch

from hybridrl.workers.rollout import ROLLOUT_ENGINES, RolloutConfig, build_rollout

from .helpers import full_forward_log_probs, make_prompts

HAS_VLLM = importlib.util.find_spec("vllm") is not None
NO_VLLM = "vllm is not installed: the CPU build runs in its own venv (requirements-vllm.txt)"


def test_importing_hybridrl_rollout_does_not_import_vllm():
    code = "import sys, hybridrl.workers.rollout as r; assert 'vllm' in r.ROLLOUT_ENGINES; print('vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.skipif(HAS_VLLM, reason="checks the message shown when vllm is missing")
def test_missing_vllm_explains_the_way_out(tiny_model_dir):
    with pytest.raises(ImportError, match=r"requirements-vllm\.txt.*rollout\.name=hf"):
        build_rollout(RolloutConfig(name="vllm"), model_path=tiny_model_dir)
    assert "vllm" in ROLLOUT_ENGINES


@pytest.mark.skipif(not HAS_VLLM, reason=NO_VLLM)
def test_vllm_matches_layout_and_log_probs(tiny_model, tiny_model_dir, tiny_tokenizer):
    rollout = build_rollout(
        RolloutConfig(name="vllm", response_length=16, n=2, prompt_length=16, temperature=0.7),
        model_path=tiny_model_dir, tokenizer=tiny_tokenizer,
    )
    try:
        out = rollout.generate_sequences(make_prompts(tiny_tokenizer, length=16, seed=5))
        assert out.batch["responses"].shape == (8, 16)
        # the log-prob of the distribution each token was drawn from: logits / temperature
        expected = full_forward_log_probs(tiny_model, out, temperature=0.7) * out.batch["response_mask"]
        torch.testing.assert_close(out.batch["rollout_log_probs"], expected, atol=1e-4, rtol=0)
        # a call's seed reproduces it, and gives every sample of every prompt its own stream
        again = rollout.generate_sequences(make_prompts(tiny_tokenizer, length=16, seed=5))
        assert torch.equal(again.batch["responses"], out.batch["responses"])
        assert len({tuple(row.tolist()) for row in out.batch["responses"]}) == 8
        # weight hand-off: zeroing the final norm's weight collapses the logits; vLLM must follow the update
        state = {k: (torch.zeros_like(v) if k.endswith("model.norm.weight") else v)
                 for k, v in tiny_model.state_dict().items()}
        rollout.update_weights(state)
        greedy = rollout.generate_sequences(make_prompts(tiny_tokenizer, length=16, do_sample=False))
        # all-zero logits: log_softmax is -log(vocab) for every token
        vocab = tiny_model.config.vocab_size
        expected_lp = torch.full_like(greedy.batch["rollout_log_probs"], -torch.log(torch.tensor(float(vocab))))
        torch.testing.assert_close(greedy.batch["rollout_log_probs"], expected_lp * greedy.batch["response_mask"])
    finally:
        rollout.close()
    # standalone, vLLM made the process group, and closing the engine closes it
    assert not torch.distributed.is_initialized()


@pytest.mark.skipif(not HAS_VLLM, reason=NO_VLLM)
def test_verls_engine_keys_reach_vllm_and_dummy_weights_serve_once_the_actors_arrive(tiny_model, tiny_model_dir,
                                                                                     tiny_tokenizer):
    # verl's default load_format=dummy: vLLM starts from random weights and generates with the ones it is given
    rollout = build_rollout(
        RolloutConfig(name="vllm", response_length=16, n=2, prompt_length=16, temperature=0.7, load_format="dummy",
                      max_num_seqs=4, max_num_batched_tokens=64, enable_chunked_prefill=True,
                      enable_prefix_caching=False, engine_kwargs={"vllm": {"max_logprobs": 3}}),
        model_path=tiny_model_dir, tokenizer=tiny_tokenizer,
    )
    try:
        scheduler = rollout.llm.llm_engine.vllm_config.scheduler_config
        assert (scheduler.max_num_seqs, scheduler.max_num_batched_tokens) == (4, 64)
        assert rollout.llm.llm_engine.vllm_config.model_config.max_logprobs == 3
        rollout.update_weights(tiny_model.state_dict())
        out = rollout.generate_sequences(make_prompts(tiny_tokenizer, length=16, seed=5))
        expected = full_forward_log_probs(tiny_model, out, temperature=0.7) * out.batch["response_mask"]
        torch.testing.assert_close(out.batch["rollout_log_probs"], expected, atol=1e-4, rtol=0)
    finally:
        rollout.close()
