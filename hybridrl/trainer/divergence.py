"""The divergence guard: a training step whose loss or gradient norm is not finite stops the run.

The engine already refuses to apply a non-finite gradient (`FSDPEngine.clip_and_step` skips the
optimizer step and reports `skipped_step`), but a run that only skips keeps going with rc 0, logs
NaN every step and checkpoints a model that may have been ruined by the update just before the first
NaN. An unhealthy step (`unhealthy_metrics`) is logged as a warning and never checkpointed, and more than
`max_consecutive_skipped_steps` of them in a row raise `TrainingDivergedError`, naming the metrics, the key
and the last checkpoint. The default limit is 0: without an fp16 loss scaler a non-finite gradient means
divergence or NaN data, not a routine overflow.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

logger = logging.getLogger(__name__)

LIMIT_KEY = "trainer.max_consecutive_skipped_steps"
STREAK_METRIC = "training/consecutive_skipped_steps"


class TrainingDivergedError(RuntimeError):
    """Too many training steps in a row had a non-finite loss or gradient norm."""


def unhealthy_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    """The metrics that make a step unhealthy: non-finite losses and gradient norms, skipped updates.

    Matched by name, so every role is covered: a key whose last segment ends in `loss` or is `grad_norm`
    must be finite, and `skipped_step` (the share of the step's updates the engine skipped) must be 0.
    """
    def unhealthy(key: str, value: float) -> bool:
        name = key.rsplit("/", 1)[-1]
        if name == "skipped_step":
            return value != 0
        return (name.endswith("loss") or name == "grad_norm") and not math.isfinite(value)

    return {key: value for key, value in metrics.items() if unhealthy(key, value)}


@dataclass
class DivergenceGuard:
    """Counts unhealthy steps in a row and stops the run past `max_consecutive_skipped_steps`.

    `last_checkpoint()` names the newest committed checkpoint (or None) for the error; `hint` what to change.
    """

    max_consecutive_skipped_steps: int
    last_checkpoint: Callable[[], str | None]
    hint: str
    streak: int = 0

    def __post_init__(self) -> None:
        if self.max_consecutive_skipped_steps < 0:
            raise ValueError(f"{LIMIT_KEY} must be 0 or more (0 stops at the first non-finite step), got "
                             f"{self.max_consecutive_skipped_steps}")

    def check(self, step: int, metrics: dict[str, float], log: Callable[[], None] = lambda: None) -> bool:
        """True for a healthy step; False for a tolerated unhealthy one (do not save it); past the limit, calls
        `log` (the diverged step's numbers belong in the log too) and raises. Adds `STREAK_METRIC` to
        `metrics`."""
        bad = unhealthy_metrics(metrics)
        self.streak = self.streak + 1 if bad else 0
        metrics[STREAK_METRIC] = self.streak
        if not bad:
            return True
        shown = ", ".join(f"{key}={value:.4g}" for key, value in sorted(bad.items()))
        limit = self.max_consecutive_skipped_steps
        if self.streak > limit:
            checkpoint = self.last_checkpoint()
            # the update that led here had a finite norm but may be what ruined the model: say so
            where = (f"The last checkpoint is {checkpoint}; the update just before the first non-finite step "
                     f"may already have harmed it, so compare its logged loss and entropy with earlier steps "
                     f"before resuming from it" if checkpoint else "No checkpoint was saved before it")
            log()
            raise TrainingDivergedError(
                f"training diverged at step {step}: {shown} (non-finite, so the optimizer skipped those "
                f"updates); {self.streak} such step(s) in a row, and {LIMIT_KEY}={limit} allows {limit}. "
                f"Nothing of this step was saved. {where}. {self.hint}; or raise {LIMIT_KEY} to skip such "
                f"steps and go on"
            )
        logger.warning("step %d: %s; its update was skipped and it is not checkpointed (%d of %s=%d in a row)",
                       step, shown, self.streak, LIMIT_KEY, limit)
        return False
