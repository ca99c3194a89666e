"""Interactions: a simulated user who answers the model after each turn without a tool call, under verl's
names (`verl.interactions`; docs/agents.md). Methods may be coroutines (verl's are) or plain functions."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any
from uuid import uuid4

from hybridrl.rewards.scorers import gsm8k_score
from hybridrl.utils.registry import import_class, yaml_list

INTERACTION_CONFIG_KEY = "actor_rollout_ref.rollout.multi_turn.interaction_config_path"


class BaseInteraction:
    """One simulated user, shared by every trajectory of a worker; per-trajectory state lives under the
    instance id `start_interaction` returns."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.name: str = config.get("name", "interaction_agent")

    async def start_interaction(self, instance_id: str | None = None, **kwargs: Any) -> str:
        return instance_id if instance_id is not None else str(uuid4())

    async def generate_response(self, instance_id: str, messages: list[dict[str, Any]],
                                **kwargs: Any) -> tuple[bool, str, float, dict[str, Any]]:
        """(should_terminate_sequence, reply, turn score (into extra_info's `turn_scores`), extra data)."""
        raise NotImplementedError

    async def calculate_score(self, instance_id: str, **kwargs: Any) -> float:
        return 0.0

    async def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        return None


class Gsm8kInteraction(BaseInteraction):
    """verl's GSM8K demo user: says whether the last answer matches the row's ground truth (strict
    `#### n` format), and asks for another try until it does."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self._instance_dict: dict[str, dict[str, Any]] = {}

    async def start_interaction(self, instance_id: str | None = None, ground_truth: str | None = None,
                                **kwargs: Any) -> str:
        instance_id = instance_id if instance_id is not None else str(uuid4())
        self._instance_dict[instance_id] = {"response": "", "ground_truth": ground_truth}
        return instance_id

    async def generate_response(self, instance_id: str, messages: list[dict[str, Any]],
                                **kwargs: Any) -> tuple[bool, str, float, dict[str, Any]]:
        answers = [m.get("content", "") for m in messages if m.get("role") == "assistant"]
        self._instance_dict[instance_id]["response"] = answers[-1] if answers else ""
        score = await self.calculate_score(instance_id)
        if score == 1.0:
            return True, "Your response is correct!", score, {}
        return False, "Your response is incorrect! You need to reflect on your answer and try again.", score, {}

    async def calculate_score(self, instance_id: str, **kwargs: Any) -> float:
        state = self._instance_dict[instance_id]
        return gsm8k_score(state["response"], state["ground_truth"], method="strict", format_score=0.0, score=1.0)

    async def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        self._instance_dict.pop(instance_id, None)


def load_interactions(config_path: str | Path) -> dict[str, BaseInteraction]:
    """The interactions a verl interaction YAML lists under `interaction:` (name, class_name, config), by
    name; a missing name is the class name without its Interaction suffix, lower-cased."""
    path, entries = yaml_list(config_path, "interaction", INTERACTION_CONFIG_KEY)
    interactions: dict[str, BaseInteraction] = {}
    for i, entry in enumerate(entries):
        where = f"{path}: interaction[{i}]"
        if not isinstance(entry, Mapping) or "class_name" not in entry:
            raise ValueError(f"{where} must be a mapping with class_name (and name, config), got {entry!r}")
        cls = import_class(str(entry["class_name"]), where, BaseInteraction,
                           "a verl interaction needs its imports changed from verl.interactions to "
                           "hybridrl.tools.interaction")
        name = entry.get("name") or cls.__name__.removesuffix("Interaction").lower()
        if name in interactions:
            raise ValueError(f"{where}: two interactions are named {name!r}; names must be unique")
        interactions[name] = cls({**(entry.get("config") or {}), "name": name})
    return interactions
