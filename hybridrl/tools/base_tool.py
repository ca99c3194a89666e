"""`BaseTool`: the life cycle of a tool the agent loop calls, under verl's names and signatures.

A trajectory that calls a tool gets its own instance of it: `create` once (with the row's
`extra_info.tools_kwargs[<name>].create_kwargs`), `execute` for every call of the tool in the trajectory,
then `calc_reward` and `release` when the trajectory ends. All four are coroutines, run on the agent
loop's event loop with a timeout each (hybridrl/tools/tool_runner.py); blocking work belongs in
`asyncio.to_thread`, as the built-in tools do.

A tool class written for verl (`verl.tools.base_tool.BaseTool`) runs after its imports change to
`hybridrl.tools.base_tool` / `hybridrl.tools.schemas`. The older verl returns (an instance id string
from `create`, a string from `execute`) are accepted too.
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from hybridrl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse


class BaseTool:
    """A tool: `config` is its YAML `config:` mapping, `tool_schema` what the model is told it takes.

    A subclass that describes itself overrides `get_openai_tool_schema` and may be built with
    `tool_schema=None`.
    """

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None) -> None:
        self.config = dict(config or {})
        self.tool_schema = tool_schema
        if self.tool_schema is None:
            self.tool_schema = self.get_openai_tool_schema()
        if self.tool_schema is None:
            raise ValueError(f"{type(self).__name__} has no tool schema: give the tool a `tool_schema:` in the "
                             f"tool YAML, or override get_openai_tool_schema")
        self.tool_schema = OpenAIFunctionToolSchema.model_validate(self.tool_schema)
        self.name = self.tool_schema.function.name

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema | None:
        return self.tool_schema

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        """Start one trajectory's instance; returns its id (a fresh one when none is given)."""
        return instance_id or str(uuid4()), ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
                      ) -> tuple[ToolResponse, float, dict]:
        """Run one call: (the response the model reads, a step reward, metrics)."""
        raise NotImplementedError(f"{type(self).__name__} must implement execute(instance_id, parameters, **kwargs)")

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        """The instance's reward when its trajectory ends (reaches the reward function as
        extra_info['rollout_reward_scores'][name])."""
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        """Free what the instance holds."""
        return None
