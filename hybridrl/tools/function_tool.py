"""`@function_tool`: a plain Python function as a stateless tool (verl's `function_tool_path` files).

    from hybridrl.tools.function_tool import function_tool

    @function_tool
    def add(a: int, b: int) -> int:
        \"\"\"Add two integers.

        Args:
            a: the first addend
            b: the second addend
        \"\"\"
        return a + b

The schema is read from the signature and the Google-style docstring by transformers'
`get_json_schema`, so every parameter needs a type hint and an `Args:` line (transformers raises at
decoration time otherwise). `@function_tool("name")` renames the tool; `schema=` gives the schema
outright. The function may be sync (run in a thread) or async. It may return a `ToolResponse`, a string,
a dict (sent as JSON), or a tuple `(response, reward)` / `(response, reward, metrics)`; anything else is
sent as `str(value)`.

The decorator returns the function unchanged, with its `FunctionToolSpec` in `fn.function_tool_spec`
(a typed attribute, like `@register`'s); `load_function_tools(path)` imports a file and collects the
functions that carry one, so no registry is shared between files or runs.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers.utils import get_json_schema

from hybridrl.tools.base_tool import BaseTool
from hybridrl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

SPEC_ATTRIBUTE = "function_tool_spec"


@dataclass(frozen=True)
class FunctionToolSpec:
    """What `@function_tool` records on a function."""

    name: str
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
    """Mark a function as a tool: `@function_tool`, `@function_tool("name")` or `@function_tool(schema=...)`."""

    def mark(fn: Callable[..., Any], tool_name: str | None) -> Callable[..., Any]:
        tool_name = tool_name or fn.__name__
        built = OpenAIFunctionToolSchema.model_validate(schema) if schema is not None \
            else schema_from_function(fn, tool_name)
        setattr(fn, SPEC_ATTRIBUTE, FunctionToolSpec(tool_name, fn, built))
        return fn

    if callable(name):  # bare @function_tool
        return mark(name, None)
    return lambda fn: mark(fn, name)


def tool_result(value: Any, where: str) -> tuple[ToolResponse, float, dict]:
    """A function's return value as (response, reward, metrics)."""
    if isinstance(value, tuple):
        if not 1 <= len(value) <= 3:
            raise TypeError(f"{where} returned a tuple of {len(value)} items; return (response,), "
                            f"(response, reward) or (response, reward, metrics)")
        reward = 0.0 if len(value) < 2 or value[1] is None else float(value[1])
        metrics = {} if len(value) < 3 or value[2] is None else dict(value[2])
        return _as_response(value[0]), reward, metrics
    return _as_response(value), 0.0, {}


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
