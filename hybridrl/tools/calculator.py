"""A calculator tool: exact arithmetic on an expression the model writes, without `eval`.

The expression is parsed with `ast` and only numbers, parentheses and + - * / // % ** (with unary
signs) are evaluated; anything else (names, calls, attributes) is refused with the reason, which the
model reads as the tool's error message. Integers stay exact (`12345 * 6789` is 83810205, not a float);
`/` gives a float unless the division is exact. Exponents are capped, so `9 ** 9 ** 9` cannot hang the
rollout.
"""

from __future__ import annotations

import ast
import operator
from fractions import Fraction
from typing import Any

from hybridrl.tools.base_tool import BaseTool
from hybridrl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

MAX_EXPONENT = 64
MAX_BITS = 4096  # an operand this large ends the evaluation, so each ** stays cheap
MAX_LENGTH = 200  # characters of expression

SCHEMA = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + - * / // % ** and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 347 + 568"}},
            "required": ["expression"],
        },
    },
}

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _eval(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and (right.denominator != 1 or abs(right) > MAX_EXPONENT):
            raise ValueError(f"exponents must be integers of at most {MAX_EXPONENT} in size")
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise ValueError("division by zero")
        value = Fraction(_BINARY[type(node.op)](left, right))
        if max(value.numerator.bit_length(), value.denominator.bit_length()) > MAX_BITS:
            raise ValueError(f"an intermediate value has more than {MAX_BITS} bits")
        return value
    raise ValueError(f"unsupported element {ast.dump(node)[:60]}; use numbers, + - * / // % ** and parentheses")


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
    value = _eval(tree.body)
    return str(value.numerator) if value.denominator == 1 else repr(float(value))


class CalculatorTool(BaseTool):
    """`calculator(expression)`: the exact value of an arithmetic expression."""

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        return OpenAIFunctionToolSchema.model_validate(SCHEMA)

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
                      ) -> tuple[ToolResponse, float, dict]:
        return ToolResponse(text=evaluate(parameters.get("expression"))), 0.0, {}
