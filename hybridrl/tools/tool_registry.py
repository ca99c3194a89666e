"""Tools from verl's tool YAML (`multi_turn.tool_config_path`) and function-tool files.

The YAML has verl's shape:

    tools:
      - class_name: hybridrl.tools.calculator.CalculatorTool   # module.Class, a BaseTool subclass
        config:                                               # handed to the class as `config`
          type: native
        tool_schema:                                          # optional when the class describes itself
          type: function
          function:
            name: calculator
            description: Evaluate an arithmetic expression.
            parameters: {type: object, properties: {expression: {type: string, description: ...}},
                         required: [expression]}

`config.type: native` (the default) is a Python class in this process; verl's `mcp` tools (served by an
MCP server) are refused with that name. Tool names must be unique across the YAML and the function file.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from hybridrl.tools.base_tool import BaseTool
from hybridrl.tools.function_tool import load_function_tools
from hybridrl.tools.schemas import OpenAIFunctionToolSchema

KEY = "actor_rollout_ref.rollout.multi_turn.tool_config_path"


def _import_class(dotted: str, where: str) -> type:
    module_name, _, class_name = dotted.rpartition(".")
    if not module_name:
        raise ValueError(f"{where}.class_name must be module.Class, got {dotted!r}")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as err:
        raise ImportError(f"{where}.class_name={dotted!r} cannot be imported: {err}") from err
    if not (isinstance(cls, type) and issubclass(cls, BaseTool)):
        raise TypeError(f"{where}.class_name={dotted!r} is not a subclass of hybridrl.tools.base_tool.BaseTool "
                        f"(a verl tool needs its imports changed from verl.tools to hybridrl.tools)")
    return cls


def _build(entry: Any, where: str) -> BaseTool:
    if not isinstance(entry, Mapping) or "class_name" not in entry:
        raise ValueError(f"{where} must be a mapping with class_name (and config, tool_schema), got {entry!r}")
    config = dict(entry.get("config") or {})
    kind = config.get("type", "native")
    if kind != "native":
        raise NotImplementedError(f"{where}.config.type={kind!r} is not supported: only native tools (Python "
                                  f"classes in the rollout process) run here; MCP servers do not")
    schema = entry.get("tool_schema")
    schema = OpenAIFunctionToolSchema.model_validate(schema, f"{where}.tool_schema") if schema else None
    return _import_class(str(entry["class_name"]), where)(config, schema)


def initialize_tools_from_config(tools_config_file: str | Path) -> list[BaseTool]:
    """Build every tool a verl tool YAML lists, in its order."""
    path = Path(tools_config_file).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"{KEY}={tools_config_file} is not a file")
    data = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    entries = data.get("tools") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ValueError(f"{path} ({KEY}) must hold a list under `tools:`, got {data!r}")
    return [_build(entry, f"{path}: tools[{i}]") for i, entry in enumerate(entries)]


def load_all_tools(tool_config_path: str | Path | None, function_tool_path: str | Path | None) -> dict[str, BaseTool]:
    """The tools of a run by name: the YAML's, then the function file's; a repeated name raises."""
    tools: list[BaseTool] = []
    if tool_config_path:
        tools += initialize_tools_from_config(tool_config_path)
    if function_tool_path:
        tools += load_function_tools(function_tool_path)
    by_name: dict[str, BaseTool] = {}
    for tool in tools:
        if tool.name in by_name:
            raise ValueError(f"two tools are named {tool.name!r} ({type(by_name[tool.name]).__name__} and "
                             f"{type(tool).__name__}); tool names must be unique across multi_turn.tool_config_path "
                             f"and multi_turn.function_tool_path")
        by_name[tool.name] = tool
    return by_name
