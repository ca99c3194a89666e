"""The code scorer: stdin/stdout and function-call test cases run in the sandbox."""

import json
import os

import pytest

from hybridrl.rewards import default_compute_score
from hybridrl.rewards.sandbox import SandboxLimits, SandboxUnavailableError
from hybridrl.rewards.scorers import code_score, sandbox_sources

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the isolated sandbox needs root (see SANDBOX.md)")

STDIO_TESTS = {"inputs": ["1 2\n", "10 -3\n", "5 5\n"], "outputs": ["3\n", "7\n", "10\n"]}
SUM_SOLUTION = "Here is my code:\n```python\na, b = map(int, input().split())\nprint(a + b)\n```\nDone."


def test_stdio_cases_all_pass():
    assert code_score(SUM_SOLUTION, STDIO_TESTS) == 1.0
    assert default_compute_score("codecontests", SUM_SOLUTION, json.dumps(STDIO_TESTS)) == 1.0


def test_partial_credit_or_all_or_nothing():
    # a + abs(b) is right when b >= 0 ("1 2" -> 3, "5 5" -> 10) and wrong for "10 -3" (13, not 7): 2 of 3.
    wrong = "```python\na, b = map(int, input().split())\nprint(a + abs(b))\n```"
    assert code_score(wrong, STDIO_TESTS) == pytest.approx(2 / 3)
    assert code_score(wrong, STDIO_TESTS, continuous=False) == 0.0


def test_function_call_cases_including_solution_class():
    tests = {"fn_name": "add", "inputs": [[1, 2], [[1], [2, 3]]], "outputs": [3, [[1, 2, 3]]]}
    plain = "```python\ndef add(a, b):\n    return a + b\n```"
    assert code_score(plain, tests) == 1.0  # 1+2 = 3; [1]+[2,3] = [1,2,3] (APPS list-wrapped)
    leetcode = "```python\nclass Solution:\n    def add(self, a, b):\n        return a + b\n```"
    assert code_score(leetcode, tests) == 1.0


def test_crashing_or_hanging_code_fails_its_cases():
    assert code_score("```python\nraise ValueError\n```", STDIO_TESTS) == 0.0
    limits = SandboxLimits(wall_seconds=1, cpu_seconds=1)
    assert code_score("```python\nwhile True: pass\n```", {"inputs": ["1"], "outputs": ["1"]},
                              sandbox_limits=limits) == 0.0


def test_no_code_fence_uses_the_whole_response_and_bad_tests_are_named():
    assert code_score("print(int(input()) * 2)", {"inputs": ["4"], "outputs": ["8"]}) == 1.0
    with pytest.raises(ValueError, match="'inputs' and 'outputs'"):
        code_score("print(1)", {"inputs": ["1"]})


def test_a_sandbox_that_cannot_run_programs_raises_instead_of_scoring_zero():
    broken = SandboxLimits(python="/nonexistent/bin/python3")
    with pytest.raises(SandboxUnavailableError, match="/nonexistent/bin/python3"):
        code_score(SUM_SOLUTION, STDIO_TESTS, sandbox_limits=broken)
    # default_compute_score hands the limits to the sandboxed scorer, and only to it.
    with pytest.raises(SandboxUnavailableError):
        default_compute_score("codecontests", SUM_SOLUTION, json.dumps(STDIO_TESTS), sandbox_limits=broken)
    assert default_compute_score("arithmetic", "<answer>85</answer>", "85", sandbox_limits=broken) == 1.0


def test_sources_that_need_the_sandbox():
    assert sandbox_sources(["arithmetic", "apps", "codecontests", "apps", "no-such-source", "aime24"]) == \
        ["apps", "codecontests"]


def test_the_opt_in_key_reaches_the_limits():
    import sys
    from pathlib import Path

    from omegaconf import OmegaConf

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trainer"))
    from ppo_helpers import ppo_config

    default = OmegaConf.to_object(ppo_config().reward_model.sandbox).limits()
    opted_in = OmegaConf.to_object(ppo_config("reward_model.sandbox.require_isolation=false").reward_model.sandbox)
    assert default == SandboxLimits() and default.require_isolation
    assert opted_in.limits() == SandboxLimits(require_isolation=False)
