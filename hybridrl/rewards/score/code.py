"""Code scorer: run the response's program against test cases in the sandbox.

`ground_truth` follows the APPS / TACO / CodeContests layout used by verl's code scorer: a dict (or its
JSON string) with `inputs` and `outputs` lists, and optionally `fn_name`.

- Without `fn_name` each case is stdin -> stdout; outputs are compared token by token (whitespace and
  line breaks do not matter).
- With `fn_name` each input is the list of positional arguments; the function (or the method of a
  `Solution` class, LeetCode style) is called and its JSON-encoded return value compared with the output.

The score is the fraction of cases passed (`continuous=True`) or 1.0 only if all pass. A sandbox that
cannot run programs here raises `SandboxUnavailableError` (with the reason and the fix) instead of
scoring: a program that never ran has not failed its tests.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from hybridrl.rewards.sandbox import SandboxLimits, SandboxResult, require_sandbox, run_many

# `default_compute_score` passes its `sandbox_limits` (reward_model.sandbox.*) to scorers that say this.
USES_SANDBOX = True

_FENCE = re.compile(r"```(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL)

_CALL_HARNESS = """

import json as _hrl_json, sys as _hrl_sys
_hrl_args = _hrl_json.loads(_hrl_sys.stdin.read())
_hrl_fn = Solution().{name} if "Solution" in globals() and hasattr(Solution, "{name}") else {name}
print(_hrl_json.dumps(_hrl_fn(*_hrl_args)))
"""


def extract_code(solution_str: str) -> str:
    """The last fenced code block, or the whole response when it has none."""
    blocks = _FENCE.findall(solution_str)
    return blocks[-1] if blocks else solution_str


def parse_tests(ground_truth: Any) -> dict:
    tests = json.loads(ground_truth) if isinstance(ground_truth, (str, bytes)) else ground_truth
    if not isinstance(tests, Mapping) or "inputs" not in tests or "outputs" not in tests:
        raise ValueError("code ground_truth must be a dict (or JSON string) with 'inputs' and 'outputs' lists")
    if len(tests["inputs"]) != len(tests["outputs"]):
        raise ValueError(f"code ground_truth has {len(tests['inputs'])} inputs but {len(tests['outputs'])} outputs")
    return dict(tests)


def _stdio_passed(result: SandboxResult, expected: Any) -> bool:
    expected = "\n".join(expected) if isinstance(expected, list) else str(expected)
    return result.status == "ok" and result.stdout.split() == expected.split()


def _call_passed(result: SandboxResult, expected: Any) -> bool:
    if result.status != "ok":
        return False
    try:
        got = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return False
    # APPS wraps some expected return values in a one-element list.
    return got == expected or [got] == expected


def run_tests(code: str, tests: Mapping, limits: SandboxLimits | None = None) -> list[bool]:
    """Pass/fail of each test case, in order."""
    # Once per process: proves programs really run (an interpreter the sandbox's uid cannot start would
    # otherwise fail every case as a runtime error) or raises SandboxUnavailableError saying why.
    require_sandbox(limits)
    fn_name = tests.get("fn_name")
    if fn_name:
        program = code + _CALL_HARNESS.format(name=fn_name)
        jobs = [(program, json.dumps(list(args))) for args in tests["inputs"]]
    else:
        jobs = [(code, "\n".join(i) if isinstance(i, list) else str(i)) for i in tests["inputs"]]
    results = run_many(jobs, limits)
    check = _call_passed if fn_name else _stdio_passed
    return [check(r, expected) for r, expected in zip(results, tests["outputs"], strict=True)]


def compute_score(
    solution_str: str,
    ground_truth: Any,
    continuous: bool = True,
    sandbox_limits: SandboxLimits | None = None,
) -> float:
    """Fraction of test cases passed (`continuous`) or 1.0/0.0 for all-or-nothing."""
    tests = parse_tests(ground_truth)
    if not tests["inputs"]:
        raise ValueError("code ground_truth has no test cases")
    passed = run_tests(extract_code(solution_str), tests, sandbox_limits)
    if continuous:
        return sum(passed) / len(passed)
    return 1.0 if all(passed) else 0.0
