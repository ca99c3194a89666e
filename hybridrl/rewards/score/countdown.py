"""Countdown scorer (TinyZero's task): reach `target` with + - * / over the given `numbers`.

The last `<answer>...</answer>` expression is parsed with `ast` and evaluated by a small walker over
integer literals, + - * / and parentheses, in exact rational arithmetic. Nothing is passed to `eval`,
and `**` is rejected outright, so `9**9**9` costs nothing. As in TinyZero, any answer tag that is
present but wrong (bad numbers, bad syntax, division by zero, wrong value) earns `format_score`.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Mapping
from fractions import Fraction

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# Longer expressions cannot be legitimate for a handful of numbers; refuse before parsing.
_MAX_EXPR_CHARS = 512
_BINOPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,  # Fraction division; ZeroDivisionError is caught by the caller
}


class InvalidExpression(ValueError):
    """The answer is not an expression over integer literals with + - * / and parentheses."""


def extract_expression(solution_str: str) -> str | None:
    found = _ANSWER.findall(solution_str)
    return found[-1].strip() if found else None


def parse_expression(expr: str) -> ast.Expression:
    if len(expr) > _MAX_EXPR_CHARS:
        raise InvalidExpression(f"expression longer than {_MAX_EXPR_CHARS} characters")
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as err:
        raise InvalidExpression(f"not an arithmetic expression: {err.msg}") from None
    for node in ast.walk(tree):
        allowed = isinstance(node, (ast.Expression, ast.BinOp, ast.UnaryOp, ast.USub, ast.UAdd))
        allowed |= type(node) in _BINOPS
        allowed |= isinstance(node, ast.Constant) and type(node.value) is int
        if not allowed:
            raise InvalidExpression(f"{type(node).__name__} is not allowed (only + - * / and integers)")
    return tree


def literals(tree: ast.Expression) -> list[int]:
    """Integer literals in the expression (unary minus is an operator, not part of the number)."""
    return [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)]


def evaluate(node: ast.AST) -> Fraction:
    """Exact value of a tree already checked by `parse_expression`."""
    if isinstance(node, ast.Expression):
        return evaluate(node.body)
    if isinstance(node, ast.Constant):
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp):
        value = evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        return _BINOPS[type(node.op)](evaluate(node.left), evaluate(node.right))
    raise InvalidExpression(f"unexpected node {type(node).__name__}")


def uses_numbers(used: list[int], available: list[int], number_use: str) -> bool:
    """`exactly_once`: the multisets are equal; `at_most_once`: `used` is a sub-multiset."""
    if number_use == "exactly_once":
        return Counter(used) == Counter(available)
    if number_use == "at_most_once":
        return not Counter(used) - Counter(available)
    raise ValueError(f"countdown number_use must be 'exactly_once' or 'at_most_once', got {number_use!r}")


def compute_score(
    solution_str: str,
    ground_truth: Mapping,
    format_score: float = 0.1,
    score: float = 1.0,
    number_use: str = "exactly_once",
) -> float:
    """`score` if the expression uses the numbers as configured and equals `target` exactly."""
    if not isinstance(ground_truth, Mapping) or "target" not in ground_truth or "numbers" not in ground_truth:
        raise ValueError(
            f"countdown ground_truth must be a dict with 'target' and 'numbers', got {ground_truth!r}"
        )
    target = int(ground_truth["target"])
    numbers = [int(n) for n in ground_truth["numbers"]]  # parquet gives numpy arrays; normalise
    expr = extract_expression(solution_str)
    if expr is None:
        return 0.0
    try:
        tree = parse_expression(expr)
        if not uses_numbers(literals(tree), numbers, number_use):
            return format_score
        return score if evaluate(tree) == target else format_score
    except (InvalidExpression, ZeroDivisionError, RecursionError):
        return format_score
