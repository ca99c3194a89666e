"""verl-style tool YAML, tool classes and function-tool files load and run through the BaseTool life cycle."""

import asyncio
from pathlib import Path

import pytest

from hybridrl.tools.base_tool import (
    BaseTool,
    OpenAIFunctionToolSchema,
    ToolResponse,
    function_tool,
    initialize_tools_from_config,
    load_all_tools,
    load_function_tools,
)

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def fixtures_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))


def run(coro):
    return asyncio.run(coro)


def test_verl_yaml_and_verl_style_class_load_and_run_the_life_cycle(fixtures_importable):
    tools = initialize_tools_from_config(FIXTURES / "verl_tools.yaml")
    assert [t.name for t in tools] == ["calc_gsm8k_reward", "calculator"]
    checker = tools[0]
    assert type(checker).__name__ == "AnswerCheckTool"
    schema = checker.get_openai_tool_schema().model_dump()
    assert schema["function"]["parameters"]["required"] == ["answer"]
    assert schema["function"]["parameters"]["properties"]["answer"]["type"] == "string"

    async def episode():
        instance, _ = await checker.create(ground_truth="72")
        first = await checker.execute(instance, {"answer": "70"})
        second = await checker.execute(instance, {"answer": "72"})
        reward = await checker.calc_reward(instance)
        await checker.release(instance)
        return first, second, reward, instance

    first, second, reward, instance = run(episode())
    # wrong answer: reward 0, not better than 0 -> the -0.05 step penalty; right answer: 1 > 0 -> 0.0
    assert first[0].text == "Current parsed answer='70' reward=0.0" and first[1] == -0.05
    assert second[1] == 0.0 and reward == 1.0
    assert instance not in checker._instance_dict  # released
    calculator = tools[1]  # the built-in tool described itself (no tool_schema in the YAML)
    response, _, _ = run(calculator.execute("x", {"expression": "347 + 568"}))
    assert response.text == "915"


def test_yaml_errors_name_the_entry_and_the_fix(tmp_path, fixtures_importable):
    bad = tmp_path / "bad.yaml"
    bad.write_text("tools:\n  - class_name: verl_style_tool.Nope\n")
    with pytest.raises(ImportError, match=r"tools\[0\].class_name='verl_style_tool.Nope' cannot be imported"):
        initialize_tools_from_config(bad)
    bad.write_text("tools:\n  - class_name: collections.OrderedDict\n")
    with pytest.raises(TypeError, match="not a subclass of hybridrl.tools.base_tool.BaseTool"):
        initialize_tools_from_config(bad)
    bad.write_text("tools:\n  - class_name: hybridrl.tools.builtin_tools.CalculatorTool\n    config: {type: mcp}\n")
    with pytest.raises(NotImplementedError, match=r"tools\[0\].config.type='mcp' is not supported"):
        initialize_tools_from_config(bad)
    bad.write_text("tools:\n  - class_name: verl_style_tool.AnswerCheckTool\n    tool_schema:\n"
                   "      type: function\n      function: {description: no name}\n")
    with pytest.raises(ValueError, match=r"tools\[0\].tool_schema.function lacks \['name'\]"):
        initialize_tools_from_config(bad)
    bad.write_text("tools:\n  - class_name: verl_style_tool.AnswerCheckTool\n")
    with pytest.raises(ValueError, match="has no tool schema"):
        initialize_tools_from_config(bad)
    with pytest.raises(FileNotFoundError, match="multi_turn.tool_config_path"):
        initialize_tools_from_config(tmp_path / "missing.yaml")


def test_function_tools_take_their_schema_from_signature_and_docstring():
    tools = load_function_tools(FIXTURES / "function_tools.py")
    assert [t.name for t in tools] == ["reverse_text", "scored_len"]  # not_a_tool is left out
    schema = tools[0].tool_schema.model_dump(exclude_none=True)["function"]
    assert schema["description"] == "Reverse a string."
    assert schema["parameters"]["properties"]["text"] == {"type": "string", "description": "the string to reverse"}
    assert schema["parameters"]["properties"]["times"]["type"] == "integer"
    assert schema["parameters"]["required"] == ["text"]  # times has a default
    response, reward, metrics = run(tools[0].execute("i", {"text": "abc", "times": 3}))
    assert (response.text, reward, metrics) == ("cba", 0.0, {})
    response, reward, metrics = run(tools[1].execute("i", {"text": "abcd"}))  # async, returns a triple
    assert (response.text, reward, metrics) == ("4", 4.0, {"chars": 4})


def test_function_tool_refuses_what_cannot_be_described():
    with pytest.raises(ValueError, match=r"\*args/\*\*kwargs"):
        @function_tool
        def loose(**kwargs: int) -> None:
            """Anything.

            Args:
                kwargs: anything
            """

    @function_tool(schema={"type": "function", "function": {"name": "given", "description": "d"}})
    def undocumented(x):
        return x

    assert undocumented.function_tool_spec.schema.function.name == "given"


def test_tool_names_are_unique_across_yaml_and_function_file(tmp_path, fixtures_importable):
    tools = load_all_tools(FIXTURES / "verl_tools.yaml", FIXTURES / "function_tools.py")
    assert list(tools) == ["calc_gsm8k_reward", "calculator", "reverse_text", "scored_len"]
    twice = tmp_path / "twice.py"
    twice.write_text("from hybridrl.tools.base_tool import function_tool\n\n"
                     "@function_tool('calculator')\ndef calc(expression: str) -> str:\n"
                     "    '''Shadow.\n\n    Args:\n        expression: text\n    '''\n    return expression\n")
    with pytest.raises(ValueError, match="two tools are named 'calculator'"):
        load_all_tools(FIXTURES / "verl_tools.yaml", twice)


def test_old_verl_return_types_and_schema_round_trip(fixtures_importable):
    from verl_style_tool import OldStyleEchoTool

    schema = {"type": "function", "function": {"name": "echo", "description": "Echo.", "parameters": {
        "type": "object", "properties": {"text": {"type": "string", "enum": ["a", "b"]}}, "required": ["text"]}}}
    tool = OldStyleEchoTool({}, OpenAIFunctionToolSchema.model_validate(schema))
    assert tool.tool_schema.model_dump(exclude_none=True)["function"]["parameters"] == schema["function"]["parameters"]
    assert isinstance(run(tool.create()), str)
    assert run(tool.execute("i", {"text": "a"}))[0] == "echo a"
    assert isinstance(BaseTool({}, tool.tool_schema), BaseTool)
    with pytest.raises(NotImplementedError, match="must implement execute"):
        run(BaseTool({}, tool.tool_schema).execute("i", {}))
    assert ToolResponse(text="t").model_dump() == {"text": "t", "image": None, "video": None}
