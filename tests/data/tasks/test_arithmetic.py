"""Arithmetic task: worked format, procedure consistency, determinism, held-out honesty, CLI files."""

from __future__ import annotations

import re

import pyarrow.parquet as pq
import pytest

from hybridrl.data.tasks import arithmetic as ar
from hybridrl.rewards.scorers import arithmetic_score

_ADD = re.compile(r"^((?:\d\+)+)(\d+)=(\d) c(\d+)$")
_SUB = re.compile(r"^(\d)-(\d)-([01])=(\d) b([01])$")
_MUL = re.compile(r"^(\d)\*(\d)\+(\d)=(\d) c(\d)$")


def test_addition_format_by_hand():
    # 7+8+0 = 15 -> digit 5 carry 1; 3+4+1 = 8 -> digit 8 carry 0; answer 85
    assert ar.worked_answer(ar.Problem("+", 37, 48)) == "7+8+0=5 c1\n3+4+1=8 c0\n<answer>85</answer>"
    # 9+5=14 -> 4 c1; 9+0+1=10 -> 0 c1; final carry 1 leads: 104
    assert ar.worked_answer(ar.Problem("+", 99, 5)) == "9+5+0=4 c1\n9+0+1=0 c1\n<answer>104</answer>"


def test_subtraction_format_by_hand():
    # 38 < 52, so compute 52-38: 2-8 borrows (12-8=4), 5-3-1=1 -> -14
    assert ar.worked_answer(ar.Problem("-", 38, 52)) == (
        "38<52 so 38-52=-(52-38)\n2-8-0=4 b1\n5-3-1=1 b0\n<answer>-14</answer>"
    )


def test_multiplication_format_by_hand():
    # 7*6=42 -> 2 c4; 3*6+4=22 -> 2 c2; leading carry 2: 222
    assert ar.worked_answer(ar.Problem("*", 37, 6)) == "7*6+0=2 c4\n3*6+4=2 c2\n<answer>222</answer>"
    # 37*46 = 37*6 + 37*40 = 222 + 1480 = 1702
    text = ar.worked_answer(ar.Problem("*", 37, 46))
    assert "=222\n" in text and "=148\n" in text and "222+1480:" in text
    assert text.endswith("<answer>1702</answer>")


def _check_lines(problem: ar.Problem, lines: list[str]) -> None:
    """Every column line must be arithmetically true (an independent replay of each step)."""
    for line in lines:
        if m := _ADD.match(line):
            terms = [int(d) for d in m.group(1).rstrip("+").split("+")] + [int(m.group(2))]
            assert sum(terms) == int(m.group(3)) + 10 * int(m.group(4)), line
        elif m := _SUB.match(line):
            a, b, borrow, digit, out = map(int, m.groups())
            assert a - b - borrow == digit - 10 * out, line
        elif m := _MUL.match(line):
            a, m_, carry, digit, out = map(int, m.groups())
            assert a * m_ + carry == digit + 10 * out, line
        else:
            assert problem.op == "*" or "<" in line, f"unexpected line {line!r} for {problem}"


@pytest.mark.parametrize("digits,mul_digits", [(2, (2, 1)), (3, (2, 2))])
def test_generated_rows_are_correct_and_worked(digits, mul_digits):
    train, test = ar.generate(600, 60, seed=3, digits=digits, mul_digits=mul_digits)
    for p in train + test:
        expected = eval(f"{p.a}{p.op}{p.b}")  # Python's own arithmetic as the independent oracle
        assert p.result == expected
        text = ar.worked_answer(p)
        *lines, last = text.split("\n")
        assert last == f"<answer>{expected}</answer>"
        _check_lines(p, lines)
        assert arithmetic_score(text, str(expected)) == 1.0
        assert p.a < 10 ** (mul_digits[0] if p.op == "*" else digits)


def test_deterministic_per_seed_and_disjoint():
    a = ar.generate(500, 100, seed=7)
    assert a == ar.generate(500, 100, seed=7)
    assert a != ar.generate(500, 100, seed=8)
    train, test = a
    assert len(set(train)) == 500 and len(set(test)) == 100
    assert not set(train) & set(test)


