"""Tool calls in the agent loop: find them in an assistant turn's text (`multi_turn.format`), and run
the tools' coroutines concurrently, each under a timeout, from the synchronous rollout worker."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import re
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
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
    """`hermes` (Qwen2.5): every `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` in order.

    `arguments` may also be a JSON string. A malformed block or an unclosed last tag is a `CallError`.
    """
    calls: list[ParsedCall | CallError] = [_hermes_call(m.group(1)) for m in _HERMES_BLOCK.finditer(text)]
    tail = text[text.rfind(HERMES_CLOSE) + len(HERMES_CLOSE):] if HERMES_CLOSE in text else text
    if HERMES_OPEN in tail:
        calls.append(CallError(f"a {HERMES_OPEN} is not closed with {HERMES_CLOSE}"))
    return calls


# seconds past a call's timeout before the loop counts as blocked (wait_for needs it to run to cancel)
BLOCKED_LOOP_GRACE_S = 1.0


@dataclass
class CallOutcome:
    """What one call returned, or why it did not: `error` holds the message, `timed_out` the cause."""

    value: Any = None
    error: str | None = None
    timed_out: bool = False
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None


Job = tuple[Callable[[], Awaitable[Any]], float]  # (a coroutine factory, its timeout in seconds)


async def _timed(factory: Callable[[], Awaitable[Any]], timeout: float) -> CallOutcome:
    start = time.perf_counter()
    try:
        value = await asyncio.wait_for(factory(), timeout)
    except (TimeoutError, asyncio.TimeoutError):  # distinct classes before Python 3.11
        return CallOutcome(error=f"timed out after {timeout:g}s", timed_out=True, seconds=time.perf_counter() - start)
    except Exception as err:  # any failure of the tool is the model's to read, not the run's end
        return CallOutcome(error=f"{type(err).__name__}: {err}", seconds=time.perf_counter() - start)
    return CallOutcome(value=value, seconds=time.perf_counter() - start)


def _cancel_all_and_stop(loop: asyncio.AbstractEventLoop) -> None:
    for task in asyncio.all_tasks(loop):
        task.cancel()
    loop.stop()


class ToolRunner:
    """Runs batches of tool calls concurrently on one background event loop, each under `wait_for`.

    A tool that blocks the loop itself cannot be cancelled: its batch's unfinished calls time out and the
    next batch gets a fresh loop, abandoning the blocked daemon thread.
    """

    def __init__(self, blocked_loop_grace_s: float = BLOCKED_LOOP_GRACE_S) -> None:
        self.blocked_loop_grace_s = blocked_loop_grace_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.abandoned_loops = 0  # loops left behind because a tool blocked them

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="hybridrl-tools", daemon=True)
            thread.start()
            self._loop, self._thread = loop, thread
        return self._loop

    def run(self, jobs: Sequence[Job]) -> list[CallOutcome]:
        """Run every job at once; each outcome in the order given."""
        if not jobs:
            return []
        loop = self._running_loop()
        start = time.perf_counter()
        futures = [asyncio.run_coroutine_threadsafe(_timed(factory, timeout), loop) for factory, timeout in jobs]
        outcomes: list[CallOutcome] = []
        blocked = False
        for future, (_, timeout) in zip(futures, jobs, strict=True):
            remaining = start + timeout + self.blocked_loop_grace_s - time.perf_counter()
            try:
                outcomes.append(future.result(timeout=max(remaining, 0.0)))
            except concurrent.futures.TimeoutError:
                blocked = True
                future.cancel()
                outcomes.append(CallOutcome(error=f"timed out after {timeout:g}s (the tool blocked its event loop)",
                                            timed_out=True, seconds=time.perf_counter() - start))
        if blocked:
            self._abandon()
        return outcomes

    def _abandon(self) -> None:
        """Leave a blocked loop behind; it stops once the blocking call returns."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._loop, self._thread = None, None
        self.abandoned_loops += 1

    def close(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(_cancel_all_and_stop, self._loop)
            self._thread.join(timeout=5)
            self._loop.close()
        self._loop, self._thread = None, None
