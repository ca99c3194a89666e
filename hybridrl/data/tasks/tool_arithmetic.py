"""Arithmetic with a calculator tool: the multi-turn demo's task (hybridrl/examples/tool_agent.py).

    python -m hybridrl.data.tasks.tool_arithmetic --out ~/data/tool_arithmetic [--call-share 0.5]

writes `train.parquet` / `test.parquet` (prompts for RL, verl's schema) and `sft.parquet` (a `messages`
column of teacher conversations for a multi-turn SFT warm start). Problems are those of the quickstart's
arithmetic task (`hybridrl.data.tasks.arithmetic.generate`: operands up to `--digits` digits), asked
plainly: "What is 347 + 568? ...". The teacher answers each one of two ways, at random:

    calls the calculator:   <tool_call>{"name": "calculator", "arguments": {"expression": "347 + 568"}}</tool_call>
                            (tool) 915
                            <answer>915</answer>
    works it out by hand:   <answer>915</answer>

Both are right when the teacher writes them; a ~1M-parameter student copies the first reliably (it
copies digits twice) and gets the second mostly wrong (a multi-digit result in one step is what
tiny models cannot learn; see hybridrl/data/tasks/arithmetic.py). So after SFT the student calls the
tool about as often as the teacher did, and RL with the exact-answer reward can learn to call it more:
the behaviour exists, its share is what changes. Scoring is the arithmetic task's (`data_source=
"arithmetic"`: the last <answer> tag must hold the exact result); the tool's answers carry no tag.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Sequence
from pathlib import Path

from hybridrl.data.tasks.arithmetic import DATA_SOURCE, Problem, generate
from hybridrl.data.tasks.writer import base_parser, make_row, write_parquet, write_splits

TOOL_NAME = "calculator"


def question(problem: Problem) -> str:
    return f"What is {problem.a} {problem.op} {problem.b}? Put the result in <answer></answer>."


def tool_call_text(problem: Problem) -> str:
    arguments = {"expression": f"{problem.a} {problem.op} {problem.b}"}
    return f"<tool_call>{json.dumps({'name': TOOL_NAME, 'arguments': arguments})}</tool_call>"


def teacher_chat(problem: Problem, calls_tool: bool) -> list[dict[str, str]]:
    """The teacher's conversation: user, then either the call, the tool's answer and the answer, or the answer."""
    answer = f"<answer>{problem.result}</answer>"
    chat = [{"role": "user", "content": question(problem)}]
    if calls_tool:
        chat += [{"role": "assistant", "content": tool_call_text(problem)},
                 {"role": "tool", "content": str(problem.result)}]
    return [*chat, {"role": "assistant", "content": answer}]


def rl_rows(problems: Sequence[Problem], split: str) -> list[dict]:
    return [make_row(data_source=DATA_SOURCE, question=question(p), ground_truth=str(p.result),
                     answer=f"<answer>{p.result}</answer>", split=split, index=i,
                     extra={"operation": p.op, "a": p.a, "b": p.b})
            for i, p in enumerate(problems)]


def write_task(out: str | Path, train_size: int, test_size: int, seed: int, ops: Sequence[str], digits: int,
               call_share: float) -> None:
    if not 0.0 <= call_share <= 1.0:
        raise ValueError(f"--call-share must be in [0, 1], got {call_share}")
    train, test = generate(train_size, test_size, seed, ops, digits)
    rng = random.Random(seed + 1)
    sft = [{"messages": teacher_chat(p, rng.random() < call_share)} for p in train]
    write_splits(out, rl_rows(train, "train"), rl_rows(test, "test"))
    write_parquet(sft, Path(out).expanduser() / "sft.parquet")


def main(argv: Sequence[str] | None = None) -> None:
    parser = base_parser(__doc__.splitlines()[0], train_size=2000, test_size=200)
    parser.add_argument("--ops", default="+,-", help="comma-separated subset of +,-,*")
    parser.add_argument("--digits", type=int, default=3, help="max digits of each operand")
    parser.add_argument("--call-share", type=float, default=0.5,
                        help="share of the teacher's conversations that call the calculator")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        write_task(args.out, args.train_size, args.test_size, args.seed,
                   [op.strip() for op in args.ops.split(",") if op.strip()], args.digits, args.call_share)
    except ValueError as err:
        parser.error(str(err))


if __name__ == "__main__":
    main()
