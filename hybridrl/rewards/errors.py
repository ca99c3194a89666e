"""Exceptions of reward scoring: what a reward function raises to stop the run, and what the run raises.

A reward function that raises an ordinary exception fails one row: the row scores 0.0, the failure is
counted in the step's `reward/*` metrics, and the run stops only when the step's share of failed rows
exceeds `reward_model.max_failure_share`. Some errors are not about one row but about the setup (the
code sandbox cannot isolate, a verifier service is misconfigured, a data source has no scorer): scoring
the remaining rows 0.0 would train on garbage. Raise a `RewardFunctionFatalError` (or a subclass) for
those, and the run stops at the first one with that exception, whatever the failure share.
"""

from __future__ import annotations


class RewardFunctionFatalError(Exception):
    """Raised by a reward function for an error no row can recover from; stops the run at once.

    Subclass it for your own setup errors, e.g.
    `class VerifierOffline(RewardFunctionFatalError): ...`. When the function runs in a worker process
    the exception is sent back and re-raised in the driver (with the worker's traceback as a note);
    one that cannot be pickled is re-raised as a `RewardFailureError` carrying its traceback text.
    """


class RewardFailureError(RuntimeError):
    """The run stops because of the reward function: too many failed rows in one step, or a fatal error
    that could not be re-raised as itself."""
