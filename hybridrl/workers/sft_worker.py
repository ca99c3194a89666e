"""The SFT worker: one SPMD rank of a supervised fine-tuning group, holding an FSDP2-sharded model. Loss:
the token mean over the global batch, L = sum mask[t+1] * -log p(x[t+1] | x[<=t]) / sum mask[t+1]; FSDP2
averages gradients over the W ranks, so each rank backpropagates (its token-loss sum / global count) x W.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import torch
import torch.nn.functional as F

from hybridrl.controller import Dispatch, Worker, register
from hybridrl.models.loading import load_causal_lm, load_tokenizer
from hybridrl.models.lora import LoRASettings, add_lora
from hybridrl.protocol import DataProto
from hybridrl.workers.checkpoint import CheckpointManager
from hybridrl.workers.config import FSDPConfig, OptimConfig, to_dataclass
from hybridrl.workers.fsdp_engine import FSDPEngine, offload_refusals, refuse_offload
from hybridrl.workers.micro_batch import make_micro_batches, reduce_over_ranks
from hybridrl.workers.sequence_parallel import SequenceParallel

SFT_KEYS = ("input_ids", "attention_mask", "position_ids", "loss_mask")


def token_losses(module: torch.nn.Module, batch: dict[str, torch.Tensor],
                 sp: SequenceParallel) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token NLL of the next token and its 0/1 mask, each (rows, width - 1): the prediction at t counts
    where loss_mask[t+1] (the assistant's tokens, unshifted) is 1."""
    ids, mask = batch["input_ids"], batch["loss_mask"][:, 1:]
    if sp.enabled:  # each rank predicts the tokens after its columns; the group joins them
        logits, places, counts = sp.forward(module, ids, batch["attention_mask"], batch["position_ids"], 0,
                                            ids.shape[1] - 1)
        nll = F.cross_entropy(logits.float().transpose(1, 2), ids[:, places + 1], reduction="none")
        nll = sp.gather_columns(nll, counts)
    else:
        logits = module(input_ids=ids, attention_mask=batch["attention_mask"], position_ids=batch["position_ids"],
                        use_cache=False).logits[:, :-1]  # (rows, width - 1, vocab)
        nll = F.cross_entropy(logits.float().transpose(1, 2), ids[:, 1:], reduction="none")  # (rows, width - 1)
    return nll, mask.to(nll.dtype)


def _trimmed(data: DataProto) -> dict[str, torch.Tensor]:
    """The SFT columns cut to the longest row, each (rows, width): right padding past it changes no loss term."""
    width = int(data.batch["attention_mask"].sum(dim=-1).max())
    return {k: data.batch[k][:, :width] for k in SFT_KEYS}


