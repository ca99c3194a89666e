"""Reward function failures: the exceptions that stop a run, one guarded call's `Outcome`, and what failed
in one scoring pass (its `reward/*` metrics, log lines and stop rule: docs/rewards.md)."""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import logging
import math
import pickle
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

logger = logging.getLogger(__name__)


class RewardFunctionFatalError(Exception):
    """Raised by a reward function for a setup error that would fail every row (a sandbox that cannot
    isolate); stops the run at once, where any other exception fails one row."""


class RewardFailureError(RuntimeError):
    """The run stops because of the reward function: too many failed rows in one step, or a fatal error
    that could not be re-raised as itself."""


class Status(str, enum.Enum):
    OK = "ok"
    ERROR = "error"  # the function raised (sys.exit included)
    CRASH = "crash"  # the worker process died during the call
    TIMEOUT = "timeout"  # no result within the per-call timeout; the worker was killed
    NON_FINITE = "non_finite"  # NaN or +-inf
    WRONG_TYPE = "wrong_type"  # not a real number / a dict with a real 'score' / a list of the right length
    FATAL = "fatal"  # a RewardFunctionFatalError: stops the run
    SKIPPED = "skipped"  # not run: the step had already failed
    STALLED = "stalled"  # not run: every call of the batch so far timed out (the function hangs on every row)


# the kinds counted against `reward_model.max_failure_share`: their metric, and what the reward function did
_KINDS: dict[Status, tuple[str, str]] = {
    Status.ERROR: ("reward/errors", "raised"),
    Status.CRASH: ("reward/crashes", "crashed its worker process"),
    Status.TIMEOUT: ("reward/timeouts", "timed out (reward_model.reward_fn_timeout)"),
    Status.NON_FINITE: ("reward/non_finite", "returned a non-finite score"),
    Status.WRONG_TYPE: ("reward/wrong_type", "returned a value of the wrong type"),
}
COUNTED_FAILURES = tuple(_KINDS)
METRIC_NAMES = {kind: metric for kind, (metric, _) in _KINDS.items()}


@dataclasses.dataclass
class Outcome:
    """One call's result: `value` checked when ok, else a one-line `error`, the stack text when there is
    one, and a fatal outcome's pickled `exception` when it pickles."""

    status: Status
    value: Any = None
    error: str | None = None
    traceback: str | None = None
    exception: bytes | None = None


class InvalidRewardValue(Exception):
    """A return value that is not a score; `status`: wrong type or non-finite."""

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = status


def _real(value: Any, what: str) -> float:
    """`value` as a finite float. bool, int, float, numpy scalars and one-element tensors qualify."""
    if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__float__"):
        raise InvalidRewardValue(Status.WRONG_TYPE, f"{what} is {_describe_value(value)}, not a real number")
    try:
        number = float(value)
    except (TypeError, ValueError) as err:
        raise InvalidRewardValue(Status.WRONG_TYPE, f"{what} is {_describe_value(value)}: {err}") from None
    if not math.isfinite(number):
        raise InvalidRewardValue(Status.NON_FINITE, f"{what} is {number}")
    return number


def _describe_value(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:80]}{'...' if len(text) > 80 else ''}"


def check_score(value: Any, kwargs: Mapping[str, Any] | None = None) -> tuple[float, dict]:
    """A per-row return value -> (score, extras): a real number, or a dict with a real `score` (its other
    keys become per-sample metrics; the extras include `score`)."""
    if isinstance(value, Mapping):
        if "score" not in value:
            raise InvalidRewardValue(Status.WRONG_TYPE, f"the returned dict has no 'score' key: {sorted(value)}")
        return _real(value["score"], "the returned dict's 'score'"), dict(value)
    if value is None:
        raise InvalidRewardValue(Status.WRONG_TYPE, "the function returned None (a missing `return`?)")
    return _real(value, "the returned value"), {}


