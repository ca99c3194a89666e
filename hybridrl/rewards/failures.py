"""What failed in one scoring pass: counts for the step's metrics, a log line per kind, the stop rule.

A reward manager scores a batch, builds a `FailureReport` from the calls' outcomes, logs the first
failure of each kind with its traceback, and stops the run (`RewardFailureError`) when the share of
failed rows exceeds `reward_model.max_failure_share`, or at once on a fatal error. Failed rows score
0.0 (verl's prime manager's choice) and appear in the step's metrics:

- `reward/errors`: the function raised (`sys.exit` included);
- `reward/crashes`: its worker process died during the call (`os._exit`, a segfault, the OOM killer);
- `reward/timeouts`: no result within `reward_model.reward_fn_timeout` seconds;
- `reward/non_finite`: it returned NaN or +-inf;
- `reward/wrong_type`: it returned something else than a real number or a dict with a real `score`
  (None, a string, a dict without `score`; for the `batch` manager, a list of the wrong length);
- `reward/failed`: the sum of the five, `reward/rows`: the rows scored by the function,
  `reward/failure_share`: failed / rows.

All are counts per training step (summed over the step's generation rounds under
`algorithm.filter_groups`), so a step without failures logs zeros.

A batch stops as soon as its failures pass the limit: calls still running are killed and the rest never
start. It also stops when the first `max(2, reward_fn_workers)` calls to end all timed out while rows
were still waiting (`RewardPool.map`): a function that hangs on every row stops the run after one
timeout (30 s by default) instead of the `ceil((floor(max_failure_share x rows) + 1) / reward_fn_workers)`
timeouts the share needs (seven for 128 rows on 2 workers). The price: a batch whose first calls all
time out although the rest would not stops too; its error says which keys to raise.
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
from collections.abc import Mapping, Sequence
from typing import Any

from hybridrl.rewards.calls import COUNTED_FAILURES, Outcome, Status
from hybridrl.rewards.errors import RewardFailureError

logger = logging.getLogger(__name__)

# One home for these defaults: `reward_model.*` in hybridrl/workers/reward_model.py and the managers'
# constructors both read them from here.
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_MAX_FAILURE_SHARE = 0.1
# The score a failed row gets.
FAILED_SCORE = 0.0

METRIC_NAMES: dict[Status, str] = {
    Status.ERROR: "reward/errors",
    Status.CRASH: "reward/crashes",
    Status.TIMEOUT: "reward/timeouts",
    Status.NON_FINITE: "reward/non_finite",
    Status.WRONG_TYPE: "reward/wrong_type",
}
# What a failure of each kind is called in messages, and the key to look at.
_KIND_TEXT: dict[Status, str] = {
    Status.ERROR: "raised",
    Status.CRASH: "crashed its worker process",
    Status.TIMEOUT: "timed out (reward_model.reward_fn_timeout)",
    Status.NON_FINITE: "returned a non-finite score",
    Status.WRONG_TYPE: "returned a value of the wrong type",
}


@dataclasses.dataclass
class FailureReport:
    """Failures of one scoring pass over `rows` rows. `first` holds the first failing row of each kind as
    (row, outcome); `fatal` the first fatal one; `stopped` says the pass was cut short."""

    rows: int
    counts: dict[Status, int]
    first: dict[Status, tuple[int, Outcome]]
    fatal: tuple[int, Outcome] | None = None
    stopped: bool = False
    stalled: int = 0  # rows not run because every call before them had timed out

    @classmethod
    def from_outcomes(cls, outcomes: Sequence[Outcome]) -> FailureReport:
        counts = dict.fromkeys(COUNTED_FAILURES, 0)
        first: dict[Status, tuple[int, Outcome]] = {}
        fatal = None
        for row, outcome in enumerate(outcomes):
            if outcome.status in counts:
                counts[outcome.status] += 1
                first.setdefault(outcome.status, (row, outcome))
            elif outcome.status is Status.FATAL and fatal is None:
                fatal = (row, outcome)
        stalled = sum(o.status is Status.STALLED for o in outcomes)
        stopped = stalled > 0 or any(o.status is Status.SKIPPED for o in outcomes)
        return cls(len(outcomes), counts, first, fatal, stopped, stalled)

    @property
    def failed(self) -> int:
        return sum(self.counts.values())

    @property
    def share(self) -> float:
        return self.failed / self.rows if self.rows else 0.0

    def metrics(self) -> dict[str, float]:
        """Counts per kind, the total and the share (see the module docstring)."""
        out = {METRIC_NAMES[kind]: float(n) for kind, n in self.counts.items()}
        out.update({"reward/failed": float(self.failed), "reward/rows": float(self.rows),
                    "reward/failure_share": self.share})
        return out


def add_reward_metrics(metrics: dict[str, float], new: Mapping[str, float]) -> None:
    """Add one scoring pass's `FailureReport.metrics()` into a step's metrics (counts summed, share redone)."""
    for key, value in new.items():
        if key != "reward/failure_share":
            metrics[key] = metrics.get(key, 0.0) + value
    if "reward/rows" in metrics:
        rows = metrics["reward/rows"]
        metrics["reward/failure_share"] = metrics.get("reward/failed", 0.0) / rows if rows else 0.0


def describe(kind: Status, row: int, outcome: Outcome, data_sources: Sequence[str]) -> str:
    """'row 3 (data_source='gsm8k'): the reward function raised ValueError: ...' plus the traceback."""
    source = f" (data_source={data_sources[row]!r})" if row < len(data_sources) else ""
    text = f"row {row}{source}: the reward function {_KIND_TEXT[kind]}"
    if kind is Status.ERROR:
        text += f" {outcome.error}"  # "raised ValueError: ..."
    elif outcome.error:
        text += f": {outcome.error}"
    if outcome.traceback:
        text += f"\n{outcome.traceback.rstrip()}"
    return text


def log_failures(report: FailureReport, data_sources: Sequence[str], manager: str) -> None:
    """One warning per kind of failure: how many rows, and the first one with its traceback."""
    for kind, (row, outcome) in report.first.items():
        logger.warning("reward manager %r: %d of %d rows failed as %s and score %s (metric %s); first: %s",
                       manager, report.counts[kind], report.rows, kind.value, FAILED_SCORE, METRIC_NAMES[kind],
                       describe(kind, row, outcome, data_sources))


def raise_if_fatal(report: FailureReport, data_sources: Sequence[str]) -> None:
    """Re-raise a fatal error as itself (with the worker's traceback as a note) when it unpickles, else as
    a RewardFailureError with its text."""
    if report.fatal is None:
        return
    row, outcome = report.fatal
    where = describe(Status.ERROR, row, dataclasses.replace(outcome, traceback=None), data_sources)
    err: BaseException | None = None
    if outcome.exception is not None:
        try:
            err = pickle.loads(outcome.exception)
        except Exception:
            err = None
    if isinstance(err, BaseException):
        note = f"stopped the run (a RewardFunctionFatalError) at {where}\n{outcome.traceback or ''}".rstrip()
        if hasattr(err, "add_note"):  # Python >= 3.11
            err.add_note(note)
        else:  # 3.10 prints no notes: log it, and keep it where 3.11 would
            err.__notes__ = [*getattr(err, "__notes__", []), note]
            logger.error("%s", note)
        raise err
    raise RewardFailureError(f"the reward function raised a fatal error (a RewardFunctionFatalError), which stops "
                             f"the run: {where}\n{outcome.traceback or ''}".rstrip())


def raise_if_stalled(report: FailureReport, max_share: float, data_sources: Sequence[str],
                     fix_hint: str) -> None:
    """Stop the run when the pool gave up on a batch whose every call so far timed out."""
    if not report.stalled:
        return
    timeouts = report.counts[Status.TIMEOUT]
    row, outcome = report.first[Status.TIMEOUT]
    raise RewardFailureError(
        f"the reward function hangs: the first {timeouts} calls of this batch of {report.rows} rows all timed "
        f"out and none returned, so the other {report.stalled} rows were not scored (waiting for "
        f"reward_model.max_failure_share={max_share:g} of the rows to time out would have taken one "
        f"reward_model.reward_fn_timeout per reward_fn_workers rows).\n"
        f"First timeout, {describe(Status.TIMEOUT, row, outcome, data_sources)}\n"
        f"{fix_hint}If its calls are only slow, raise reward_model.reward_fn_timeout; "
        f"reward_model.max_failure_share=1.0 never stops the run (every hung row then costs a timeout)."
    )


def raise_if_over_share(report: FailureReport, max_share: float, data_sources: Sequence[str],
                        fix_hint: str) -> None:
    """Stop the run when the failed share of this pass exceeds `max_share`, naming the first failure."""
    if report.share <= max_share:
        return
    counts = ", ".join(f"{METRIC_NAMES[k].split('/')[1]}={n}" for k, n in report.counts.items() if n)
    first_kind, (row, outcome) = min(report.first.items(), key=lambda item: item[1][0])  # lowest row
    how_many = (f"at least {report.failed} of {report.rows} rows of this batch (the other calls were stopped "
                f"once the limit was passed): share >=" if report.stopped
                else f"{report.failed} of {report.rows} rows of this batch: share")
    raise RewardFailureError(
        f"the reward function failed on {how_many} {report.share:.2f} > "
        f"reward_model.max_failure_share={max_share:g} ({counts}).\n"
        f"First failure, {describe(first_kind, row, outcome, data_sources)}\n"
        f"{fix_hint}Or raise reward_model.max_failure_share (1.0 never stops) to score failed rows "
        f"{FAILED_SCORE} and go on."
    )


def zero_like(value: Any) -> Any:
    """A failed row's stand-in for an extra another row returned: False, 0, 0.0, '' or None."""
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return type(value)(0)
    if isinstance(value, str):
        return ""
    return None
