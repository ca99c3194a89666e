"""The PPO critic on one rank: value estimates of response tokens, and clipped value-loss updates."""

from __future__ import annotations

import torch

from hybridrl.algos import compute_value_loss
from hybridrl.protocol import DataProto
from hybridrl.utils.torch_functional import masked_sum
from hybridrl.workers.config import CriticConfig
from hybridrl.workers.response_pass import PromptSharingRole
from hybridrl.workers.update_loop import BatchingPlan, MetricSums

SHARE_KEY = "critic.model.share_prompt_forward"


class PPOCritic(PromptSharingRole):
    """compute_values and update_critic over the rank's rows."""

    SHARE_KEY = SHARE_KEY
    config: CriticConfig

    def _values(self, micro: DataProto) -> dict[str, torch.Tensor]:
        """`values`: V(s_t) for each response token t, the value head read at the position before it, (rows, R)."""
        # fp32 whatever the compute dtype: returns and GAE are computed from these on the driver
        return self.prompt_sharing.per_token(micro, lambda outputs, _: {"values": outputs[..., 0].float()})

    def compute_values(self, data: DataProto, micro_batch_rows: int | None,
                       max_token_len: int | None) -> torch.Tensor:
        return self.forward_rows(data, micro_batch_rows, max_token_len, self._values)["values"]

    def update_critic(self, data: DataProto, plan: BatchingPlan) -> dict[str, list[float]]:
        data, plan = self.group_rows(data, plan)
        cfg = self.config

        def micro_step(micro: DataProto, info: dict, sums: MetricSums) -> torch.Tensor:
            batch = micro.batch
            mask = batch["response_mask"]
            tokens = float(mask.sum())
            vpreds = self._values(micro)["values"]
            vf_loss, vf_clipfrac = compute_value_loss(
                vpreds, batch["returns"], batch["values"], mask, cfg.cliprange_value, cfg.loss_agg_mode, **info)
            sums.plain("vf_loss", float(vf_loss.detach()))
            sums.add("vf_clipfrac", float(vf_clipfrac), tokens)
            sums.add("vpred_mean", float(masked_sum(vpreds.detach(), mask)) / max(tokens, 1.0), tokens)
            return vf_loss

        return self.run_updates(data, plan, micro_step, prefix="critic")
