"""Tools for multi-turn agent rollouts, with verl's interface (`verl.tools`; docs/agents.md).

`base_tool`: `BaseTool`, the schemas, `@function_tool` and loading a run's tools; `builtin_tools`: the
calculator and the sandboxed code interpreter; `tool_calls`: parsing calls from the model's text and
`ToolRunner`, which runs them with timeouts for the agent loop (hybridrl/workers/rollout/).
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
