"""Integer arithmetic (+, -, *) with a worked, column-by-column response: the quickstart's default task.

    python -m hybridrl.data.tasks.arithmetic --out ~/data/arithmetic [--ops +,-,*] [--digits 2] [--mul-digits 2,1]

A tiny model cannot emit the most significant digit first (it needs every carry at once), so a response
works one line per column, least significant first (Lee et al. 2023): `7+8+0=5 c1` (digits + carry in =
digit, carry out), `2-8-0=4 b1` (borrows; `38<52 so 38-52=-(52-38)` for a negative result), `7*6+0=2 c4`
per multiplier digit and then a column add of the partial products, last `<answer>85</answer>`.
"""

from __future__ import annotations

import argparse
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass

from hybridrl.data.tasks.sources import base_parser, check_sizes, make_row, write_splits

DATA_SOURCE = "arithmetic"
OPS = ("+", "-", "*")


@dataclass(frozen=True)
class Problem:
    op: str
    a: int
    b: int

    @property
    def result(self) -> int:
        return {"+": self.a + self.b, "-": self.a - self.b, "*": self.a * self.b}[self.op]

    @property
    def question(self) -> str:
        return f"Compute {self.a} {self.op} {self.b} column by column; put the result in <answer></answer>."


def _digits(n: int, width: int) -> list[int]:
    """Digits of n >= 0, least significant first, zero-padded to `width`."""
    return [(n // 10**i) % 10 for i in range(width)]


def _width(*numbers: int) -> int:
    return max(len(str(n)) for n in numbers)


def column_add(addends: Sequence[int]) -> list[str]:
    """Lines 'd1+d2+...+carry=digit cCARRY', least significant column first."""
    width = _width(*addends)
    columns = [_digits(n, width) for n in addends]
    lines, carry = [], 0
    for i in range(width):
        column = [digits[i] for digits in columns]
        total = sum(column) + carry
        lines.append("+".join(map(str, column)) + f"+{carry}={total % 10} c{total // 10}")
        carry = total // 10
    return lines


def column_subtract(a: int, b: int) -> list[str]:
    """Lines 'a_i-b_i-borrow=digit bBORROW' for a >= b >= 0, least significant column first."""
    width = _width(a, b)
    lines, borrow = [], 0
    for da, db in zip(_digits(a, width), _digits(b, width), strict=True):
        diff = da - db - borrow
        lines.append(f"{da}-{db}-{borrow}={diff % 10} b{int(diff < 0)}")
        borrow = int(diff < 0)
    return lines


def multiply_by_digit(a: int, m: int) -> list[str]:
    """Lines 'a_i*m+carry=digit cCARRY' for a >= 0 and one digit m."""
    lines, carry = [], 0
    for da in _digits(a, _width(a)):
        total = da * m + carry
        lines.append(f"{da}*{m}+{carry}={total % 10} c{total // 10}")
        carry = total // 10
    return lines


def worked_steps(problem: Problem) -> list[str]:
    """The worked lines before the answer tag (see the module docstring for the format)."""
    a, b = problem.a, problem.b
    if problem.op == "+":
        return column_add([a, b])
    if problem.op == "-":
        if a >= b:
            return column_subtract(a, b)
        return [f"{a}<{b} so {a}-{b}=-({b}-{a})", *column_subtract(b, a)]
    if b < 10:
        return multiply_by_digit(a, b)
    lines, partials = [], []
    for j, m in enumerate(_digits(b, _width(b))):
        lines += [f"{a}*{m}:", *multiply_by_digit(a, m), f"={a * m}"]
        partials.append(a * m * 10**j)
    lines.append("+".join(map(str, partials)) + ":")
    return lines + column_add(partials)


def worked_answer(problem: Problem, drop_sign: bool = False) -> str:
    """The full target response: worked lines, then `<answer>N</answer>` (|N| with `drop_sign`)."""
    result = abs(problem.result) if drop_sign else problem.result
    return "\n".join([*worked_steps(problem), f"<answer>{result}</answer>"])


def teacher_slips(problems: Sequence[Problem], rate: float, seed: int = 0) -> list[bool]:
    """Which demonstrations an imperfect teacher gets wrong: each negative result, with probability `rate`,
    loses its minus sign in the answer tag (SFT copies the slip; the exact-answer reward can remove it)."""
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"--teacher-sign-error must be a probability in [0, 1], got {rate}")
    rng = random.Random(seed)
    return [p.result < 0 and rng.random() < rate for p in problems]


def allocate(total: int, capacities: Sequence[int]) -> list[int]:
    """Split `total` as evenly as possible over bins without exceeding any bin's capacity (water-filling)."""
    counts = [0] * len(capacities)
    left = total
    while left > 0:
        open_bins = [i for i, cap in enumerate(capacities) if counts[i] < cap]
        if not open_bins:
            raise ValueError(f"cannot place {total} instances in capacities {list(capacities)}")
        share, extra = divmod(left, len(open_bins))
        for rank, i in enumerate(open_bins):
            take = min(share + (1 if rank < extra else 0), capacities[i] - counts[i])
            counts[i] += take
            left -= take
    return counts


def generate(train_size: int, test_size: int, seed: int = 0, ops: Sequence[str] = OPS, digits: int = 2,
             mul_digits: tuple[int, int] = (2, 1)) -> tuple[list[Problem], list[Problem]]:
    """Distinct problems, operands uniform in [0, 10**d - 1], with no (op, a, b) in both splits. The ops
    share each split evenly unless one has too few distinct problems; the others then take the rest."""
    unknown = [op for op in ops if op not in OPS]
    if unknown or not ops:
        raise ValueError(f"--ops must be a non-empty subset of {','.join(OPS)}; got {','.join(ops)!r}")
    if digits < 1 or min(mul_digits) < 1:
        raise ValueError(f"digit counts must be >= 1, got --digits {digits} --mul-digits {mul_digits}")
    widths = [mul_digits if op == "*" else (digits, digits) for op in ops]
    spaces = [10 ** (da + db) for da, db in widths]
    check_sizes(train_size, test_size, available=sum(spaces))
    test_counts = allocate(test_size, spaces)
    train_counts = allocate(train_size, [s - t for s, t in zip(spaces, test_counts, strict=True)])
    rng = random.Random(seed)
    train: list[Problem] = []
    test: list[Problem] = []
    for op, (_, db), space, n_test, n_train in zip(ops, widths, spaces, test_counts, train_counts,
                                                    strict=True):
        ids = rng.sample(range(space), n_test + n_train)
        problems = [Problem(op, i // 10**db, i % 10**db) for i in ids]
        test += problems[:n_test]
        train += problems[n_test:]
    rng.shuffle(train)
    rng.shuffle(test)
    return train, test


def to_rows(problems: Sequence[Problem], split: str, slips: Sequence[bool] | None = None) -> list[dict]:
    """verl-schema rows; `extra_info.answer` is the demonstration SFT learns from."""
    slips = slips or [False] * len(problems)
    return [make_row(data_source=DATA_SOURCE, question=p.question, ground_truth=str(p.result),
                     answer=worked_answer(p, drop_sign=slip), split=split, index=i,
                     extra={"operation": p.op, "a": p.a, "b": p.b})
            for i, (p, slip) in enumerate(zip(problems, slips, strict=True))]


def _parse_mul_digits(text: str) -> tuple[int, int]:
    parts = text.split(",")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"--mul-digits takes two counts like '2,1', got {text!r}")
    return int(parts[0]), int(parts[1])


def main(argv: Sequence[str] | None = None) -> None:
    parser = base_parser(__doc__.splitlines()[0], train_size=5000, test_size=500)
    parser.add_argument("--ops", default="+,-,*", help="comma-separated subset of +,-,*")
    parser.add_argument("--digits", type=int, default=2, help="max digits of each operand of + and -")
    parser.add_argument("--mul-digits", type=_parse_mul_digits, default=(2, 1),
                        help="max digits of the two factors of *")
    parser.add_argument("--teacher-sign-error", type=float, default=0.0,
                        help="share of the train split's demonstrations of negative results whose answer "
                        "drops the minus sign (an imperfect teacher for SFT; ground_truth stays exact). The "
                        "quickstart uses 0.7")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ops = [op.strip() for op in args.ops.split(",") if op.strip()]
    try:
        train, test = generate(args.train_size, args.test_size, args.seed, ops, args.digits, args.mul_digits)
        slips = teacher_slips(train, args.teacher_sign_error, args.seed)
    except ValueError as err:
        parser.error(str(err))  # usage + message, no traceback
    write_splits(args.out, to_rows(train, "train", slips), to_rows(test, "test"))


if __name__ == "__main__":
    main()
