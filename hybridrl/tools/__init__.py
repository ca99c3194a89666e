"""Tools for multi-turn agent rollouts, with verl's interface (`verl.tools`).

- `base_tool`: `BaseTool` (the create / execute / calc_reward / release life cycle), the schemas
  (`OpenAIFunctionToolSchema`, `ToolResponse`, ...), `@function_tool` for stateless functions
  (`multi_turn.function_tool_path`), and a run's tools from verl's tool YAML (`initialize_tools_from_config`,
  `load_all_tools`);
- `builtin_tools`: `CalculatorTool`, `SandboxCodeInterpreterTool`;
- `tool_calls`: tool calls in the model's text (`multi_turn.format`), and `ToolRunner`, which runs them
  with timeouts.

The agent loop that uses them is in hybridrl/workers/rollout/.
"""

from hybridrl.tools.base_tool import (
    BaseTool,
    OpenAIFunctionToolSchema,
    ToolResponse,
    function_tool,
    initialize_tools_from_config,
    load_all_tools,
)

__all__ = ["BaseTool", "OpenAIFunctionToolSchema", "ToolResponse", "function_tool", "initialize_tools_from_config",
           "load_all_tools"]
