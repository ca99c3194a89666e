"""The reward pool: order kept, workers persistent, hung or dying workers replaced with the reason and
the stack, early stop once a batch has failed, and clear errors for functions a worker cannot load."""

import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from hybridrl.rewards.failures import RewardFailureError, Status
from hybridrl.rewards.managers import load_custom_reward_function
from hybridrl.rewards.pool import RewardPool, processing_order

FIXTURE = Path(__file__).parent / "fixtures" / "faulty_reward.py"
SQUARE = load_custom_reward_function(FIXTURE, "square_or_fail")  # loaded by path, as users' files are


def score_in_pool(fn, kwargs_list, num_workers, timeout):
    """One batch on a pool made for it."""
    with RewardPool(fn, num_workers, timeout) as pool:
        return pool.map(kwargs_list)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_results_keep_input_order_and_failures_are_labelled():
    inputs = [3, "hang", 4, "boom", 5, "exit"]
    outcomes = score_in_pool(SQUARE, [{"x": x} for x in inputs], num_workers=2, timeout=1.5)
    assert [o.status for o in outcomes] == ["ok", "timeout", "ok", "error", "ok", "crash"]
    assert [o.value for o in outcomes if o.status == "ok"] == [9, 16, 25]
    assert outcomes[3].error == "ValueError: boom"
    assert 'raise ValueError("boom")' in outcomes[3].traceback  # the function's own line
    assert outcomes[5].error == "the worker process exited with exit code 3 during the call"


def test_a_hung_call_reports_where_it_hung_and_its_worker_is_replaced():
    # One worker only: after the hang is killed, the replacement must score the rest.
    outcomes = score_in_pool(SQUARE, [{"x": "hang"}, {"x": 2}, {"x": 6}], num_workers=1, timeout=1.0)
    assert [(o.status, o.value) for o in outcomes] == [("timeout", None), ("ok", 4), ("ok", 36)]
    assert outcomes[0].error == "no result within 1 s"
    assert "in square_or_fail" in outcomes[0].traceback  # faulthandler's dump of the hung stack


def test_a_segfault_is_a_crash_with_its_stack():
    (outcome,) = score_in_pool(SQUARE, [{"x": "segfault"}], num_workers=1, timeout=10.0)
    assert outcome.status == "crash" and "SIGSEGV" in outcome.error
    assert "in square_or_fail" in outcome.traceback


def test_a_function_that_closes_the_pools_connection_is_a_crash_and_its_worker_replaced():
    # not a wait for the call's timeout: the pool cannot hear from that worker again
    outcomes = score_in_pool(SQUARE, [{"x": "close"}, {"x": 3}], num_workers=1, timeout=300.0)
    assert [(o.status, o.value) for o in outcomes] == [("crash", None), ("ok", 9)]
    assert outcomes[0].error == "the worker closed its connection to the pool during the call"


def test_workers_persist_across_batches_and_close_stops_them():
    pool = RewardPool(SQUARE, num_workers=2, timeout=10.0)
    first = {o.value for o in pool.map([{"x": "pid"}] * 4)}
    second = {o.value for o in pool.map([{"x": "pid"}] * 4)}
    assert second <= first and len(first) <= 2  # the same processes served both batches
    assert os.getpid() not in first  # and none of them is this process
    os.kill(min(first), signal.SIGKILL)  # a worker killed from outside while idle is replaced...
    time.sleep(0.5)  # (...once it has died: one killed a moment before its next call gets reported as a crash)
    assert [o.value for o in pool.map([{"x": 3}] * 4)] == [9] * 4
    first |= {o.value for o in pool.map([{"x": "pid"}] * 4)}
    pool.close()
    deadline = time.monotonic() + 5
    while any(_alive(pid) for pid in first) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in first)
    with pytest.raises(RuntimeError, match="closed"):
        pool.map([{"x": 1}])


def test_max_failures_stops_the_batch_and_skips_the_rest():
    with RewardPool(SQUARE, num_workers=1, timeout=10.0) as pool:
        # one worker starts rows 0, 2, 1, 3 (processing_order): 0 and 2 fail, which passes max_failures=1
        outcomes = pool.map([{"x": "boom"}, {"x": 2}, {"x": "boom"}, {"x": 3}], max_failures=1)
        assert [o.status for o in outcomes] == ["error", "skipped", "error", "skipped"]
        assert pool.map([{"x": 2}])[0].value == 4  # the pool still works afterwards


def test_processing_order_spreads_the_first_rows_over_the_batch():
    assert processing_order(0) == []
    assert processing_order(16)[:8] == [0, 8, 4, 12, 2, 10, 6, 14]  # halves, then quarters, then eighths
    for rows in (1, 2, 3, 5, 7, 24, 100, 128):
        order = processing_order(rows)
        assert sorted(order) == list(range(rows))  # each row exactly once
    # 32 prompts x 4 samples: the first 32 rows started are one per prompt
    assert sorted(row // 4 for row in processing_order(128)[:32]) == list(range(32))


def test_a_batch_whose_first_calls_all_time_out_stops_as_hung():
    with RewardPool(SQUARE, num_workers=2, timeout=1.0) as pool:
        outcomes = pool.map([{"x": "hang"}] * 12, max_failures=6)
        statuses = [o.status for o in outcomes]
        # one timeout per worker, then the other ten rows are not run (the share would have needed seven)
        assert statuses.count(Status.TIMEOUT) == 2 and statuses.count(Status.STALLED) == 10
        assert pool.stall_limit() == 2


def test_no_stall_once_a_call_has_returned_or_when_the_batch_cannot_stop():
    with RewardPool(SQUARE, num_workers=1, timeout=1.0) as pool:
        assert pool.stall_limit() == 2  # one worker still needs two timeouts in a row
        # row 0 starts first and returns: the hangs after it count against the share only
        rows = [{"x": 2}] + [{"x": "hang"}] * 3
        assert [o.status for o in pool.map(rows, max_failures=2)] == ["ok", "timeout", "timeout", "timeout"]
        # max_failures >= rows (max_failure_share=1.0): the batch never stops, every row runs
        assert [o.status for o in pool.map([{"x": "hang"}] * 3, max_failures=3)] == ["timeout"] * 3
        # without max_failures (a batch that is not stopped early) neither
        assert [o.status for o in pool.map([{"x": "hang"}] * 2 + [{"x": 5}])] == ["timeout", "timeout", "ok"]


def test_a_value_that_cannot_travel_back_fails_its_call_only():
    outcomes = score_in_pool(SQUARE, [{"x": "lock"}, {"x": 7}], num_workers=1, timeout=10.0)
    assert outcomes[0].status == Status.WRONG_TYPE and "cannot be sent from the worker" in outcomes[0].error
    assert outcomes[1].value == 49


def test_functions_a_worker_cannot_load_are_refused_clearly(tmp_path):
    with pytest.raises(ValueError, match="cannot be sent to a worker process.*reward_fn_workers=0"):
        RewardPool(lambda x: x, num_workers=1, timeout=1.0)
    # A file that disappears after the driver loaded it: the worker's own import fails.
    copy = tmp_path / "gone.py"
    shutil.copy(FIXTURE, copy)
    fn = load_custom_reward_function(copy, "square_or_fail")
    copy.unlink()
    with pytest.raises(RewardFailureError, match=r"cannot be loaded in a worker process(.|\n)*gone.py"):
        score_in_pool(fn, [{"x": 1}], num_workers=1, timeout=5.0)


def test_bad_settings_raise():
    with pytest.raises(ValueError, match="num_workers and timeout"):
        score_in_pool(SQUARE, [{"x": 1}], num_workers=0, timeout=1.0)
