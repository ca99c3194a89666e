"""Metric lists and their reduction to one number per key."""

import math

from hybridrl.utils.metric import reduce_metrics


def test_reduce_by_key_name():
    reduced = reduce_metrics({"len/max": [1, 5], "len/min": [1, 5], "len/mean": [1, 5], "plain": 3.0})
    assert reduced == {"len/max": 5, "len/min": 1, "len/mean": 3, "plain": 3.0}
    assert math.isnan(reduce_metrics({"empty": []})["empty"])
