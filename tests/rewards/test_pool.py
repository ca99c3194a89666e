"""The timeout-safe scoring pool: order kept, hung workers replaced, errors isolated."""

import time

import pytest

from hybridrl.rewards.pool import score_in_pool


def _square_or_fail(x):
    if x == "hang":
        time.sleep(10_000)
    if x == "boom":
        raise ValueError("boom")
    return x * x


def test_results_keep_input_order_and_failures_are_labelled():
    inputs = [3, "hang", 4, "boom", 5]
    outcomes = score_in_pool(_square_or_fail, [{"x": x} for x in inputs], num_workers=2, timeout=1.5)
    assert [o.status for o in outcomes] == ["ok", "timeout", "ok", "error", "ok"]
    assert [o.value for o in outcomes if o.status == "ok"] == [9, 16, 25]
    assert outcomes[3].error == "ValueError: boom"


def test_a_hung_worker_is_replaced_so_later_samples_still_run():
    # One worker only: after the hang is killed, the replacement must score the rest.
    outcomes = score_in_pool(_square_or_fail, [{"x": "hang"}, {"x": 2}, {"x": 6}], num_workers=1, timeout=1.0)
    assert [(o.status, o.value) for o in outcomes] == [("timeout", None), ("ok", 4), ("ok", 36)]


def test_bad_settings_raise():
    with pytest.raises(ValueError, match="num_workers and timeout"):
        score_in_pool(_square_or_fail, [{"x": 1}], num_workers=0, timeout=1.0)
