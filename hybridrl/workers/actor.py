"""The PPO actor on one rank: log-probs of responses, and policy updates (losses from `hybridrl.algos`,
batching from `update_loop`, sharding and optimizer steps from the engine)."""

from __future__ import annotations

from dataclasses import replace

import torch

from hybridrl.algos import agg_loss, get_policy_loss_fn, kl_penalty
from hybridrl.algos.rollout_correction import compute_policy_loss_bypass_mode
from hybridrl.protocol import DataProto
from hybridrl.utils.torch_functional import entropy_from_logits, logprobs_from_logits, masked_sum
from hybridrl.workers.config import ActorConfig
from hybridrl.workers.response_pass import PromptSharingRole
from hybridrl.workers.update_loop import BatchingPlan, MetricSums


def temperature_of(data: DataProto) -> float:
    if "temperature" not in data.meta_info:
        raise KeyError(
            "meta_info['temperature'] is missing: log-probs must use the temperature the rollout sampled "
            "with (the worker sets it from actor_rollout_ref.rollout.temperature)"
        )
    return float(data.meta_info["temperature"])


class PPOActor(PromptSharingRole):
    """compute_log_prob and update_policy for an actor or a reference policy (an engine without optimizer)."""

    SHARE_KEY = "actor_rollout_ref.model.share_prompt_forward"
    config: ActorConfig

    def _per_token(self, micro: DataProto, temperature: float, with_entropy: bool,
                   with_sum_pi_squared: bool = False) -> dict[str, torch.Tensor]:
        """The responses' `log_probs`, and when asked `entropy` and `sum_pi_squared` (sum_v pi_v^2), each (rows,
        response_length) and zero after each response's end."""
        responses = micro.batch["responses"]

        def compute(logits: torch.Tensor, places: torch.Tensor) -> dict[str, torch.Tensor]:
            logits = logits / temperature  # (rows, n, vocab) predicting the responses' tokens at `places`
            values = {"log_probs": logprobs_from_logits(logits, responses[:, places])}
            if with_entropy:
                values["entropy"] = entropy_from_logits(logits)
            if with_sum_pi_squared:
                values["sum_pi_squared"] = torch.softmax(logits.float(), dim=-1).square().sum(dim=-1)
            return values

        return self.prompt_sharing.per_token(micro, compute)

    def compute_log_prob(self, data: DataProto, micro_batch_rows: int | None, max_token_len: int | None,
                         calculate_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (rows, response_len) of `data`'s responses, in row order; entropies if asked."""
        outputs = self.compute_response_outputs(data, micro_batch_rows, max_token_len, calculate_entropy)
        return outputs["log_probs"], outputs.get("entropy")

    def compute_response_outputs(self, data: DataProto, micro_batch_rows: int | None, max_token_len: int | None,
                                 calculate_entropy: bool = False,
                                 calculate_sum_pi_squared: bool = False) -> dict[str, torch.Tensor]:
        """`log_probs` (rows, response_len) in row order, and when asked `entropy` and `sum_pi_squared`."""
        temperature = temperature_of(data)
        return self.forward_rows(data, micro_batch_rows, max_token_len, lambda micro: self._per_token(
            micro, temperature, calculate_entropy, calculate_sum_pi_squared))

    def update_policy(self, data: DataProto, plan: BatchingPlan) -> dict[str, list[float]]:
        """PPO epochs over the rank's rows, against their `old_log_probs`; per-mini-batch metrics under `actor/`."""
        return self._update(*self.group_rows(data, plan), fused=False)

    def update_policy_fused(self, data: DataProto, plan: BatchingPlan) -> tuple[dict[str, list[float]], torch.Tensor]:
        """One on-policy update whose old log-probs come from its own forward; returns the metrics and those
        log-probs (rows, response_len) in row order. With one epoch over one mini-batch no optimizer step
        precedes a row's forward, so log_prob.detach() is what a separate no-grad pass would give."""
        if plan.epochs != 1 or plan.mini_batch_rows != len(data):
            raise ValueError(
                f"old log-probs can come from the update only when it is one epoch over one mini-batch; got "
                f"{plan.epochs} epoch(s) of mini-batches of {plan.mini_batch_rows} rows over {len(data)} rows"
            )
        data, plan = self.group_rows(data, plan)
        data = data.select(deepcopy=False)
        responses = data.batch["responses"]
        # each row's own index: it survives shuffling and micro-batching
        data.batch["row_index"] = torch.arange(len(data), device=responses.device)  # (rows,)
        old_log_probs = torch.zeros_like(responses, dtype=torch.float32)  # (rows, response_len)
        metrics = self._update(data, plan, fused=True, old_log_probs_out=old_log_probs)
        return metrics, self.engine.sequence_parallel.own_rows(old_log_probs)

    def _update(self, data: DataProto, plan: BatchingPlan, fused: bool,
                old_log_probs_out: torch.Tensor | None = None) -> dict[str, list[float]]:
        temperature = temperature_of(data)
        cfg = self.config
        policy_loss = get_policy_loss_fn(cfg.policy_loss.loss_mode)
        # bypass mode's rollout correction (algorithm.rollout_correction), applied inside the loss
        bypass = data.meta_info.get("bypass_correction")

        def micro_step(micro: DataProto, info: dict, sums: MetricSums) -> torch.Tensor:
            batch = micro.batch
            mask = batch["response_mask"]
            loss_config = replace(cfg, global_batch_info=info)  # the mini-batch's totals, where losses read them
            tokens = float(mask.sum())
            per_token = self._per_token(micro, temperature, with_entropy=True)
            log_prob, entropy = per_token["log_probs"], per_token["entropy"]
            if fused:
                old_log_prob = log_prob.detach()
                old_log_probs_out[batch["row_index"]] = old_log_prob.float()
            else:
                old_log_prob = batch["old_log_probs"]
            if bypass is not None:  # old_log_prob holds the rollout's log-probs
                pg_loss, pg_metrics = compute_policy_loss_bypass_mode(
                    old_log_prob, log_prob, batch["advantages"], mask, cfg.loss_agg_mode, loss_config, bypass)
            else:  # the trainer adds `rollout_is_weights` (rows, response_len) when rollout correction is on
                pg_loss, pg_metrics = policy_loss(old_log_prob, log_prob, batch["advantages"], mask,
                                                  cfg.loss_agg_mode, loss_config, batch.get("rollout_is_weights"))
            loss = pg_loss
            if cfg.entropy_coeff != 0:
                loss = loss - cfg.entropy_coeff * agg_loss(entropy, mask, cfg.loss_agg_mode, **info)
            if cfg.use_kl_loss:
                kl = kl_penalty(log_prob, batch["ref_log_prob"], cfg.kl_loss_type)  # (rows, response_len)
                loss = loss + cfg.kl_loss_coef * agg_loss(kl, mask, cfg.loss_agg_mode, **info)
                sums.add("kl_loss", float(masked_sum(kl.detach(), mask)) / max(tokens, 1.0), tokens)
                sums.add("kl_coef", cfg.kl_loss_coef, 1.0)
            sums.plain("pg_loss", float(pg_loss.detach()))
            sums.add("entropy", float(masked_sum(entropy.detach(), mask)) / max(tokens, 1.0), tokens)
            for name, value in pg_metrics.items():
                sums.add(name, float(value), tokens)
            return loss

        return self.run_updates(data, plan, micro_step, prefix="actor")
