"""What a tool is, under verl's names (`verl.tools.base_tool`, `verl.tools.schemas`): the `BaseTool` life
cycle, the OpenAI function-tool schemas, `@function_tool`, and a run's tools from verl's tool YAML."""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from uuid import uuid4

from transformers.utils import get_json_schema

from hybridrl.utils.registry import import_class, yaml_list

# verl's pydantic models as dataclasses with the same fields, `model_validate` and `model_dump`


def _require(data: Any, where: str, keys: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise TypeError(f"{where} must be a mapping, got {type(data).__name__}: {data!r}")
    missing = [key for key in keys if key not in data]
    if missing:
        raise ValueError(f"{where} lacks {missing}; it has {sorted(data)}")
    return data


@dataclass
class OpenAIFunctionPropertySchema:
    """One parameter; other keys (`nullable`, `default`) are kept in `extra` and dumped back."""

    type: str | list[str]
    description: str | None = None
    enum: list[Any] | None = None
    items: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def model_validate(cls, data: Any, where: str = "property") -> OpenAIFunctionPropertySchema:
        data = _require(data, where, ("type",))
        known = {"type", "description", "enum", "items"}
        return cls(type=data["type"], description=data.get("description"), enum=data.get("enum"),
                   items=data.get("items"), extra={k: v for k, v in data.items() if k not in known})

    def model_dump(self, exclude_none: bool = False) -> dict[str, Any]:
        out = {"type": self.type, "description": self.description, "enum": self.enum, "items": self.items}
        out = {k: v for k, v in out.items() if not (exclude_none and v is None)}
        return {**out, **self.extra}


@dataclass
class OpenAIFunctionParametersSchema:
    type: str = "object"
    properties: dict[str, OpenAIFunctionPropertySchema] = field(default_factory=dict)
    required: list[str] = field(default_factory=list)

    @classmethod
    def model_validate(cls, data: Any, where: str = "parameters") -> OpenAIFunctionParametersSchema:
        data = _require(data, where, ())
        properties = data.get("properties") or {}
        parsed = {name: OpenAIFunctionPropertySchema.model_validate(value, f"{where}.properties.{name}")
                  for name, value in _require(properties, f"{where}.properties", ()).items()}
        required = list(data.get("required") or [])
        unknown = [name for name in required if name not in parsed]
        if unknown:
            raise ValueError(f"{where}.required names {unknown}, which {where}.properties lacks")
        return cls(type=data.get("type", "object"), properties=parsed, required=required)

    def model_dump(self, exclude_none: bool = False) -> dict[str, Any]:
        return {"type": self.type,
                "properties": {k: v.model_dump(exclude_none) for k, v in self.properties.items()},
                "required": list(self.required)}


@dataclass
class OpenAIFunctionSchema:
    name: str
    description: str
    parameters: OpenAIFunctionParametersSchema = field(default_factory=OpenAIFunctionParametersSchema)
    strict: bool = False

    @classmethod
    def model_validate(cls, data: Any, where: str = "function") -> OpenAIFunctionSchema:
        data = _require(data, where, ("name", "description"))
        parameters = OpenAIFunctionParametersSchema.model_validate(data.get("parameters") or {},
                                                                   f"{where}.parameters")
        return cls(name=str(data["name"]), description=str(data["description"]), parameters=parameters,
                   strict=bool(data.get("strict", False)))

    def model_dump(self, exclude_none: bool = False) -> dict[str, Any]:
        return {"name": self.name, "description": self.description,
                "parameters": self.parameters.model_dump(exclude_none), "strict": self.strict}


@dataclass
class OpenAIFunctionToolSchema:
    """`{"type": "function", "function": {...}}`: what a chat template's `tools=` argument takes."""

    type: str
    function: OpenAIFunctionSchema

    @classmethod
    def model_validate(cls, data: Any, where: str = "tool_schema") -> OpenAIFunctionToolSchema:
        if isinstance(data, cls):
            return data
        data = _require(data, where, ("type", "function"))
        if data["type"] != "function":
            raise ValueError(f"{where}.type must be 'function' (the only tool type), got {data['type']!r}")
        return cls(type="function", function=OpenAIFunctionSchema.model_validate(data["function"],
                                                                                 f"{where}.function"))

    def model_dump(self, exclude_none: bool = False, exclude_unset: bool = False) -> dict[str, Any]:
        """A plain dict; `exclude_unset` (verl's callers pass it) drops nothing."""
        del exclude_unset
        return {"type": self.type, "function": self.function.model_dump(exclude_none)}


@dataclass
class ToolResponse:
    """What a tool answers; the agent loop refuses image and video."""

    text: str | None = None
    image: Any = None
    video: Any = None

    def model_dump(self) -> dict[str, Any]:
        return asdict(self)


class BaseTool:
    """A tool: `config` is its YAML `config:` mapping, `tool_schema` what the model is told it takes (or
    override `get_openai_tool_schema`). Each trajectory: `create` (with its `extra_info.tools_kwargs[<name>]`),
    `execute` per call, `calc_reward`, `release`; all coroutines under a timeout each, so blocking work
    belongs in `asyncio.to_thread`."""

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


SPEC_ATTRIBUTE = "function_tool_spec"


@dataclass(frozen=True)
class FunctionToolSpec:
    """What `@function_tool` records on a function."""

    fn: Callable[..., Any]
    schema: OpenAIFunctionToolSchema


def schema_from_function(fn: Callable[..., Any], name: str) -> OpenAIFunctionToolSchema:
    """The function's OpenAI tool schema from its signature and docstring, under `name`."""
    variadic = [p.name for p in inspect.signature(fn).parameters.values()
                if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    if variadic:
        raise ValueError(f"@function_tool {fn.__qualname__}: *args/**kwargs ({variadic}) cannot be described to "
                         f"the model; name every parameter")
    raw = get_json_schema(fn)
    raw["function"]["name"] = name
    return OpenAIFunctionToolSchema.model_validate(raw, where=f"schema of {fn.__qualname__}")


def function_tool(name: str | Callable[..., Any] | None = None, *,
                  schema: OpenAIFunctionToolSchema | dict | None = None) -> Any:
    """Mark a function as a tool: `@function_tool`, `@function_tool("name")` or `@function_tool(schema=...)`;
    without `schema=` it is read from the type hints and the Google-style docstring's `Args:`. The function
    (sync or async) returns a `ToolResponse`, a string, a dict (sent as JSON), `(response, reward[, metrics])`
    or anything else (sent as `str(value)`); it comes back unchanged."""

    def mark(fn: Callable[..., Any], tool_name: str | None) -> Callable[..., Any]:
        tool_name = tool_name or fn.__name__
        built = OpenAIFunctionToolSchema.model_validate(schema) if schema is not None \
            else schema_from_function(fn, tool_name)
        setattr(fn, SPEC_ATTRIBUTE, FunctionToolSpec(fn, built))
        return fn

    if callable(name):  # bare @function_tool
        return mark(name, None)
    return lambda fn: mark(fn, name)


def tool_result(value: Any, where: str) -> tuple[ToolResponse, float, dict]:
    """A function's return value as (response, reward, metrics)."""
    items = value if isinstance(value, tuple) else (value,)
    if not 1 <= len(items) <= 3:
        raise TypeError(f"{where} returned a tuple of {len(items)} items; return (response,), "
                        f"(response, reward) or (response, reward, metrics)")
    response, reward, metrics = (*items, None, None)[:3]  # a missing or None reward is 0.0, metrics {}
    return _as_response(response), float(reward or 0.0), dict(metrics or {})


def _as_response(value: Any) -> ToolResponse:
    if isinstance(value, ToolResponse):
        return value
    if isinstance(value, str):
        return ToolResponse(text=value)
    if isinstance(value, dict):
        return ToolResponse(text=json.dumps(value, ensure_ascii=False))
    return ToolResponse(text=str(value))


class FunctionTool(BaseTool):
    """A `@function_tool` function behind the BaseTool life cycle (no state: create/release do nothing)."""

    def __init__(self, spec: FunctionToolSpec) -> None:
        super().__init__({}, spec.schema)
        self.spec = spec

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
                      ) -> tuple[ToolResponse, float, dict]:
        fn = self.spec.fn
        if inspect.iscoroutinefunction(fn):
            value = await fn(**parameters)
        else:
            value = await asyncio.to_thread(fn, **parameters)
        return tool_result(value, f"function tool {self.name!r}")


def load_function_tools(path: str | Path) -> list[FunctionTool]:
    """Import the Python file at `path` (`multi_turn.function_tool_path`) and wrap its `@function_tool`s,
    in the order the file defines them."""
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise FileNotFoundError(f"actor_rollout_ref.rollout.multi_turn.function_tool_path={path} is not a file")
    module_name = "hybridrl_function_tools_" + "_".join(file.with_suffix("").parts[1:]).replace("-", "_")
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, file)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import {file} (multi_turn.function_tool_path)")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # the file's own dataclasses and pickling find it by name
        spec.loader.exec_module(module)
    specs = [getattr(obj, SPEC_ATTRIBUTE) for obj in vars(module).values()
             if isinstance(getattr(obj, SPEC_ATTRIBUTE, None), FunctionToolSpec)]
    if not specs:
        raise ValueError(f"{file} (multi_turn.function_tool_path) defines no @function_tool function")
    return [FunctionTool(spec) for spec in specs]


TOOL_CONFIG_KEY = "actor_rollout_ref.rollout.multi_turn.tool_config_path"


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
    cls = import_class(str(entry["class_name"]), where, BaseTool,
                       "a verl tool needs its imports changed from verl.tools to hybridrl.tools")
    return cls(config, schema)


def initialize_tools_from_config(tools_config_file: str | Path) -> list[BaseTool]:
    """Build, in order, the tools (`class_name`, `config`, optional `tool_schema`) a verl tool YAML lists
    (`multi_turn.tool_config_path`; docs/agents.md); verl's `mcp` tools are refused."""
    path, entries = yaml_list(tools_config_file, "tools", TOOL_CONFIG_KEY)
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
