"""A Python code interpreter tool: the model's code runs in the project's sandbox (hybridrl/rewards/sandbox.py).

Each call is one fresh sandboxed process (namespaces, rlimits, a throwaway uid; see
hybridrl/rewards/SANDBOX.md); the tool answers with what the program printed, and with its error output
and status when it did not finish cleanly. Nothing persists between calls. The tool YAML's `config:`
sets the limits: `wall_seconds`, `cpu_seconds`, `address_space_bytes`, `output_bytes`,
`require_isolation` (SandboxLimits' fields). A host where the sandbox cannot run stops the run when
the tool is built, with the reason and the fix, instead of failing every call.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from hybridrl.rewards.sandbox import SandboxLimits, require_sandbox, run_code
from hybridrl.tools.base_tool import BaseTool
from hybridrl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

SCHEMA = {
    "type": "function",
    "function": {
        "name": "code_interpreter",
        "description": "Run a Python program and return what it prints.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "the Python program; print the results"}},
            "required": ["code"],
        },
    },
}
LIMIT_KEYS = ("wall_seconds", "cpu_seconds", "address_space_bytes", "output_bytes", "require_isolation")
MAX_REPLY_CHARS = 4000  # the agent loop truncates further to multi_turn.max_tool_response_length


class SandboxCodeInterpreterTool(BaseTool):
    """`code_interpreter(code)`: run the program in the sandbox, answer with its output."""

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None) -> None:
        super().__init__(config, tool_schema)
        unknown = sorted(set(self.config) - set(LIMIT_KEYS) - {"type"})
        if unknown:
            raise ValueError(f"code interpreter config keys {unknown} are not settings; it takes {list(LIMIT_KEYS)}")
        self.limits = dataclasses.replace(SandboxLimits(), **{k: v for k, v in self.config.items() if k in LIMIT_KEYS})
        require_sandbox(self.limits)

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        return OpenAIFunctionToolSchema.model_validate(SCHEMA)

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
                      ) -> tuple[ToolResponse, float, dict]:
        code = parameters.get("code")
        if not isinstance(code, str) or not code.strip():
            raise ValueError("code must be a non-empty string")
        result = await asyncio.to_thread(run_code, code, None, self.limits)
        text = result.stdout
        if result.status != "ok":
            text += f"{result.stderr}\n[status: {result.status}]"
        metrics = {"status": result.status, "wall_time": result.wall_time}
        return ToolResponse(text=text[-MAX_REPLY_CHARS:]), 0.0, metrics
