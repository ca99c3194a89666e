"""Rollout-shaped batches built by hand: left-padded prompts and right-padded responses of varied length."""

from __future__ import annotations

import torch

from hybridrl.protocol import DataProto


def rollout_batch(rows: int = 8, prompt_len: int = 10, response_len: int = 12, seed: int = 0,
                  vocab: int = 300, group_size: int = 1) -> DataProto:
    """`group_size` consecutive rows share a prompt (the first row's), as rollout.n samples do."""
    g = torch.Generator().manual_seed(seed)
    prompt_lengths = torch.randint(3, prompt_len + 1, (rows,), generator=g)
    response_lengths = torch.randint(1, response_len + 1, (rows,), generator=g)
    prompts = torch.zeros(rows, prompt_len, dtype=torch.long)
    responses = torch.zeros(rows, response_len, dtype=torch.long)
    prompt_mask = torch.zeros(rows, prompt_len, dtype=torch.long)
    response_mask = torch.zeros(rows, response_len, dtype=torch.long)
    for i in range(rows):
        p, r = int(prompt_lengths[i]), int(response_lengths[i])
        prompts[i, prompt_len - p:] = torch.randint(4, vocab, (p,), generator=g)
        prompt_mask[i, prompt_len - p:] = 1
        responses[i, :r] = torch.randint(4, vocab, (r,), generator=g)
        response_mask[i, :r] = 1
    first = torch.arange(rows) // group_size * group_size  # the row whose prompt each row repeats
    prompts, prompt_mask = prompts[first], prompt_mask[first]
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    scores = torch.randn(rows, generator=g)
    return DataProto.from_dict(
        {
            "prompts": prompts, "responses": responses, "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention_mask, "position_ids": position_ids, "response_mask": response_mask,
            "advantages": scores[:, None] * response_mask,  # (rows, response_len)
            "old_log_probs": -torch.rand(rows, response_len, generator=g) * 3 * response_mask,
            "ref_log_prob": -torch.rand(rows, response_len, generator=g) * 3 * response_mask,
        },
        meta_info={"temperature": 0.7},
    )


def reference_log_probs(model: torch.nn.Module, data: DataProto, temperature: float) -> torch.Tensor:
    """The definition: one unsharded forward over the full padded rows, log-softmax, gather."""
    with torch.no_grad():
        logits = model(input_ids=data.batch["input_ids"], attention_mask=data.batch["attention_mask"],
                       position_ids=data.batch["position_ids"]).logits / temperature
    response_len = data.batch["responses"].shape[1]
    logits = logits[:, -response_len - 1:-1]  # position t predicts token t + 1
    log_probs = torch.log_softmax(logits.float(), dim=-1).gather(-1, data.batch["responses"][..., None])[..., 0]
    return log_probs * data.batch["response_mask"]
