"""Countdown: the solver against a brute-force oracle, the evaluator, and the generated files."""

from __future__ import annotations

import itertools
import random
from fractions import Fraction

import pyarrow.parquet as pq
import pytest

from hybridrl.data.tasks import countdown as cd
from hybridrl.rewards.scorers import countdown_score, evaluate, literals, parse_expression


def brute_force_values(values: list[Fraction]) -> set[Fraction]:
    """Classic 'pick two, combine, recurse' enumeration: a different algorithm from the subset DP."""
    if len(values) == 1:
        return {values[0]}
    out: set[Fraction] = set()
    for i, j in itertools.permutations(range(len(values)), 2):
        x, y = values[i], values[j]
        rest = [v for k, v in enumerate(values) if k not in (i, j)]
        results = [x + y, x - y, x * y] + ([x / y] if y != 0 else [])
        for r in results:
            out |= brute_force_values(rest + [r])
    return out


def test_reachable_by_hand():
    # from 2 and 3: 2+3=5, 2*3=6, 3-2=1, 2-3=-1, 2/3, 3/2
    assert set(cd.reachable([2, 3])) == {5, 6, 1, -1, Fraction(2, 3), Fraction(3, 2)}


@pytest.mark.parametrize("seed", range(6))
def test_reachable_matches_brute_force(seed):
    rng = random.Random(seed)
    numbers = [rng.randint(1, 12) for _ in range(rng.choice([3, 4]))]
    table = cd.reachable(numbers)
    assert set(table) == brute_force_values([Fraction(n) for n in numbers])
    for value, entry in list(table.items())[:50]:
        tree = parse_expression(cd.render(entry.expr))
        assert evaluate(tree) == cd.value_of(entry.expr) == value and sorted(literals(tree)) == sorted(numbers)


def test_solve_known_and_unsolvable():
    expr = cd.render(cd.solve([44, 19, 35], 28))
    assert cd.is_solution(expr, [44, 19, 35], 28)  # e.g. (44 + 19) - 35
    # from 1 and 1 only 2, 0, 1 are reachable; from 2 and 3 (see above) 7 is not
    assert cd.solve([1, 1], 5) is None
    assert cd.solve([2, 3], 7) is None


def test_solution_check_refuses_non_arithmetic():
    assert cd.is_solution("(1 + 2) / 3", [1, 2, 3], 1)
    for bad in ["__import__('os')", "2 ** 3", "x + 1", "1 +"]:
        assert not cd.is_solution(bad, [1, 2, 3], 1)
    assert not cd.is_solution("3 / (2 - 2)", [3, 2, 2], 1)  # division by zero
    assert not cd.is_solution("44 + 19 - 35", [44, 19], 28)  # uses a number not given
    assert not cd.is_solution("44 + 19", [44, 19, 35], 63)  # leaves one out


def test_generated_instances_are_solvable_distinct_and_deterministic():
    train, test = cd.generate(150, 30, seed=2)
    assert (train, test) == cd.generate(150, 30, seed=2)
    keys = [(tuple(sorted(i.numbers)), i.target) for i in train + test]
    assert len(set(keys)) == 180
    for inst in train + test:
        assert 3 <= len(inst.numbers) <= 4 and all(1 <= n <= 99 for n in inst.numbers)
        assert 1 <= inst.target <= 100
        assert cd.is_solution(inst.solution, inst.numbers, inst.target)
        text = inst.worked_answer
        assert text.endswith(f"<answer>{inst.solution}</answer>")
        assert text.split("</think>")[0].strip().endswith(f"= {inst.target}")
        truth = {"target": inst.target, "numbers": list(inst.numbers)}
        assert countdown_score(text, truth) == 1.0


def test_cli_writes_verl_schema(tmp_path):
    cd.main(["--out", str(tmp_path), "--train-size", "40", "--test-size", "10", "--max-numbers", "3"])
    train = pq.read_table(tmp_path / "train.parquet").to_pylist()
    test = pq.read_table(tmp_path / "test.parquet").to_pylist()
    assert (len(train), len(test)) == (40, 10)
    row = test[0]
    assert row["data_source"] == "countdown" and row["extra_info"]["split"] == "test"
    truth = row["reward_model"]["ground_truth"]
    assert set(truth) == {"target", "numbers"} and len(truth["numbers"]) == 3
    assert countdown_score(row["extra_info"]["answer"], truth) == 1.0
    train_keys = {
        (
            tuple(sorted(r["reward_model"]["ground_truth"]["numbers"])),
            r["reward_model"]["ground_truth"]["target"],
        )
        for r in train
    }
    assert not any(
        (
            tuple(sorted(r["reward_model"]["ground_truth"]["numbers"])),
            r["reward_model"]["ground_truth"]["target"],
        )
        in train_keys
        for r in test
    )
