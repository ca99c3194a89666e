"""Tools for multi-turn agent rollouts, with verl's interface (`verl.tools`; docs/agents.md)."""

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
