"""PromptSharing reads whether the model recomputes its layers in backward, without the deprecated property."""

import warnings

import pytest

from hybridrl.models.loading import load_causal_lm
from hybridrl.workers.response_pass import PromptSharing, activation_checkpointing_on


@pytest.mark.parametrize("checkpointing", [False, True])
def test_an_update_holds_packed_attention_exactly_when_layers_are_recomputed(tiny_model_dir, checkpointing):
    model = load_causal_lm(tiny_model_dir, gradient_checkpointing=checkpointing)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # transformers' FutureWarning for is_gradient_checkpointing
        assert activation_checkpointing_on(model) is checkpointing
        sharing = PromptSharing(model, asked=True, share_key="actor_rollout_ref.model.share_prompt_forward")
    assert sharing.enabled and sharing.hold_packed is checkpointing
