"""One guarded call of a reward function, and what its return value must look like.

`call_guarded(fn, kwargs, check)` never raises for a broken function: it returns an `Outcome` saying
whether the call gave a usable value (`ok`), raised (`error`), raised a `RewardFunctionFatalError`
(`fatal`), or returned something that is not a score (`wrong_type`, `non_finite`). The process pool
adds `timeout` and `crash` (the worker process died: `os._exit`, a segfault, the OOM killer),
`skipped` (not run because the step had already failed) and `stalled` (not run because every call of
the batch so far had timed out). The same function runs in a pool worker and,
with `reward_model.reward_fn_workers=0`, in the driver.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import pickle
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from hybridrl.rewards.errors import RewardFunctionFatalError


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


# Kinds of failure that are counted against `reward_model.max_failure_share` (FATAL stops the run at once,
# SKIPPED rows were never tried).
COUNTED_FAILURES = (Status.ERROR, Status.CRASH, Status.TIMEOUT, Status.NON_FINITE, Status.WRONG_TYPE)


@dataclasses.dataclass
class Outcome:
    """The result of one call. `value` is the checked value for `ok`; `error` a one-line reason;
    `traceback` the text of the exception's (or a hung worker's) stack when there is one; `exception` the
    pickled exception of a `fatal` outcome, when it pickles."""

    status: Status
    value: Any = None
    error: str | None = None
    traceback: str | None = None
    exception: bytes | None = None


class InvalidRewardValue(Exception):
    """A return value that is not a score; `status` says which kind (wrong type or non-finite)."""

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = status


def _real(value: Any, what: str) -> float:
    """`value` as a finite float. bool, int, float, numpy scalars and one-element tensors qualify."""
    if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__float__"):
        raise InvalidRewardValue(Status.WRONG_TYPE, f"{what} is {_describe(value)}, not a real number")
    try:
        number = float(value)
    except (TypeError, ValueError) as err:
        raise InvalidRewardValue(Status.WRONG_TYPE, f"{what} is {_describe(value)}: {err}") from None
    if not math.isfinite(number):
        raise InvalidRewardValue(Status.NON_FINITE, f"{what} is {number}")
    return number


def _describe(value: Any) -> str:
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
                                 f"scores, got {_describe(value)}")
    if len(value) != rows:
        raise InvalidRewardValue(Status.WRONG_TYPE, f"the batched reward function returned {len(value)} "
                                 f"results for {rows} responses")
    outcomes = []
    for item in value:
        try:
            outcomes.append(Outcome(Status.OK, check_score(item)))
        except InvalidRewardValue as err:
            outcomes.append(Outcome(err.status, error=str(err)))
    return outcomes


def _traceback_text(err: BaseException) -> str:
    """The exception's traceback without the frame of `call_guarded` itself."""
    return "".join(traceback.format_exception(type(err), err, err.__traceback__.tb_next if err.__traceback__ else None))


def call_guarded(fn: Callable[..., Any], kwargs: Mapping[str, Any],
                 check: Callable[[Any, Mapping[str, Any]], Any] = check_score) -> Outcome:
    """`fn(**kwargs)`, checked by `check`, as an Outcome; never raises for a broken function."""
    try:
        value = fn(**kwargs)
    except RewardFunctionFatalError as err:
        try:
            pickled = pickle.dumps(err)
        except Exception:  # a class defined in the user's file is not importable by the driver
            pickled = None
        return Outcome(Status.FATAL, error=f"{type(err).__name__}: {err}", traceback=_traceback_text(err),
                       exception=pickled)
    except (Exception, SystemExit) as err:  # sys.exit() in a scorer fails its row, never the run
        return Outcome(Status.ERROR, error=f"{type(err).__name__}: {err}", traceback=_traceback_text(err))
    try:
        return Outcome(Status.OK, check(value, kwargs))
    except InvalidRewardValue as err:
        return Outcome(err.status, error=str(err))
