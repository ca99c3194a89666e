"""GRPO with LoRA end to end: the rollout samples from the adapted policy, checkpoints hold the adapters and
resume exactly, and the merger's two outputs (PEFT adapter directory, merged model) are the trained policy."""

import json

import pytest
import torch
from ppo_helpers import ppo_config, tiny_run_overrides
from test_ppo_e2e import DETERMINISTIC
from transformers import AutoModelForCausalLM

from hybridrl.model_merger import merge_checkpoint
from hybridrl.trainer.main_ppo import run_ppo
from hybridrl.workers.checkpoint import CheckpointError, read_full_model_state

pytestmark = pytest.mark.slow

LORA = ["actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=16",
        "actor_rollout_ref.actor.optim.lr=1e-2", "trainer.backend=local", "trainer.n_gpus_per_node=1"]


def lora_run(arithmetic_data, model_dir, run_dir, *extra):
    return run_ppo(ppo_config(*tiny_run_overrides(arithmetic_data, model_dir, run_dir), *LORA, *extra))


# PEFT's own PeftModel, built here only to read our adapters independently, reads transformers' deprecated
# `is_gradient_checkpointing`; hybridrl never builds one, so a run does not print it
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_grpo_with_lora_checkpoints_adapters_resumes_exactly_and_merges(arithmetic_data, tiny_model_dir, tmp_path):
    full = lora_run(arithmetic_data, tiny_model_dir, tmp_path / "full", "trainer.total_training_steps=3",
                    "trainer.save_freq=2")
    gaps = [m["rollout/log_prob_diff_max"] for m in full]
    assert max(gaps) <= 1e-5, gaps  # the rollout generates with the adapters merged in, on time
    assert full[-1]["actor/kl_loss"] > 0  # the reference (the base, adapters off) differs from the policy

    actor = tmp_path / "full" / "global_step_2" / "actor"
    saved = read_full_model_state(actor)
    assert saved and all(".lora_A." in k or ".lora_B." in k for k in saved)  # no base weight in a checkpoint
    assert json.loads((actor / "hybridrl_checkpoint.json").read_text())["lora"] == {
        "base_model_path": str(tiny_model_dir)}

    split = tmp_path / "split"
    lora_run(arithmetic_data, tiny_model_dir, split, "trainer.total_training_steps=2", "trainer.save_freq=2")
    resumed = lora_run(arithmetic_data, tiny_model_dir, split, "trainer.total_training_steps=3",
                       "trainer.save_freq=2")
    assert [m["training/global_step"] for m in resumed] == [3]
    for key in DETERMINISTIC:
        assert resumed[0][key] == full[2][key], key

    # a full fine-tune cannot silently resume from adapters
    with pytest.raises(CheckpointError, match="holds LoRA adapters.*lora_rank"):
        run_ppo(ppo_config(*tiny_run_overrides(arithmetic_data, tiny_model_dir, split), "trainer.backend=local",
                           "trainer.n_gpus_per_node=1", "trainer.total_training_steps=4"))

    target = merge_checkpoint(tmp_path / "full" / "global_step_3" / "actor", tmp_path / "merged")
    merged = AutoModelForCausalLM.from_pretrained(target).eval()
    from peft import PeftModel  # PEFT's own reading of the adapter directory, independent of hybridrl's

    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                                        str(target / "lora_adapter")).eval()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    ids = torch.tensor([[11, 42, 7, 99, 23, 5]])
    with torch.no_grad():
        merged_logits, adapted_logits = merged(input_ids=ids).logits, adapted(input_ids=ids).logits
        assert not torch.allclose(merged_logits, base(input_ids=ids).logits, atol=1e-3)  # it trained
        torch.testing.assert_close(merged_logits, adapted_logits, atol=1e-5, rtol=0)
        greedy = {"max_new_tokens": 12, "do_sample": False}
        assert torch.equal(merged.generate(ids, **greedy), adapted.generate(input_ids=ids, **greedy))


def test_a_bf16_lora_step_whose_first_pass_is_the_reference(arithmetic_data, tiny_model_dir, tmp_path):
    """One mini-batch per step: the old log-probs come from the update, so the actor's first pass is the
    reference's, with the adapters off; the adapters' bf16 gradients must still reach fp32 parameters."""
    history = lora_run(arithmetic_data, tiny_model_dir, tmp_path / "bf16", "trainer.total_training_steps=2",
                       "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                       "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
                       "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16",
                       "actor_rollout_ref.rollout.dtype=bf16")
    assert [m["training/global_step"] for m in history] == [1, 2]
    assert all(m["actor/old_log_prob_fused"] == 1.0 for m in history)  # the path under test
    assert history[0]["actor/grad_norm"] > 0 and history[-1]["actor/kl_loss"] > 0  # the adapters trained


@pytest.mark.gpu
def test_grpo_with_lora_on_the_gpu_in_bf16(arithmetic_data, tiny_model_dir, tmp_path):
    """bf16 compute (the GPU default): the frozen base in bf16, the adapters in fp32, FSDP2 over both."""
    history = lora_run(arithmetic_data, tiny_model_dir, tmp_path / "gpu", "trainer.total_training_steps=2",
                       "trainer.device=cuda")
    step = history[-1]
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "rollout/log_prob_diff_max"):
        assert torch.isfinite(torch.tensor(step[key])), key
    assert step["rollout/log_prob_diff_max"] < 1e-1  # bf16: rollout and actor round differently
    assert step["actor/kl_loss"] > 0
