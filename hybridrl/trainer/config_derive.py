"""Settings that follow another key, filled in once on the driver before any worker starts.

A config built in Python gets the same values as one composed from `ppo_trainer.yaml`, and each name
keeps one meaning: trainer.device=auto becomes the device found, critic.rollout_n (and the actor's)
follows actor_rollout_ref.rollout.n, and data.tokenizer becomes the tokenizer_path of every model
that decodes or saves the prompts (and the reward model's input_tokenizer, when that names the actor's
model directory), so the driver and the workers load the same tokenizer.
"""

from __future__ import annotations

from hybridrl.trainer.ppo_config import PPOTrainerConfig
from hybridrl.utils.device import resolve_device_type
from hybridrl.utils.typed_config import require


def fill_derived(config: PPOTrainerConfig) -> None:
    """Settings that follow another key: one meaning per name, whether the config came from YAML or Python."""
    config.trainer.device = resolve_device_type(config.trainer.device)
    n = config.actor_rollout_ref.rollout.n
    for key, node in (("actor_rollout_ref.actor", config.actor_rollout_ref.actor), ("critic", config.critic)):
        require(node.rollout_n in (None, n), f"{key}.rollout_n ({node.rollout_n}) disagrees with "
                f"actor_rollout_ref.rollout.n ({n}); leave {key}.rollout_n unset, it follows rollout.n")
    config.critic.rollout_n = n
    # data.tokenizer names the run's tokenizer: the driver tokenises prompts with it and every worker that
    # decodes or saves them loads it through its model's tokenizer_path.
    tokenizer = config.data.tokenizer
    if tokenizer is not None:
        for key, model in (("actor_rollout_ref.model", config.actor_rollout_ref.model),
                           ("critic.model", config.critic.model)):
            require(model.tokenizer_path in (None, tokenizer),
                    f"data.tokenizer={tokenizer} and {key}.tokenizer_path={model.tokenizer_path} disagree: "
                    f"prompts would be tokenised with one and decoded with the other; set only data.tokenizer")
            model.tokenizer_path = tokenizer
    # The reward model decodes the actor's ids with reward_model.model.input_tokenizer; the YAML points it
    # at the actor's model directory, which meant the actor's tokenizer: follow a tokenizer_path override.
    actor_model, reward_model = config.actor_rollout_ref.model, config.reward_model.model
    if actor_model.tokenizer_path and reward_model.input_tokenizer == actor_model.path:
        reward_model.input_tokenizer = actor_model.tokenizer_path
