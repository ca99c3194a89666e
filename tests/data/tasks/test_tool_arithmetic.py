"""The calculator task: RL rows in verl's schema and teacher conversations whose tool calls are right."""

import pyarrow.parquet as pq
import pytest

from hybridrl.data.tasks.tool_arithmetic import main, parse_call_shares, write_task
from hybridrl.tools.builtin_tools import evaluate
from hybridrl.tools.tool_calls import ParsedCall, parse_hermes


def test_teacher_calls_the_calculator_per_operation_share_with_the_problem_or_answers_by_hand(tmp_path):
    write_task(tmp_path, 1000, 50, seed=3, call_shares={"+": 0.3, "-": 0.9})
    train = pq.read_table(tmp_path / "train.parquet").to_pylist()
    test = pq.read_table(tmp_path / "test.parquet").to_pylist()
    chats = [row["messages"] for row in pq.read_table(tmp_path / "sft.parquet").to_pylist()]
    assert len(train) == len(chats) == 1000 and len(test) == 50
    held_out = {row["prompt"][0]["content"] for row in test}
    assert not held_out & {row["prompt"][0]["content"] for row in train}
    calls = {"+": 0, "-": 0}
    for row, chat in zip(train, chats, strict=True):
        truth, info = row["reward_model"]["ground_truth"], row["extra_info"]
        assert 100 <= info["a"] <= 999 and 100 <= info["b"] <= 999
        assert str(evaluate(f"{info['a']} {info['operation']} {info['b']}")) == truth
        assert row["data_source"] == "arithmetic" and chat[0] == row["prompt"][0]
        assert chat[-1] == {"role": "assistant", "content": f"<answer>{truth}</answer>"}
        if len(chat) == 4:  # user, call, tool answer, final answer
            calls[info["operation"]] += 1
            (call,) = parse_hermes(chat[1]["content"])
            assert isinstance(call, ParsedCall) and call.name == "calculator"
            assert evaluate(call.arguments["expression"]) == chat[2]["content"] == truth
            assert chat[2]["role"] == "tool"
        else:
            assert len(chat) == 2
    per_op = {op: sum(1 for row in train if row["extra_info"]["operation"] == op) for op in calls}
    for op, share in {"+": 0.3, "-": 0.9}.items():  # within 4 binomial standard deviations
        assert abs(calls[op] - share * per_op[op]) < 4 * (per_op[op] * share * (1 - share)) ** 0.5


def test_call_shares_are_parsed_and_bad_ones_refused():
    assert parse_call_shares("+=0.3,-=0.9") == {"+": 0.3, "-": 0.9}
    for bad in ("+=1.5", "*=0.5", "+0.5", ""):
        with pytest.raises(ValueError, match="--call-shares"):
            parse_call_shares(bad)
    with pytest.raises(SystemExit):
        main(["--out", "/nonexistent", "--call-shares", "+=1.5"])
