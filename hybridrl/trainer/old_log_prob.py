"""Where a step's old log-probs come from: a separate forward pass, or the update's own.

PPO's ratio pi_theta / pi_old needs the log-probs of the sampled tokens under the weights that were
current when the step began. verl always computes them in a no-grad pass before the update. When the
step is fully on-policy, one epoch over one mini-batch, no optimizer step happens before any row's
forward pass in the update, so that pass already computes exactly those log-probs: the separate pass
can be skipped, saving a whole forward pass over the batch.

The separate pass stays wherever something reads the old log-probs before the update, or where the
update moves the weights before the last row's forward pass. `old_log_prob_blockers` names each reason,
so a user who expected the fused path learns which key keeps it off.
"""

from __future__ import annotations

from hybridrl.algos import get_adv_estimator_spec
from hybridrl.trainer.ppo_config import PPOTrainerConfig


def old_log_prob_blockers(config: PPOTrainerConfig) -> list[str]:
    """Why this config needs the separate old log-prob pass; empty when the update can give them."""
    actor = config.actor_rollout_ref.actor
    reasons = []
    if not actor.fuse_old_log_prob:
        reasons.append("actor_rollout_ref.actor.fuse_old_log_prob=false")
    if actor.ppo_epochs != 1:
        reasons.append(f"actor_rollout_ref.actor.ppo_epochs={actor.ppo_epochs} (later epochs need the first's "
                       f"log-probs)")
    if actor.ppo_mini_batch_size != config.data.train_batch_size:
        reasons.append(f"actor_rollout_ref.actor.ppo_mini_batch_size={actor.ppo_mini_batch_size} < "
                       f"data.train_batch_size={config.data.train_batch_size} (later mini-batches see updated weights)")
    if config.algorithm.use_kl_in_reward:
        reasons.append("algorithm.use_kl_in_reward=true (the reward reads them before the update)")
    estimator = config.algorithm.adv_estimator
    if "old_log_probs" in get_adv_estimator_spec(estimator).required_inputs:
        reasons.append(f"algorithm.adv_estimator={estimator} (the advantages read them before the update)")
    correction = config.algorithm.rollout_correction
    if correction.bypass_mode:
        reasons.append("algorithm.rollout_correction.bypass_mode=true (the rollout's log-probs serve instead)")
    elif correction.enabled:
        reasons.append("algorithm.rollout_correction.rollout_is/rollout_rs (the weights and the rejection mask "
                       "read them before the update)")
    return reasons


def old_log_prob_from_update(config: PPOTrainerConfig) -> bool:
    """True when the update's forward pass gives the old log-probs (see the module docstring)."""
    return not old_log_prob_blockers(config)
