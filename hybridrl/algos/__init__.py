"""RL algorithms as pure tensor functions, under verl's `core_algos` names.

`from verl.trainer.ppo import core_algos` translates to `from hybridrl import algos as core_algos`.
Estimators, policy losses, KL estimators and loss-aggregation modes are looked up by name in
registries that user code can add to (`register_adv_est`, `register_policy_loss`, ...).
"""

from hybridrl.algos.adv_registry import (
    ADV_ESTIMATOR_REGISTRY,
    AdvantageEstimator,
    AdvEstimatorSpec,
    compute_advantage,
    get_adv_estimator_fn,
    get_adv_estimator_spec,
    register_adv_est,
)
from hybridrl.algos.advantage import (
    compute_gae_advantage_return,
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_grpo_vectorized_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
    compute_rloo_vectorized_outcome_advantage,
)
from hybridrl.algos.aggregate import LOSS_AGG_REGISTRY, agg_loss, register_loss_agg_mode
from hybridrl.algos.bypass_loss import compute_policy_loss_bypass_mode, compute_policy_loss_reinforce
from hybridrl.algos.gdpo import compute_gdpo_outcome_advantage
from hybridrl.algos.kl import (
    KL_PENALTY_REGISTRY,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    compute_rewards,
    get_kl_controller,
    kl_penalty,
    kl_penalty_forward,
    register_kl_penalty,
)
from hybridrl.algos.optimal_baseline import (
    compute_multi_turn_optimal_token_baseline_advantage,
    compute_optimal_token_baseline_advantage,
)
from hybridrl.algos.pf_ppo import compute_pf_ppo_reweight_data
from hybridrl.algos.policy_loss import (
    POLICY_LOSS_REGISTRY,
    compute_pg_loss,
    compute_policy_loss,
    compute_policy_loss_clip_cov,
    compute_policy_loss_dro,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_kl_cov,
    compute_policy_loss_vanilla,
    get_policy_loss_fn,
    known_policy_loss_settings,
    register_policy_loss,
)
from hybridrl.algos.policy_loss_variants import (
    compute_policy_loss_cispo,
    compute_policy_loss_dppo_kl,
    compute_policy_loss_dppo_tv,
    compute_policy_loss_geo_mean,
    compute_policy_loss_importance_sampling,
    compute_policy_loss_sapo,
    compute_policy_loss_topr,
    compute_policy_loss_up,
)
from hybridrl.algos.value_loss import compute_entropy_loss, compute_value_loss

__all__ = [
    "ADV_ESTIMATOR_REGISTRY",
    "KL_PENALTY_REGISTRY",
    "LOSS_AGG_REGISTRY",
    "POLICY_LOSS_REGISTRY",
    "AdaptiveKLController",
    "AdvEstimatorSpec",
    "AdvantageEstimator",
    "FixedKLController",
    "agg_loss",
    "apply_kl_penalty",
    "compute_advantage",
    "compute_entropy_loss",
    "compute_gae_advantage_return",
    "compute_gdpo_outcome_advantage",
    "compute_gpg_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_grpo_vectorized_outcome_advantage",
    "compute_multi_turn_optimal_token_baseline_advantage",
    "compute_opo_outcome_advantage",
    "compute_optimal_token_baseline_advantage",
    "compute_pf_ppo_reweight_data",
    "compute_pg_loss",
    "compute_policy_loss",
    "compute_policy_loss_bypass_mode",
    "compute_policy_loss_cispo",
    "compute_policy_loss_clip_cov",
    "compute_policy_loss_dppo_kl",
    "compute_policy_loss_dppo_tv",
    "compute_policy_loss_dro",
    "compute_policy_loss_geo_mean",
    "compute_policy_loss_gpg",
    "compute_policy_loss_gspo",
    "compute_policy_loss_importance_sampling",
    "compute_policy_loss_kl_cov",
    "compute_policy_loss_reinforce",
    "compute_policy_loss_sapo",
    "compute_policy_loss_topr",
    "compute_policy_loss_up",
    "compute_policy_loss_vanilla",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_rewards",
    "compute_rloo_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
    "compute_value_loss",
    "get_adv_estimator_fn",
    "get_adv_estimator_spec",
    "get_kl_controller",
    "get_policy_loss_fn",
    "kl_penalty",
    "kl_penalty_forward",
    "known_policy_loss_settings",
    "register_adv_est",
    "register_kl_penalty",
    "register_loss_agg_mode",
    "register_policy_loss",
]