def check_batch_scores(value: Any, kwargs: Mapping[str, Any]) -> list[Outcome]:
    """A batched call's return value -> one Outcome per row (a bad item fails only its row)."""
    rows = len(kwargs["solution_strs"])
    if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__len__"):
        raise InvalidRewardValue(Status.WRONG_TYPE, f"a batched reward function must return a list of {rows} "
                                 f"scores, got {_describe_value(value)}")
    if len(value) != rows:
        raise InvalidRewardValue(Status.WRONG_TYPE, f"the batched reward function returned {len(value)} "
                                 f"results for {rows} responses")
    return [_checked(check_score, item) for item in value]


def _checked(check: Callable[..., Any], *args: Any) -> Outcome:
    """`check(*args)` as an ok Outcome, or as the wrong-type or non-finite one it found."""
    try:
        return Outcome(Status.OK, check(*args))
    except InvalidRewardValue as err:
        return Outcome(err.status, error=str(err))


def _traceback_text(err: BaseException) -> str:
    """The exception's traceback without the frame of `call_guarded` itself."""
    return "".join(traceback.format_exception(type(err), err, err.__traceback__.tb_next if err.__traceback__ else None))


def call_guarded(fn: Callable[..., Any], kwargs: Mapping[str, Any],
                 check: Callable[[Any, Mapping[str, Any]], Any] = check_score) -> Outcome:
    """`fn(**kwargs)`, checked by `check`, as an Outcome; never raises for a broken function."""
    try:
        value = fn(**kwargs)
    except RewardFunctionFatalError as err:
        pickled = None
        with contextlib.suppress(Exception):
            pickled = pickle.dumps(err)
        return Outcome(Status.FATAL, error=f"{type(err).__name__}: {err}", traceback=_traceback_text(err),
                       exception=pickled)
    except (Exception, SystemExit) as err:  # sys.exit() in a scorer fails its row, never the run
        return Outcome(Status.ERROR, error=f"{type(err).__name__}: {err}", traceback=_traceback_text(err))
    return _checked(check, value, kwargs)


# the one home of these defaults (`reward_model.*` and the managers read them)
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_MAX_FAILURE_SHARE = 0.1
FAILED_SCORE = 0.0


@dataclasses.dataclass
class FailureReport:
    """Failures of one scoring pass: the first (row, outcome) of each kind and the first fatal one."""

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
        """Counts per kind, the total and the share."""
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
    text = f"row {row}{source}: the reward function {_KINDS[kind][1]}"
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
    """Re-raise a fatal error as itself, with the worker's traceback as a note, or as a RewardFailureError."""
    if report.fatal is None:
        return
    row, outcome = report.fatal
    where = describe(Status.ERROR, row, dataclasses.replace(outcome, traceback=None), data_sources)
    err: BaseException | None = None
    if outcome.exception is not None:
        with contextlib.suppress(Exception):  # a class defined in the user's file the driver cannot import
            err = pickle.loads(outcome.exception)
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


def raise_if_over_limit(report: FailureReport, max_share: float, data_sources: Sequence[str],
                        fix_hint: str) -> None:
    """Stop the run when the pool gave up on a batch whose every call so far timed out, or when the failed
    share of this pass exceeds `max_share`; the message names the first failure."""
    if report.stalled:
        timeouts = report.counts[Status.TIMEOUT]
        row, outcome = report.first[Status.TIMEOUT]
        raise RewardFailureError(
            f"the reward function hangs: the first {timeouts} calls of this batch of {report.rows} rows all "
            f"timed out and none returned, so the other {report.stalled} rows were not scored (waiting for "
            f"reward_model.max_failure_share={max_share:g} of the rows to time out would have taken one "
            f"reward_model.reward_fn_timeout per reward_fn_workers rows).\n"
            f"First timeout, {describe(Status.TIMEOUT, row, outcome, data_sources)}\n"
            f"{fix_hint}If its calls are only slow, raise reward_model.reward_fn_timeout; "
            f"reward_model.max_failure_share=1.0 never stops the run (every hung row then costs a timeout)."
        )
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
