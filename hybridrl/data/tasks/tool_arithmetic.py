"""Three-digit arithmetic with a calculator tool: the multi-turn demo's task (examples/tool_agent.py).

    python -m hybridrl.data.tasks.tool_arithmetic --out ~/data/tool_arithmetic [--call-shares +=0.3,-=0.9]

writes the RL splits and `sft.parquet` (teacher conversations that call the calculator or answer by hand,
per `--call-shares`: docs/agents.md). Scored as the arithmetic task.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Mapping, Sequence
from pathlib import Path

from hybridrl.data.tasks.arithmetic import DATA_SOURCE, Problem
from hybridrl.data.tasks.sources import base_parser, check_sizes, make_row, write_parquet, write_splits

TOOL_NAME = "calculator"
OPERAND_RANGE = (100, 999)  # three digits: the call's operands sit at a fixed distance from the question's
DEFAULT_CALL_SHARES = {"+": 0.3, "-": 0.9}


def question(problem: Problem) -> str:
    return f"What is {problem.a} {problem.op} {problem.b}?"


def teacher_chat(problem: Problem, calls_tool: bool) -> list[dict[str, str]]:
    """The teacher's conversation: the question, the call and the tool's answer if it calls, the answer."""
    answer = f"<answer>{problem.result}</answer>"
    chat = [{"role": "user", "content": question(problem)}]
    if calls_tool:
        call = {"name": TOOL_NAME, "arguments": {"expression": f"{problem.a} {problem.op} {problem.b}"}}
        chat += [{"role": "assistant", "content": f"<tool_call>{json.dumps(call)}</tool_call>"},
                 {"role": "tool", "content": str(problem.result)}]
    return [*chat, {"role": "assistant", "content": answer}]


def generate(train_size: int, test_size: int, seed: int,
             ops: Sequence[str]) -> tuple[list[Problem], list[Problem]]:
    """Distinct problems, held-out ones first, none in both splits; ops drawn uniformly."""
    low, high = OPERAND_RANGE
    check_sizes(train_size, test_size, available=len(ops) * (high - low + 1) ** 2)
    rng, seen, problems = random.Random(seed), set(), []
    while len(problems) < train_size + test_size:
        problem = Problem(rng.choice(list(ops)), rng.randint(low, high), rng.randint(low, high))
        if problem not in seen:
            seen.add(problem)
            problems.append(problem)
    return problems[test_size:], problems[:test_size]


def rl_rows(problems: Sequence[Problem], split: str) -> list[dict]:
    return [make_row(data_source=DATA_SOURCE, question=question(p), ground_truth=str(p.result),
                     answer=f"<answer>{p.result}</answer>", split=split, index=i,
                     extra={"operation": p.op, "a": p.a, "b": p.b})
            for i, p in enumerate(problems)]


def parse_call_shares(text: str) -> dict[str, float]:
    """'+=0.3,-=0.9' -> {'+': 0.3, '-': 0.9}; every share in [0, 1], ops among + and -."""
    shares: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        op, sep, value = item.partition("=")
        if not sep or op not in ("+", "-"):
            raise ValueError(f"--call-shares items are OP=SHARE with OP + or -, got {item!r}")
        shares[op] = float(value)
        if not 0.0 <= shares[op] <= 1.0:
            raise ValueError(f"--call-shares: the share for {op!r} must be in [0, 1], got {value}")
    if not shares:
        raise ValueError("--call-shares names no operation")
    return shares


def write_task(out: str | Path, train_size: int, test_size: int, seed: int,
               call_shares: Mapping[str, float] = DEFAULT_CALL_SHARES) -> None:
    """The RL splits and the teacher's SFT conversations (one per training problem) under `out`."""
    train, test = generate(train_size, test_size, seed, sorted(call_shares))
    rng = random.Random(seed + 1)
    sft = [{"messages": teacher_chat(p, rng.random() < call_shares[p.op])} for p in train]
    write_splits(out, rl_rows(train, "train"), rl_rows(test, "test"))
    write_parquet(sft, Path(out).expanduser() / "sft.parquet")


def main(argv: Sequence[str] | None = None) -> None:
    parser = base_parser(__doc__.splitlines()[0], train_size=20000, test_size=256)
    parser.add_argument("--call-shares", default="+=0.3,-=0.9",
                        help="per operation, the share of the teacher's conversations that call the calculator")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        write_task(args.out, args.train_size, args.test_size, args.seed, parse_call_shares(args.call_shares))
    except ValueError as err:
        parser.error(str(err))


if __name__ == "__main__":
    main()
