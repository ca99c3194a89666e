"""The PPO critic on one rank: value estimates of response tokens, and clipped value-loss updates."""

from __future__ import annotations

import torch

from hybridrl.algos import compute_value_loss
from hybridrl.protocol import DataProto
from hybridrl.utils.torch_functional import masked_sum
from hybridrl.workers.config import CriticConfig
from hybridrl.workers.engine.fsdp import FSDPEngine
from hybridrl.workers.micro_batch import make_micro_batches, restore_order, trim_columns
from hybridrl.workers.update_loop import BatchingPlan, MetricSums, run_updates


class PPOCritic:
    def __init__(self, config: CriticConfig, engine: FSDPEngine) -> None:
        self.config = config
        self.engine = engine

    def _values(self, micro: DataProto) -> torch.Tensor:
        """V(s_t) for each response token t: the value head read at the position before it, (rows, R)."""
        response_length = micro.batch["responses"].shape[-1]
        trimmed = trim_columns(micro, response_length)
        output = self.engine.module(input_ids=trimmed.input_ids, attention_mask=trimmed.attention_mask,
                                    position_ids=trimmed.position_ids, use_cache=False)
        start = trimmed.response_start - 1
        # fp32 whatever the compute dtype: returns and GAE are computed from these on the driver
        values = output.logits[:, start:start + trimmed.response_kept, 0].float()  # (rows, kept)
        values = torch.nn.functional.pad(values, (0, response_length - trimmed.response_kept))
        return values * micro.batch["response_mask"].to(values.dtype)

    @torch.no_grad()
    def compute_values(self, data: DataProto, micro_batch_rows: int | None,
                       max_token_len: int | None) -> torch.Tensor:
        self.engine.module.eval()
        micro_batches = make_micro_batches(data, micro_batch_rows, max_token_len)
        return restore_order([self._values(mb.data) for mb in micro_batches], micro_batches, len(data))

    def update_critic(self, data: DataProto, plan: BatchingPlan) -> dict[str, list[float]]:
        self.engine.module.train()
        cfg = self.config

        def micro_step(micro: DataProto, info: dict, sums: MetricSums) -> torch.Tensor:
            batch = micro.batch
            mask = batch["response_mask"]
            tokens = float(mask.sum())
            vpreds = self._values(micro)
            vf_loss, vf_clipfrac = compute_value_loss(
                vpreds, batch["returns"], batch["values"], mask, cfg.cliprange_value, cfg.loss_agg_mode,
                global_batch_info=info,
            )
            sums.plain("vf_loss", float(vf_loss.detach()))
            sums.add("vf_clipfrac", float(vf_clipfrac), tokens)
            sums.add("vpred_mean", float(masked_sum(vpreds.detach(), mask)) / max(tokens, 1.0), tokens)
            return vf_loss

        return run_updates(self.engine, data, plan, micro_step, prefix="critic")
