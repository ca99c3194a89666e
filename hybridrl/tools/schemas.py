"""The shapes tools are described and answered in: OpenAI function-tool schemas and `ToolResponse`.

verl's names and fields (`verl.tools.schemas`), as plain dataclasses: a tool written against verl builds
and reads them the same way (`OpenAIFunctionToolSchema.model_validate(dict)`, `schema.model_dump()`,
`schema.function.name`, `ToolResponse(text=...)`). A schema that lacks a required field fails when it
is read, naming the field.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "OpenAIFunctionCallSchema",
    "OpenAIFunctionParametersSchema",
    "OpenAIFunctionParsedSchema",
    "OpenAIFunctionPropertySchema",
    "OpenAIFunctionSchema",
    "OpenAIFunctionToolSchema",
    "ToolResponse",
]


def _require(data: Any, where: str, keys: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise TypeError(f"{where} must be a mapping, got {type(data).__name__}: {data!r}")
    missing = [key for key in keys if key not in data]
    if missing:
        raise ValueError(f"{where} lacks {missing}; it has {sorted(data)}")
    return data


@dataclass
class OpenAIFunctionPropertySchema:
    """One parameter: its JSON type, what it means, and optionally its allowed values or item type.

    Keys beyond these (e.g. `nullable`, `default`, which transformers' schema reader writes) are kept in
    `extra` and written back by `model_dump`.
    """

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
    """The function's parameters as a JSON-schema object."""

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
    """A function's name, what it does, and its parameters."""

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
        """A plain dict (both keyword arguments are accepted as verl's callers pass them; `exclude_unset`
        drops nothing here, since dataclasses do not track which fields were set)."""
        del exclude_unset
        return {"type": self.type, "function": self.function.model_dump(exclude_none)}


@dataclass
class OpenAIFunctionParsedSchema:
    """A tool call as the model wrote it: the name and the arguments still as JSON text."""

    name: str
    arguments: str


@dataclass
class OpenAIFunctionCallSchema:
    """A tool call with its arguments decoded."""

    name: str
    arguments: dict[str, Any]

    @staticmethod
    def from_openai_function_parsed_schema(parsed: OpenAIFunctionParsedSchema) -> tuple[OpenAIFunctionCallSchema, bool]:
        """The decoded call and whether decoding failed (then the arguments are empty), as verl returns."""
        try:
            arguments = json.loads(parsed.arguments)
        except json.JSONDecodeError:
            return OpenAIFunctionCallSchema(parsed.name, {}), True
        if not isinstance(arguments, dict):
            return OpenAIFunctionCallSchema(parsed.name, {}), True
        return OpenAIFunctionCallSchema(parsed.name, arguments), False


@dataclass
class ToolResponse:
    """What a tool answers. Only text reaches the model here: image and video are refused by the agent loop."""

    text: str | None = None
    image: Any = None
    video: Any = None

    def model_dump(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
