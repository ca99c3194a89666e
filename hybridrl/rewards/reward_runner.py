"""Where a reward manager's calls run: a `RewardPool` of worker processes, or this process.

`reward_model.reward_fn_workers` picks: a positive count (default: the CPUs this process may use, at
most 64) runs every call in a persistent worker process with the per-call timeout, so a hung or crashing
function costs one row, not the run. 0 runs the calls in the driver, one after another: nothing to
start and no pickling (a breakpoint in the function works), but no timeout and no protection from
`os._exit` or a segfault. The pool costs a socket round trip per row, which for the arithmetic task's
reward measured negligible against a quickstart GRPO step, so it is every manager's default. A worker starts
once per run and again after each timeout or crash.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hybridrl.rewards.calls import COUNTED_FAILURES, Outcome, Status, call_guarded
from hybridrl.rewards.pool import RewardPool, default_num_workers


class InProcessRunner:
    """Calls in this process, in order, stopping like `RewardPool.map` once the step has failed."""

    def __init__(self, fn: Callable[..., Any], check: Callable[[Any, Mapping[str, Any]], Any]) -> None:
        self.fn, self.check = fn, check

    def map(self, kwargs_list: Sequence[Mapping[str, Any]], max_failures: int | None = None) -> list[Outcome]:
        outcomes: list[Outcome] = []
        failures = 0
        for kwargs in kwargs_list:
            outcome = call_guarded(self.fn, kwargs, self.check)
            outcomes.append(outcome)
            failures += outcome.status in COUNTED_FAILURES
            if outcome.status is Status.FATAL or (max_failures is not None and failures > max_failures):
                break
        return outcomes + [Outcome(Status.SKIPPED)] * (len(kwargs_list) - len(outcomes))

    def close(self) -> None:
        pass


def make_runner(fn: Callable[..., Any], check: Callable[[Any, Mapping[str, Any]], Any], timeout: float,
                num_workers: int | None) -> RewardPool | InProcessRunner:
    """A pool of `num_workers` (None: `default_num_workers()`) processes, or the driver for 0."""
    if num_workers is not None and num_workers < 0:
        raise ValueError(f"reward_model.reward_fn_workers must be >= 0 (0 runs the reward function in the "
                         f"driver), got {num_workers}")
    if not timeout > 0:
        raise ValueError(f"reward_model.reward_fn_timeout must be positive seconds, got {timeout}")
    if num_workers == 0:
        return InProcessRunner(fn, check)
    return RewardPool(fn, num_workers or default_num_workers(), timeout, check)
