"""RolloutConfig: verl's keys and defaults, and errors naming the key."""

from __future__ import annotations

import re

import pytest
from omegaconf import OmegaConf

from hybridrl.workers.config import to_dataclass
from hybridrl.workers.rollout import RolloutConfig, ValKwargs


def test_builds_from_omegaconf_with_nested_val_kwargs():
    node = OmegaConf.create({"name": "hf", "n": 8, "top_k": 20, "val_kwargs": {"n": 4, "do_sample": True}})
    config = to_dataclass(RolloutConfig, node)
    assert (config.n, config.top_k, config.top_p, config.temperature) == (8, 20, 1.0, 1.0)
    assert isinstance(config.val_kwargs, ValKwargs) and config.val_kwargs.n == 4
    assert config.val_kwargs.temperature == 0.0  # verl's validation default is greedy


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"top_p": 0.0}, "rollout.top_p"),
        ({"temperature": -1.0}, "rollout.temperature"),
        ({"n": 0}, "rollout.n"),
        ({"top_k": -2}, "rollout.top_k"),
        ({"response_length": 0}, "rollout.response_length"),
        ({"val_kwargs": {"n": 0}}, "rollout.val_kwargs.n"),
    ],
)
def test_bad_values_name_the_key(values, message):
    with pytest.raises(ValueError, match=message):
        to_dataclass(RolloutConfig, values)


def test_unknown_key_is_rejected():
    with pytest.raises(Exception, match="temprature"):
        to_dataclass(RolloutConfig, {"temprature": 1.0})


@pytest.mark.parametrize("settings, message", [
    ({"format": "json"}, "actor_rollout_ref.rollout.multi_turn.format must be one of ('hermes',)"),
    ({"tool_response_truncate_side": "both"}, "multi_turn.tool_response_truncate_side must be one of"),
    ({"max_assistant_turns": 0}, "multi_turn.max_assistant_turns must be null or >= 1"),
    ({"max_parallel_calls": 0}, "multi_turn.max_parallel_calls must be >= 1"),
    ({"tool_timeout": 0}, "multi_turn.tool_timeout must be > 0"),
    ({"tokenization_sanity_check_mode": "loose"}, "multi_turn.tokenization_sanity_check_mode must be one of"),
])
def test_multi_turn_settings_are_checked_naming_the_key(settings, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        to_dataclass(RolloutConfig, {"multi_turn": settings})
    assert to_dataclass(RolloutConfig, {"multi_turn": {"enable": True}}).multi_turn.max_tool_response_length == 256


@pytest.mark.parametrize("settings, message", [
    ({"default_agent_loop": "react_agent"}, "rollout.agent.default_agent_loop must be null or one of"),
])
def test_agent_settings_are_checked_naming_the_key(settings, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        to_dataclass(RolloutConfig, {"agent": settings})
    # verl's off values are accepted, so its recipes' full key set loads
    config = to_dataclass(RolloutConfig, {"agent": {"default_agent_loop": "tool_agent"}, "multi_turn": {
        "tokenization_sanity_check_mode": "ignore_strippable", "use_inference_chat_template": False,
        "interaction_config_path": None, "num_repeat_rollouts": None}})
    assert config.agent.default_agent_loop == "tool_agent"
    assert config.multi_turn.tokenization_sanity_check_mode == "ignore_strippable"
