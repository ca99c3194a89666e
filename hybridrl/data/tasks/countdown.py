"""Countdown (as in TinyZero): combine all given numbers with + - * / to reach a target.

    python -m hybridrl.data.tasks.countdown --out ~/data/countdown [--min-numbers 3] [--max-numbers 4]

Every target is drawn from the exact values of expressions using each number once; ground_truth is
`{"target", "numbers"}`.
"""

from __future__ import annotations

import logging
import operator
import random
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from hybridrl.data.tasks.sources import base_parser, check_sizes, make_row, write_splits
from hybridrl.rewards.scorers import InvalidExpression, evaluate, literals, parse_expression

DATA_SOURCE = "countdown"

# An expression is a number (a leaf) or (op, left, right).
Expr = int | tuple[str, "Expr", "Expr"]


@dataclass(frozen=True)
class Entry:
    expr: Expr
    tidy: bool  # every intermediate value is a non-negative integer


def _combine(x: Fraction, y: Fraction) -> list[tuple[str, Fraction, bool]]:
    """All (op, value, swapped) from x and y; `swapped` means the expression is y op x."""
    out = [("+", x + y, False), ("*", x * y, False), ("-", x - y, False), ("-", y - x, True)]
    if y != 0:
        out.append(("/", x / y, False))
    if x != 0:
        out.append(("/", y / x, True))
    return out


def reachable(numbers: Sequence[int]) -> dict[Fraction, Entry]:
    """Every value an expression using each of `numbers` exactly once can take, with one such expression."""
    n = len(numbers)
    if n == 0:
        raise ValueError("countdown needs at least one number")
    table = {1 << i: {Fraction(v): Entry(v, v >= 0)} for i, v in enumerate(numbers)}
    for mask in sorted(range(1, 1 << n), key=lambda m: bin(m).count("1")):
        if mask in table:
            continue
        values: dict[Fraction, Entry] = {}
        sub = (mask - 1) & mask
        while sub:
            rest = mask ^ sub
            if sub < rest:  # each unordered split once; _combine covers both operand orders
                for x, ex in table[sub].items():
                    for y, ey in table[rest].items():
                        for op, value, swapped in _combine(x, y):
                            expr = (op, ey.expr, ex.expr) if swapped else (op, ex.expr, ey.expr)
                            tidy = ex.tidy and ey.tidy and value >= 0 and value.denominator == 1
                            old = values.get(value)
                            if old is None or (tidy and not old.tidy):
                                values[value] = Entry(expr, tidy)
            sub = (sub - 1) & mask
        table[mask] = values
    return table[(1 << n) - 1]


def solve(numbers: Sequence[int], target: int) -> Expr | None:
    """An expression using each number exactly once that equals `target`, or None if there is none."""
    entry = reachable(numbers).get(Fraction(target))
    return None if entry is None else entry.expr


def render(expr: Expr, top: bool = True) -> str:
    """Infix text with every inner operation parenthesised, e.g. '(44 + 19) - 35'."""
    if isinstance(expr, int):
        return str(expr)
    op, left, right = expr
    text = f"{render(left, False)} {op} {render(right, False)}"
    return text if top else f"({text})"


_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}


def value_of(expr: Expr) -> Fraction:
    """The exact value of an expression tree."""
    if isinstance(expr, int):
        return Fraction(expr)
    op, left, right = expr
    return _OPS[op](value_of(left), value_of(right))


def steps(expr: Expr) -> list[str]:
    """One line per operation, innermost first: '44 + 19 = 63'."""
    if isinstance(expr, int):
        return []
    op, left, right = expr
    line = f"{value_of(left)} {op} {value_of(right)} = {value_of(expr)}"
    return steps(left) + steps(right) + [line]


def is_solution(expression: str, numbers: Sequence[int], target: int) -> bool:
    """True if `expression` uses exactly the given numbers (each once) and equals `target`, judged by the
    countdown scorer's parser (hybridrl/rewards/scorers.py), not by the solver."""
    try:
        tree = parse_expression(expression)
        return sorted(literals(tree)) == sorted(numbers) and evaluate(tree) == target
    except (InvalidExpression, ZeroDivisionError):
        return False


