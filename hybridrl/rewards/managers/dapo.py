"""`dapo`: rule score plus DAPO's overlong reward shaping (Yu et al. 2025, "DAPO", Soft Overlong Punishment).

With L = max_resp_len, B = overlong_buffer.len, f = overlong_buffer.penalty_factor and a response of
n valid tokens, the added term is

    penalty = min(-(n - (L - B)) / B * f, 0)

i.e. zero up to L - B tokens, then falling linearly to -f at n = L. The penalty depends on the length
only, so a row whose reward function failed gets it too, on top of the failed row's 0.0.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hybridrl.rewards.failures import DEFAULT_MAX_FAILURE_SHARE, DEFAULT_TIMEOUT_S, Outcome
from hybridrl.rewards.managers.manager_base import DecodedRow, RewardManager
from hybridrl.rewards.managers.manager_registry import REWARD_MANAGERS
from hybridrl.utils.typed_config import to_dataclass


@dataclass
class OverlongBufferConfig:
    """`reward_model.overlong_buffer.*`: DAPO's soft overlong punishment (the one home of its defaults)."""

    enable: bool = False
    # The last `len` tokens before data.max_response_length, over which the penalty grows to -penalty_factor.
    len: int = 0
    penalty_factor: float = 0.0
    # Report the penalty per sample in the reward extras (overlong_reward, overlong).
    log: bool = False


@REWARD_MANAGERS.register("dapo")
class DAPORewardManager(RewardManager):
    def __init__(
        self,
        tokenizer: Any,
        num_examine: int = 0,
        compute_score: Callable[..., Any] | None = None,
        reward_fn_key: str = "data_source",
        max_resp_len: int | None = None,
        overlong_buffer_cfg: OverlongBufferConfig | Mapping[str, Any] | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        num_workers: int | None = None,
        max_failure_share: float = DEFAULT_MAX_FAILURE_SHARE,
    ) -> None:
        self.overlong_buffer = to_dataclass(OverlongBufferConfig, overlong_buffer_cfg)
        if self.overlong_buffer.enable:
            if max_resp_len is None:
                raise ValueError("reward_model.overlong_buffer.enable=True needs max_resp_len "
                                 "(data.max_response_length)")
            if not 0 < self.overlong_buffer.len <= max_resp_len:
                raise ValueError(f"reward_model.overlong_buffer.len={self.overlong_buffer.len} must be in "
                                 f"(0, max_resp_len={max_resp_len}]")
        self.max_resp_len = max_resp_len
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key, timeout, num_workers, max_failure_share)

    @classmethod
    def config_kwargs(cls, reward_model: Any, max_response_length: int) -> dict:
        return {
            **super().config_kwargs(reward_model, max_response_length),
            "max_resp_len": max_response_length,
            "overlong_buffer_cfg": reward_model.overlong_buffer,
        }

    def overlong_penalty(self, valid_len: int) -> float:
        buffer_len = self.overlong_buffer.len
        exceed = valid_len - (self.max_resp_len - buffer_len)
        return min(-exceed / buffer_len * self.overlong_buffer.penalty_factor, 0.0)

    def finish(self, row: DecodedRow, outcome: Outcome, score: float, extras: dict) -> tuple[float, dict]:
        extras = {**extras, "score": extras.get("score", score)}  # the unshaped score, for metrics
        if self.overlong_buffer.enable:
            penalty = self.overlong_penalty(row.valid_response_length)
            score += penalty
            if self.overlong_buffer.log:
                extras.update(overlong_reward=penalty, overlong=penalty < 0)
        return score, extras
