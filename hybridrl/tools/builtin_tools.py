"""The built-in tools: an exact calculator (`CalculatorTool`) and a Python interpreter that runs the model's
code in the code sandbox (`SandboxCodeInterpreterTool`)."""

from __future__ import annotations

import ast
import asyncio
import dataclasses
from typing import Any

from hybridrl.rewards.sandbox import SandboxLimits, require_sandbox, run_code
from hybridrl.rewards.scorers import evaluate as evaluate_tree
from hybridrl.tools.base_tool import BaseTool, OpenAIFunctionToolSchema, ToolResponse


def _schema(name: str, description: str, parameter: str, about: str) -> OpenAIFunctionToolSchema:
    """The schema of a function of one required string parameter."""
    parameters = {"properties": {parameter: {"type": "string", "description": about}}, "required": [parameter]}
    function = {"name": name, "description": description, "parameters": parameters}
    return OpenAIFunctionToolSchema.model_validate({"type": "function", "function": function})


MAX_LENGTH = 200  # characters of expression


def evaluate(expression: str) -> str:
    """The value of `expression` as text: an integer exactly, otherwise a float."""
    if not isinstance(expression, str) or not expression.strip():
        raise ValueError("expression must be a non-empty string")
    if len(expression) > MAX_LENGTH:
        raise ValueError(f"expression is longer than {MAX_LENGTH} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as err:
        raise ValueError(f"cannot parse {expression!r}: {err.msg}") from None
    value = evaluate_tree(tree.body)
    return str(value.numerator) if value.denominator == 1 else repr(float(value))


class CalculatorTool(BaseTool):
    """`calculator(expression)`: the exact value of numbers, parentheses and + - * / // % ** (parsed with
    `ast`, no `eval`); capped exponents keep `9 ** 9 ** 9` from hanging the rollout."""

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        return _schema("calculator", "Evaluate an arithmetic expression with + - * / // % ** and "
                       "parentheses.", "expression", "e.g. 347 + 568")

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
                      ) -> tuple[ToolResponse, float, dict]:
        return ToolResponse(text=evaluate(parameters.get("expression"))), 0.0, {}


LIMIT_KEYS = ("wall_seconds", "cpu_seconds", "address_space_bytes", "output_bytes", "require_isolation")
MAX_REPLY_CHARS = 4000  # the agent loop truncates further to multi_turn.max_tool_response_length


class SandboxCodeInterpreterTool(BaseTool):
    """`code_interpreter(code)`: the output of a fresh sandboxed process per call, with its stderr and status
    when it failed. The YAML `config:` sets the LIMIT_KEYS of SandboxLimits; a host where the sandbox cannot
    run stops the run when the tool is built."""

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None) -> None:
        super().__init__(config, tool_schema)
        unknown = sorted(set(self.config) - set(LIMIT_KEYS) - {"type"})
        if unknown:
            raise ValueError(f"code interpreter config keys {unknown} are not settings; it takes {list(LIMIT_KEYS)}")
        self.limits = dataclasses.replace(SandboxLimits(), **{k: v for k, v in self.config.items() if k in LIMIT_KEYS})
        require_sandbox(self.limits)

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        return _schema("code_interpreter", "Run a Python program and return what it prints.", "code",
                       "the Python program; print the results")

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
                      ) -> tuple[ToolResponse, float, dict]:
        code = parameters.get("code")
        if not isinstance(code, str) or not code.strip():
            raise ValueError("code must be a non-empty string")
        result = await asyncio.to_thread(run_code, code, None, self.limits)
        text = result.stdout
        if result.status != "ok":
            text += f"{result.stderr}\n[status: {result.status}]"
        metrics = {"status": result.status, "wall_time": result.wall_time}
        return ToolResponse(text=text[-MAX_REPLY_CHARS:]), 0.0, metrics