@dataclass(frozen=True)
class Instance:
    numbers: tuple[int, ...]
    target: int
    expr: Expr

    @property
    def solution(self) -> str:
        return render(self.expr)

    @property
    def question(self) -> str:
        return (f"Using the numbers {list(self.numbers)}, write an equation that equals {self.target}. "
                "Use +, -, * and / and every number exactly once. Reason inside <think> </think>, then "
                "give only the equation inside <answer> </answer>, e.g. <answer>(1 + 2) / 3</answer>.")

    @property
    def worked_answer(self) -> str:
        working = "\n".join(steps(self.expr))
        return f"<think>\n{working}\n</think>\n<answer>{self.solution}</answer>"


def sample_instance(rng: random.Random, min_numbers: int, max_numbers: int, max_number: int,
                    target_range: tuple[int, int]) -> Instance | None:
    """Draw numbers, then a target among the integers they can reach; None if none is in range."""
    numbers = tuple(rng.randint(1, max_number) for _ in range(rng.randint(min_numbers, max_numbers)))
    values = reachable(numbers)
    lo, hi = target_range
    targets = sorted(int(v) for v in values if v.denominator == 1 and lo <= v <= hi)
    if not targets:
        return None
    target = rng.choice(targets)
    instance = Instance(numbers, target, values[Fraction(target)].expr)
    if not is_solution(instance.solution, numbers, target):  # the solver and the scorer must agree
        raise AssertionError(f"solver produced {instance.solution!r}, not {target} from {numbers}")
    return instance


def generate(train_size: int, test_size: int, seed: int = 0, min_numbers: int = 3, max_numbers: int = 4,
             max_number: int = 99, target_range: tuple[int, int] = (1, 100)
             ) -> tuple[list[Instance], list[Instance]]:
    """Distinct (multiset of numbers, target) instances; the first `test_size` are the test split."""
    check_sizes(train_size, test_size)
    if not 2 <= min_numbers <= max_numbers <= 6:
        raise ValueError(f"need 2 <= --min-numbers <= --max-numbers <= 6, got {min_numbers}, {max_numbers}")
    rng = random.Random(seed)
    seen: set[tuple[tuple[int, ...], int]] = set()
    instances: list[Instance] = []
    attempts = 0
    while len(instances) < train_size + test_size:
        attempts += 1
        if attempts > 20 * (train_size + test_size) + 1000:
            raise ValueError("could not find enough distinct instances; widen --max-number or the target "
                             "range")
        inst = sample_instance(rng, min_numbers, max_numbers, max_number, target_range)
        if inst is None or (key := (tuple(sorted(inst.numbers)), inst.target)) in seen:
            continue
        seen.add(key)
        instances.append(inst)
    return instances[test_size:], instances[:test_size]


def to_rows(instances: Sequence[Instance], split: str) -> list[dict]:
    return [make_row(data_source=DATA_SOURCE, question=inst.question, answer=inst.worked_answer, split=split,
                     ground_truth={"target": inst.target, "numbers": list(inst.numbers)}, index=i)
            for i, inst in enumerate(instances)]


def main(argv: Sequence[str] | None = None) -> None:
    parser = base_parser(__doc__.splitlines()[0], train_size=5000, test_size=500)
    parser.add_argument("--min-numbers", type=int, default=3, help="fewest numbers per instance")
    parser.add_argument("--max-numbers", type=int, default=4, help="most numbers per instance")
    parser.add_argument("--max-number", type=int, default=99, help="numbers are drawn from 1..max-number")
    parser.add_argument("--min-target", type=int, default=1)
    parser.add_argument("--max-target", type=int, default=100)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        train, test = generate(args.train_size, args.test_size, args.seed, args.min_numbers, args.max_numbers,
                               args.max_number, (args.min_target, args.max_target))
    except ValueError as err:
        parser.error(str(err))  # usage + message, no traceback
    write_splits(args.out, to_rows(train, "train"), to_rows(test, "test"))


if __name__ == "__main__":
    main()
