"""The calculator and the sandboxed code interpreter, against values worked out by hand."""

import ast
import asyncio
import os

import pytest

from hybridrl.rewards.sandbox import SandboxLimits, sandbox_available
from hybridrl.tools.builtin_tools import CalculatorTool, SandboxCodeInterpreterTool, evaluate


@pytest.mark.parametrize("expression, value", [
    ("347 + 568", "915"),
    ("12345 * 6789", "83810205"),  # exact: 12345 * 6789 = 83,810,205
    ("(2 + 3) * -4", "-20"),
    ("7 / 2", "3.5"),
    ("8 / 2", "4"),  # an exact division stays an integer
    ("7 // 2 + 7 % 2", "4"),  # 3 + 1
    ("2 ** 10", "1024"),
])
def test_calculator_values(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize("expression, message", [
    ("__import__('os')", "unsupported element"),
    ("1 / 0", "division by zero"),
    ("2 ** 1000", "exponents must be integers of at most 64"),
    ("(10 ** 64) ** 64 ** 1", "more than 4096 bits"),
    ("3 +", "cannot parse"),
    ("", "non-empty"),
])
def test_calculator_refuses_with_the_reason(expression, message):
    with pytest.raises(ValueError, match=message):
        evaluate(expression)


def test_calculator_tool_schema_and_call():
    tool = CalculatorTool({}, None)
    assert tool.name == "calculator"
    assert tool.tool_schema.function.parameters.required == ["expression"]
    response, reward, _ = asyncio.run(tool.execute("i", {"expression": "99 * 99"}))
    assert (response.text, reward) == ("9801", 0.0)


@pytest.mark.skipif(sandbox_available(SandboxLimits(require_isolation=False)) is not None,
                    reason="the code sandbox cannot run programs on this host")
def test_code_interpreter_runs_in_the_sandbox():
    tool = SandboxCodeInterpreterTool({"type": "native", "wall_seconds": 5, "require_isolation": False}, None)
    response, _, metrics = asyncio.run(tool.execute("i", {"code": "print(sum(range(101)))"}))
    assert response.text == "5050\n" and metrics["status"] == "ok"
    response, _, metrics = asyncio.run(tool.execute("i", {"code": "raise ValueError('boom')"}))
    assert metrics["status"] == "runtime_error" and "ValueError: boom" in response.text
    assert "[status: runtime_error]" in response.text
    # the program cannot see the host's files: the sandbox hides the home directory behind an empty tmpfs
    home = os.path.expanduser("~")
    response, _, _ = asyncio.run(tool.execute("i", {"code": f"import os; print(os.listdir({home!r}))"}))
    seen = set(ast.literal_eval(response.text))  # a printed list of names
    # only what the sandbox binds back in (the interpreter, when it lives under ~) is visible
    assert seen < set(os.listdir(home)) and seen <= {".pyenv", ".local"}
    with pytest.raises(ValueError, match="not settings"):
        SandboxCodeInterpreterTool({"wall_second": 5}, None)
