"""The trainer tests' digit reward, which also appends a line to `$HYBRIDRL_TEST_SCORED` for every response it scores:
a test watching that file knows a step's generation is over and its update is next."""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trainer" / "fixtures"))
from digit_reward import compute_score as digit_score  # noqa: E402


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    marker = os.environ.get("HYBRIDRL_TEST_SCORED")
    if marker:
        with open(marker, "a") as out:
            out.write("scored\n")
    return digit_score(data_source, solution_str, ground_truth, extra_info)