class SFTWorker(Worker):
    """Holds the model being fine-tuned; `config` is the SFT trainer's config (dict or OmegaConf node)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config
        refuse_offload(offload_refusals(to_dataclass(FSDPConfig, config.model.fsdp_config), "model", self.device.type))
        self.engine: FSDPEngine | None = None
        self.tokenizer = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self, total_training_steps: int) -> dict[str, int]:
        """Load the model, shard it and build AdamW + schedule for `total_training_steps` steps."""
        model_cfg, optim = self.config.model, self.config.optim
        torch.manual_seed(self.config.trainer.seed)
        self.tokenizer = load_tokenizer(model_cfg.partial_pretrain, trust_remote_code=model_cfg.trust_remote_code)
        if model_cfg.external_lib:  # registers a custom architecture before loading
            importlib.import_module(model_cfg.external_lib)
        model = load_causal_lm(
            model_cfg.partial_pretrain, trust_remote_code=model_cfg.trust_remote_code,
            gradient_checkpointing=model_cfg.enable_gradient_checkpointing,
        )
        lora = LoRASettings.from_sft_model(model_cfg)
        if lora.enabled:  # adapters train; the base is frozen
            model = add_lora(model, lora)
        n_params = sum(p.numel() for p in model.parameters())
        optim_config = OptimConfig(
            lr=optim.lr, betas=list(optim.betas), weight_decay=optim.weight_decay,
            lr_warmup_steps_ratio=optim.lr_warmup_steps_ratio, warmup_style=optim.lr_scheduler,
            min_lr_ratio=optim.min_lr_ratio, total_training_steps=total_training_steps,
        )
        self.engine = FSDPEngine(model, to_dataclass(FSDPConfig, model_cfg.fsdp_config), optim_config,
                                 grad_clip=optim.clip_grad,
                                 sequence_parallel_size=self.config.get("ulysses_sequence_parallel_size", 1))
        local = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel()
                    for p in self.engine.module.parameters())
        return {"params": n_params, "local_params": local}

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRIC)
    def train_batch(self, data: DataProto) -> dict[str, float]:
        """One optimizer step on this rank's rows of the global batch; returns global metrics."""
        module, sp = self.engine.module, self.engine.sequence_parallel
        module.train()
        data = sp.gather_rows(data)  # a sequence-parallel group trains on its ranks' rows together
        local_tokens = float(data.batch["loss_mask"][:, 1:].sum())
        # each row once, not once per group rank
        global_tokens = float(reduce_over_ranks([local_tokens])[0][0]) / sp.size
        if global_tokens == 0:
            raise ValueError("the batch has no assistant tokens to train on; check the loss masks / data keys")
        data_cfg = self.config.data
        dynamic = data_cfg.use_dynamic_bsz  # a token budget per pass instead of a row count
        micro = make_micro_batches(data, None if dynamic else data_cfg.micro_batch_size_per_gpu,
                                   data_cfg.max_token_len_per_gpu * sp.size if dynamic else None)
        parts = [_trimmed(mb.data) for mb in micro]
        loss_sum = 0.0
        for i, part in enumerate(parts):
            with self.engine.gradient_sync(enabled=i == len(parts) - 1):
                nll, mask = token_losses(module, part, sp)
                summed = (nll * mask).sum()
                # x world size: FSDP2 averages gradients over ranks (see the module docstring).
                (summed / global_tokens * self.world_size).backward()
            loss_sum += float(summed.detach())
        step = self.engine.clip_and_step()
        self.engine.lr_scheduler_step()
        loss = float(reduce_over_ranks([loss_sum])[0][0]) / sp.size / global_tokens
        return {"loss": loss, "num_tokens": global_tokens, **step}

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def eval_batch(self, data: DataProto) -> DataProto:
        """Per-row NLL sums on assistant tokens and token counts (per row: the driver drops rows it padded)."""
        module, sp = self.engine.module, self.engine.sequence_parallel
        module.eval()
        data = sp.gather_rows(data)
        size = self.config.data.micro_batch_size_per_gpu
        device = data.batch["input_ids"].device
        sums = torch.zeros(len(data), dtype=torch.float64, device=device)  # (rows,)
        counts = torch.zeros(len(data), dtype=torch.float64, device=device)  # (rows,)
        with torch.no_grad():
            for start in range(0, len(data), size):
                rows = slice(start, start + size)
                nll, mask = token_losses(module, _trimmed(data.select_rows(rows)), sp)
                sums[rows], counts[rows] = (nll * mask).sum(-1).double(), mask.sum(-1).double()
        module.train()
        return DataProto.from_dict({"loss_sum": sp.own_rows(sums), "num_tokens": sp.own_rows(counts)})  # (rows,)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, local_path: str, global_step: int, max_ckpt_to_keep: int | None = None,
                        hf_model: bool = False) -> str:
        """Save model, optimizer, scheduler and RNG states (+ a full HF model dir in `huggingface/`)."""
        contents = list(self.config.trainer.checkpoint.save_contents)
        if hf_model and "hf_model" not in contents:
            contents.append("hf_model")
        manager = CheckpointManager(self.engine, self.tokenizer, {"save_contents": contents},
                                    base_model_path=self.config.model.partial_pretrain)
        manager.save_checkpoint(local_path, global_step, max_ckpt_to_keep)
        return os.fspath(local_path)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path: str) -> dict[str, Any]:
        """Restore the state a `save_checkpoint` wrote (model, optimizer, scheduler, RNG)."""
        contents = [c for c in self.config.trainer.checkpoint.save_contents if c != "hf_model"]
        manager = CheckpointManager(self.engine, self.tokenizer, {"save_contents": contents},
                                    base_model_path=self.config.model.partial_pretrain)
        return manager.load_checkpoint(local_path)
