"""Find the tool calls in an assistant turn's text, by `multi_turn.format`.

`hermes` (Qwen2.5 / NousResearch Hermes): each call is a JSON object between tags,

    <tool_call>{"name": "calculator", "arguments": {"expression": "3 + 4"}}</tool_call>

with `arguments` an object (a JSON string holding one is accepted too, as some models write it). A
block that is not such an object, or a `<tool_call>` left unclosed, is a `CallError`: the agent loop
answers it with an error message in the conversation and counts it, and the run goes on.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hybridrl.utils.registry import Registry

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
_HERMES_BLOCK = re.compile(re.escape(HERMES_OPEN) + r"(.*?)" + re.escape(HERMES_CLOSE), re.DOTALL)


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class CallError:
    message: str  # what the model is told went wrong


CallParser = Callable[[str], list[ParsedCall | CallError]]
CALL_FORMATS: Registry[CallParser] = Registry("tool-call format (actor_rollout_ref.rollout.multi_turn.format)")


def _hermes_call(block: str) -> ParsedCall | CallError:
    try:
        call = json.loads(block)
    except json.JSONDecodeError as err:
        return CallError(f"the tool call is not valid JSON ({err.msg} at character {err.pos}): {block.strip()[:200]}")
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return CallError('a tool call must be a JSON object {"name": ..., "arguments": {...}}')
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return CallError(f"the arguments of {call['name']!r} are a string that is not JSON")
    if not isinstance(arguments, dict):
        return CallError(f"the arguments of {call['name']!r} must be a JSON object, got {type(arguments).__name__}")
    return ParsedCall(call["name"], arguments)


@CALL_FORMATS.register("hermes")
def parse_hermes(text: str) -> list[ParsedCall | CallError]:
    """Every `<tool_call>...</tool_call>` block in order; an unclosed last one is an error."""
    calls: list[ParsedCall | CallError] = [_hermes_call(m.group(1)) for m in _HERMES_BLOCK.finditer(text)]
    tail = text[text.rfind(HERMES_CLOSE) + len(HERMES_CLOSE):] if HERMES_CLOSE in text else text
    if HERMES_OPEN in tail:
        calls.append(CallError(f"a {HERMES_OPEN} is not closed with {HERMES_CLOSE}"))
    return calls
