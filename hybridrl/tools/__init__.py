"""Tools for multi-turn agent rollouts, with verl's interface (`verl.tools`).

- `base_tool.BaseTool`: the create / execute / calc_reward / release life cycle;
- `schemas`: `OpenAIFunctionToolSchema`, `ToolResponse`, ...;
- `tool_registry`: tools from verl's tool YAML (`initialize_tools_from_config`, `load_all_tools`);
- `function_tool`: `@function_tool` for stateless functions (`multi_turn.function_tool_path`);
- built-in tools: `calculator.CalculatorTool`, `code_interpreter.SandboxCodeInterpreterTool`;
- `call_parser`: tool calls in the model's text (`multi_turn.format`); `runner`: calls with timeouts.

The agent loop that uses them is in hybridrl/workers/rollout/.
"""

from hybridrl.tools.base_tool import BaseTool
from hybridrl.tools.function_tool import function_tool
from hybridrl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
from hybridrl.tools.tool_registry import initialize_tools_from_config, load_all_tools

__all__ = ["BaseTool", "OpenAIFunctionToolSchema", "ToolResponse", "function_tool", "initialize_tools_from_config",
           "load_all_tools"]
