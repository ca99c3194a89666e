"""The calculator task: RL rows in verl's schema and teacher conversations whose tool calls are right."""

import pyarrow.parquet as pq
import pytest

from hybridrl.data.tasks.tool_arithmetic import main, write_task
from hybridrl.tools.calculator import evaluate
from hybridrl.tools.call_parser import ParsedCall, parse_hermes


def test_teacher_conversations_call_the_calculator_with_the_problem_or_answer_by_hand(tmp_path):
    write_task(tmp_path, 400, 50, seed=3, ops=["+", "-"], digits=3, call_share=0.5)
    train = pq.read_table(tmp_path / "train.parquet").to_pylist()
    test = pq.read_table(tmp_path / "test.parquet").to_pylist()
    chats = [row["messages"] for row in pq.read_table(tmp_path / "sft.parquet").to_pylist()]
    assert len(train) == len(chats) == 400 and len(test) == 50
    held_out = {row["prompt"][0]["content"] for row in test}
    assert not held_out & {row["prompt"][0]["content"] for row in train}
    calls = 0
    for row, chat in zip(train, chats, strict=True):
        truth = row["reward_model"]["ground_truth"]
        assert row["data_source"] == "arithmetic" and chat[0] == row["prompt"][0]
        assert chat[-1] == {"role": "assistant", "content": f"<answer>{truth}</answer>"}
        if len(chat) == 4:  # user, call, tool answer, final answer
            calls += 1
            (call,) = parse_hermes(chat[1]["content"])
            assert isinstance(call, ParsedCall) and call.name == "calculator"
            assert evaluate(call.arguments["expression"]) == chat[2]["content"] == truth
            assert chat[2]["role"] == "tool"
        else:
            assert len(chat) == 2
    assert 150 < calls < 250  # about half of 400 (binomial sd 10)


def test_bad_call_share_is_refused():
    with pytest.raises(SystemExit):
        main(["--out", "/nonexistent", "--call-share", "1.5"])
