"""Custom reward functions loaded from a file in verl's signature."""

from pathlib import Path

import pytest

from hybridrl.rewards.managers import get_custom_reward_fn, load_custom_reward_function

FIXTURE = Path(__file__).parent / "fixtures" / "custom_reward.py"


def test_verl_signature_file_works_unchanged():
    fn = load_custom_reward_function(FIXTURE)
    assert fn("openai/gsm8k", "the answer is 42", "42") == 1.0
    assert fn(data_source="x", solution_str="no", ground_truth="42", extra_info=None) == 0.0
    assert fn("x", "42!", "42", {"detailed": True}) == {"score": 1.0, "response_chars": 3}


def test_reward_kwargs_are_bound_and_name_selects_the_function():
    config = {"custom_reward_function": {"path": str(FIXTURE), "name": "scaled_score",
                                         "reward_kwargs": {"scale": 2.0, "bonus": 0.5}}}
    fn = get_custom_reward_fn(config)
    assert fn("x", "42", "42") == 2.5  # 2.0 * 1 + 0.5
    assert fn("x", "41", "42") == 0.5  # 2.0 * 0 + 0.5


def test_no_path_means_no_custom_function():
    assert get_custom_reward_fn({"custom_reward_function": {"path": None}}) is None
    assert get_custom_reward_fn({}) is None


def test_errors_name_the_config_field(tmp_path):
    with pytest.raises(FileNotFoundError, match="custom_reward_function.path"):
        load_custom_reward_function(tmp_path / "missing.py")
    with pytest.raises(AttributeError, match=r"custom_reward_function.name='nope'.*compute_score"):
        load_custom_reward_function(FIXTURE, "nope")


def test_a_reward_worker_loads_the_function_without_importing_torch():
    # the reward pool's worker processes unpickle the function at start: a torch import there would cost each
    # worker seconds, so the pickle must name a light module
    import pickle
    import subprocess
    import sys

    payload = pickle.dumps(load_custom_reward_function(FIXTURE))
    code = ("import pickle, sys; fn = pickle.loads(sys.stdin.buffer.read()); "
            "print(fn('x', 'the answer is 42', '42'), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], input=payload, capture_output=True, check=True)
    assert out.stdout.decode().split() == ["1.0", "False"]
