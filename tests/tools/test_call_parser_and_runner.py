"""Hermes tool-call parsing, and tool calls run concurrently with timeouts (async and blocking hangs)."""

import asyncio
import time

from hybridrl.tools.tool_calls import CALL_FORMATS, CallError, ParsedCall, ToolRunner, parse_hermes


def test_hermes_calls_in_order_with_errors_for_bad_blocks():
    text = ('I will compute.<tool_call>{"name": "calculator", "arguments": {"expression": "3 + 4"}}</tool_call>'
            '<tool_call>\n{"name": "f", "arguments": "{\\"x\\": 1}"}\n</tool_call>'
            '<tool_call>{"name": "g", "arguments": {]}</tool_call>'
            '<tool_call>["not", "an", "object"]</tool_call><tool_call>{"name": "h"')
    calls = parse_hermes(text)
    assert calls[0] == ParsedCall("calculator", {"expression": "3 + 4"})
    assert calls[1] == ParsedCall("f", {"x": 1})  # arguments given as a JSON string
    assert isinstance(calls[2], CallError) and "not valid JSON" in calls[2].message
    assert isinstance(calls[3], CallError) and "JSON object" in calls[3].message
    assert calls[4] == CallError("a <tool_call> is not closed with </tool_call>")
    assert len(calls) == 5
    assert parse_hermes("<answer>7</answer>") == []
    assert CALL_FORMATS.get("hermes") is parse_hermes


def test_runner_returns_values_errors_and_timeouts_and_keeps_going():
    # a grace wide enough for a loaded machine's loop thread to run the timeouts it owes
    runner = ToolRunner(blocked_loop_grace_s=1.0)

    async def value():
        await asyncio.sleep(0)
        return 42

    async def raises():
        raise RuntimeError("tool broke")

    async def awaits_forever():
        await asyncio.Event().wait()

    async def blocks_the_loop():
        time.sleep(2.0)  # synchronous: wait_for cannot interrupt it, nor can the grace outlast it

    try:
        outcomes = runner.run([(value, 5.0), (raises, 5.0), (awaits_forever, 0.05)])
        assert outcomes[0].ok and outcomes[0].value == 42
        assert outcomes[1].error == "RuntimeError: tool broke" and not outcomes[1].timed_out
        assert outcomes[2].timed_out and outcomes[2].error == "timed out after 0.05s"
        blocked = runner.run([(blocks_the_loop, 0.05)])
        assert blocked[0].timed_out and "blocked its event loop" in blocked[0].error
        assert runner.abandoned_loops == 1
        assert runner.run([(value, 5.0)])[0].value == 42  # a fresh loop serves the next batch
    finally:
        runner.close()