def test_allocate_water_filling():
    # round 1: share 10//3=3, remainder 1 -> bin0 4, bin1 capped at 2, bin2 3 (9 placed, 1 left)
    # round 2: open bins 0 and 2, share 0 remainder 1 -> bin0 5
    assert ar.allocate(10, [100, 2, 100]) == [5, 2, 3]
    with pytest.raises(ValueError):
        ar.allocate(5, [1, 1])


def test_small_mul_space_is_filled_without_repeats():
    # 2-digit x 1-digit has 100*10 = 1,000 distinct products; other ops absorb the rest
    train, test = ar.generate(3000, 300, seed=0)
    muls = [p for p in train + test if p.op == "*"]
    assert len(muls) == len(set(muls)) <= 1000


def test_bad_arguments_name_the_flag():
    with pytest.raises(ValueError, match="--train-size"):
        ar.generate(200, 10, ops=["*"], mul_digits=(1, 1))  # only 10*10 = 100 distinct
    with pytest.raises(ValueError, match="--ops"):
        ar.generate(10, 10, ops=["/"])
    with pytest.raises(ValueError, match="--test-size"):
        ar.generate(10, 0)


def test_cli_writes_verl_schema(tmp_path):
    ar.main(["--out", str(tmp_path), "--train-size", "90", "--test-size", "30", "--seed", "1"])
    train = pq.read_table(tmp_path / "train.parquet").to_pylist()
    test = pq.read_table(tmp_path / "test.parquet").to_pylist()
    assert (len(train), len(test)) == (90, 30)
    row = train[0]
    assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert row["data_source"] == "arithmetic"
    assert row["prompt"] == [{"role": "user", "content": row["extra_info"]["question"]}]
    assert row["reward_model"]["style"] == "rule"
    info = row["extra_info"]
    assert info["split"] == "train" and info["index"] == 0
    assert row["reward_model"]["ground_truth"] == str(eval(f"{info['a']}{info['operation']}{info['b']}"))
    assert info["answer"].endswith(f"<answer>{row['reward_model']['ground_truth']}</answer>")
    train_questions = {r["extra_info"]["question"] for r in train}
    assert not any(r["extra_info"]["question"] in train_questions for r in test)
    assert [r["extra_info"]["index"] for r in test] == list(range(30))


def test_imperfect_teacher_drops_only_the_sign_of_negative_train_answers(tmp_path):
    ar.main(["--out", str(tmp_path), "--train-size", "600", "--test-size", "60", "--seed", "2",
             "--ops", "-", "--teacher-sign-error", "0.7"])
    train = pq.read_table(tmp_path / "train.parquet").to_pylist()
    negative = [r for r in train if int(r["reward_model"]["ground_truth"]) < 0]
    slipped = [r for r in negative if not r["extra_info"]["answer"].endswith(
        f"<answer>{r['reward_model']['ground_truth']}</answer>")]
    for r in slipped:  # the slip: |result| in the tag, worked lines untouched, ground truth exact
        truth = int(r["reward_model"]["ground_truth"])
        exact = ar.worked_answer(ar.Problem("-", r["extra_info"]["a"], r["extra_info"]["b"]))
        assert r["extra_info"]["answer"] == exact.replace(f"<answer>{truth}</answer>", f"<answer>{-truth}</answer>")
        assert arithmetic_score(r["extra_info"]["answer"], r["reward_model"]["ground_truth"]) == 0.0
    # about 70% of ~300 negative results slip (binomial sd ~ 8 rows)
    assert 0.6 < len(slipped) / len(negative) < 0.8, (len(slipped), len(negative))
    # non-negative results and the whole test split keep exact answers
    for r in [r for r in train if r not in negative] + pq.read_table(tmp_path / "test.parquet").to_pylist():
        assert r["extra_info"]["answer"].endswith(f"<answer>{r['reward_model']['ground_truth']}</answer>")


def test_teacher_sign_error_must_be_a_probability():
    with pytest.raises(ValueError, match="--teacher-sign-error"):
        ar.teacher_slips([ar.Problem("-", 1, 2)], 1.5)
