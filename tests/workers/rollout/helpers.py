"""Helpers shared by the rollout tests: prompt batches and an independent log-prob reference."""

from __future__ import annotations

import torch

from hybridrl.data.rl_dataset import left_pad
from hybridrl.protocol import DataProto

PROMPTS = ["What is 12 + 7?", "hi", "Compute 3 * 4 please, step by step.", "a b c"]


def make_prompts(tokenizer, texts: list[str] = PROMPTS, length: int = 16, **meta_info) -> DataProto:
    """Left-padded prompts exactly as RLHFDataset builds them (its `left_pad`)."""
    rows = [left_pad(tokenizer(t)["input_ids"], length, tokenizer.pad_token_id) for t in texts]
    input_ids, attention_mask, position_ids = (torch.stack(col) for col in zip(*rows, strict=True))
    return DataProto.from_dict(
        {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids},
        meta_info=meta_info,
    )


def full_forward_log_probs(model, out: DataProto, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / T) of every response token from one forward over prompt + response."""
    prompt_len = out.batch["prompts"].shape[1]
    with torch.no_grad():
        logits = model(
            input_ids=out.batch["input_ids"],
            attention_mask=out.batch["attention_mask"],
            position_ids=out.batch["position_ids"],
        ).logits  # (rows, P+R, vocab)
    logits = logits[:, prompt_len - 1 : -1].float() / temperature  # (rows, R, vocab): predicts responses
    log_probs = torch.log_softmax(logits, dim=-1)
    return log_probs.gather(-1, out.batch["responses"][..., None]).squeeze(-1)  # (rows, R)
