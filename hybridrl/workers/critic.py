"""The PPO critic on one rank: value estimates of response tokens, and clipped value-loss updates."""

from __future__ import annotations

import torch

from hybridrl.algos import compute_value_loss
from hybridrl.protocol import DataProto
from hybridrl.utils.torch_functional import masked_sum
from hybridrl.workers.config import CriticConfig
from hybridrl.workers.micro_batch import make_micro_batches, restore_order
from hybridrl.workers.response_pass import PromptSharingRole
from hybridrl.workers.update_loop import BatchingPlan, MetricSums, run_updates

SHARE_KEY = "critic.model.share_prompt_forward"


class PPOCritic(PromptSharingRole):
    """compute_values and update_critic over the rank's rows."""

    SHARE_KEY = SHARE_KEY
    config: CriticConfig

    def _values(self, micro: DataProto) -> torch.Tensor:
        """V(s_t) for each response token t: the value head read at the position before it, (rows, R)."""
        response_length = micro.batch["responses"].shape[-1]
        # fp32 whatever the compute dtype: returns and GAE are computed from these on the driver
        values = self.prompt_sharing.per_token(micro, lambda outputs, _: {"values": outputs[..., 0].float()})["values"]
        values = torch.nn.functional.pad(values, (0, response_length - values.shape[1]))
        return values * micro.batch["response_mask"].to(values.dtype)

    @torch.no_grad()
    def compute_values(self, data: DataProto, micro_batch_rows: int | None,
                       max_token_len: int | None) -> torch.Tensor:
        self.engine.module.eval()
        data, plan = self.group_rows(data, BatchingPlan(len(data), micro_batch_rows, max_token_len))
        micro_batches = make_micro_batches(data, plan.micro_batch_rows, plan.max_token_len,
                                           self.prompt_sharing.group_ids(data))
        values = [self._values(mb.data) for mb in micro_batches]
        return self.engine.sequence_parallel.own_rows(restore_order(values, micro_batches, len(data)))

    def update_critic(self, data: DataProto, plan: BatchingPlan) -> dict[str, list[float]]:
        self.engine.module.train()
        data, plan = self.group_rows(data, plan)
        cfg = self.config

        def micro_step(micro: DataProto, info: dict, sums: MetricSums) -> torch.Tensor:
            batch = micro.batch
            mask = batch["response_mask"]
            tokens = float(mask.sum())
            vpreds = self._values(micro)
            vf_loss, vf_clipfrac = compute_value_loss(
                vpreds, batch["returns"], batch["values"], mask, cfg.cliprange_value, cfg.loss_agg_mode, **info)
            sums.plain("vf_loss", float(vf_loss.detach()))
            sums.add("vf_clipfrac", float(vf_clipfrac), tokens)
            sums.add("vpred_mean", float(masked_sum(vpreds.detach(), mask)) / max(tokens, 1.0), tokens)
            return vf_loss

        with self.prompt_sharing.held():
            return run_updates(self.engine, data, plan, micro_step, prefix="critic",
                               group_ids_of=self.prompt_sharing.group_ids)
