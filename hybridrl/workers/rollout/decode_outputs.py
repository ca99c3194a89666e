"""The buffers both HF decoding loops fill, one column per step, and how they are finished.

`hf.HFRollout`'s eager loop (rows leave the batch as they finish) and `static_decode`'s fixed-shape loop
write the same outputs the same way: each step's sampled tokens and their log-probs into column `step`,
each row's length when it samples a stop token, and, at the end, the pad id after every row's stop.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hybridrl.workers.rollout.sampling import SamplingParams


@dataclass
class DecodeOutputs:
    responses: torch.Tensor  # (rows, R) sampled token ids; after a row's stop, overwritten by `finish`
    log_probs: torch.Tensor  # (rows, R) fp32 log-probs of the sampled tokens
    lengths: torch.Tensor  # (rows,) tokens up to and including the stop token; R if none
    stop_ids: torch.Tensor  # (S,) the ids that end a response
    pad_token_id: int

    @classmethod
    def allocate(cls, rows: int, width: int, params: SamplingParams, pad_token_id: int, token_dtype: torch.dtype,
                 device: torch.device) -> DecodeOutputs:
        return cls(
            responses=torch.full((rows, width), pad_token_id, dtype=token_dtype, device=device),
            log_probs=torch.zeros(rows, width, dtype=torch.float32, device=device),
            lengths=torch.full((rows,), width, dtype=torch.long, device=device),
            stop_ids=torch.tensor(params.stop_token_ids, dtype=token_dtype, device=device),
            pad_token_id=pad_token_id,
        )

    def record(self, rows: torch.Tensor | slice, step: int, tokens: torch.Tensor,
               token_log_probs: torch.Tensor) -> None:
        """Column `step` of output rows `rows` (indices, or `slice(None)` for all): finished rows write
        too, `finish` pads over them."""
        self.responses[rows, step] = tokens
        self.log_probs[rows, step] = token_log_probs

    def is_stop(self, tokens: torch.Tensor) -> torch.Tensor:
        """(A,) bool: which of `tokens` end their response."""
        return torch.isin(tokens, self.stop_ids)

    def finish(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """responses (rows, R) with the pad id after each row's length, lengths (rows,), log-probs (rows, R)."""
        width = self.responses.shape[1]
        after_stop = torch.arange(width, device=self.responses.device)[None, :] >= self.lengths[:, None]
        self.responses.masked_fill_(after_stop, self.pad_token_id)
        return self.responses, self.lengths, self.log_probs
