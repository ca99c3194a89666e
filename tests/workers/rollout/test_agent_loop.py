"""The multi-turn agent loop on the tiny Qwen2 model and its real tokenizer.

Most tests drive the loop with `ScriptedRollout`, an engine that writes hand-built assistant turns and
scores them with the real model, so the expected conversation is known exactly; the expectations
(token ids, the mask of model tokens) come from rendering that conversation whole through the chat
template and from the SFT dataset's independent assistant-span mask. One test runs the real HF engine.
"""

from __future__ import annotations

import asyncio
import copy
import importlib.util
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hybridrl.data.sft_dataset import encode_chat
from hybridrl.protocol import DataProto
from hybridrl.rewards.managers import decode_rows
from hybridrl.tools.base_tool import BaseTool, OpenAIFunctionToolSchema, ToolResponse, load_all_tools
from hybridrl.tools.builtin_tools import CalculatorTool
from hybridrl.tools.interaction import BaseInteraction, load_interactions
from hybridrl.workers.rollout import HFRollout, RolloutConfig, build_rollout
from hybridrl.workers.rollout.agent_loop import AgentLoop, compute_agent_metrics
from hybridrl.workers.rollout.base import BaseRollout, assemble_output, check_prompts

from .helpers import full_forward_log_probs, make_prompts

FIXTURES = Path(__file__).parents[2] / "tools" / "fixtures"
CALL = '<tool_call>{{"name": "{name}", "arguments": {args}}}</tool_call>'


def call(name: str, args: str) -> str:
    return CALL.format(name=name, args=args)


class ScriptedRollout(BaseRollout):
    """Writes `script[question][k]` as the k-th assistant turn of the conversation about `question`,
    with the real model's log-probs of those tokens in their context. Not an engine under test: the
    loop's bookkeeping around it is."""

    def __init__(self, module: Any, tokenizer: Any, config: RolloutConfig, script: dict[str, list[str]],
                 char_by_char: bool = False) -> None:
        self.module, self.tokenizer, self.config, self.script = module, tokenizer, config, script
        self.calls: list[dict] = []
        # write each character as its own token(s): a tokenization a sampler may produce but the
        # tokenizer never would for the same text
        self.char_by_char = char_by_char

    def encode(self, text: str) -> list[int]:
        if self.char_by_char:
            return [i for ch in text for i in self.tokenizer(ch, add_special_tokens=False)["input_ids"]]
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    @classmethod
    def build(cls, config, *, module, tokenizer, model_path):  # pragma: no cover - built directly
        raise NotImplementedError

    def update_weights(self, state_dict) -> None:  # pragma: no cover
        raise NotImplementedError

    def _serve_weights(self, actor):  # pragma: no cover
        raise NotImplementedError

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        input_ids, attention_mask, _ = check_prompts(prompts)
        self.calls.append(dict(prompts.meta_info))
        width = prompts.meta_info["response_length"]
        eos = self.tokenizer.eos_token_id
        responses = torch.full((len(prompts), width), self.tokenizer.pad_token_id)
        lengths = torch.zeros(len(prompts), dtype=torch.long)
        for i in range(len(prompts)):
            context = self.tokenizer.decode(input_ids[i][attention_mask[i].bool()])
            question = re.search(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", context).group(1)
            turn = context.count("<|im_start|>assistant\n") - 1
            ids = self.encode(self.script[question][turn]) + [eos]
            ids = ids[:width]  # the engine stops at its width, as a real one does
            responses[i, : len(ids)] = torch.tensor(ids)
            lengths[i] = len(ids)
        draft = assemble_output(prompts, responses, lengths, torch.zeros(responses.shape), 1)
        with torch.no_grad():
            log_probs = full_forward_log_probs(self.module, draft)  # (rows, width)
        return assemble_output(prompts, responses, lengths, log_probs, 1)


def chat_prompts(tokenizer, questions: list[str], extra_infos: list[dict] | None = None,
                 width: int = 40) -> DataProto:
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                           tokenize=False) for q in questions]
    rows = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    prompts = make_prompts(tokenizer, texts=[""] * len(questions), length=width)
    for i, ids in enumerate(rows):  # left-padded chat prompts, as RLHFDataset makes them
        width = prompts.batch["input_ids"].shape[1]
        prompts.batch["input_ids"][i] = torch.tensor([tokenizer.pad_token_id] * (width - len(ids)) + ids)
        prompts.batch["attention_mask"][i] = torch.tensor([0] * (width - len(ids)) + [1] * len(ids))
        prompts.batch["position_ids"][i] = torch.clamp(prompts.batch["attention_mask"][i].cumsum(0) - 1, min=0)
    if extra_infos is not None:
        prompts.non_tensor_batch["extra_info"] = np.array(extra_infos, dtype=object)
    return prompts


def loop_for(model, tokenizer, script, tools, response_length=160, char_by_char=False, agent=None,
             **multi_turn) -> AgentLoop:
    config = RolloutConfig(response_length=response_length, multi_turn={"enable": True, **multi_turn},
                           agent=agent or {})
    return AgentLoop(ScriptedRollout(model, tokenizer, config, script, char_by_char), tokenizer, config, tools)


def conversation_row(out: DataProto, i: int) -> tuple[list[int], list[int]]:
    """Row i's prompt + response ids (padding dropped) and its response mask over the same positions."""
    mask = out.batch["attention_mask"][i].bool()
    prompt_len = out.batch["prompts"].shape[1]
    model_mask = torch.cat([torch.zeros(prompt_len, dtype=torch.long), out.batch["response_mask"][i]])
    return out.batch["input_ids"][i][mask].tolist(), model_mask[mask].tolist()


def test_masks_cover_exactly_the_model_tokens_and_turns_tokenize_as_the_whole_chat(tiny_model, tiny_tokenizer):
    q1, q2 = "What is 347 + 568?", "What is 12 * 3?"
    script = {q1: [call("calculator", '{"expression": "347 + 568"}'), "<answer>915</answer>"],
              q2: ["<answer>36</answer>"]}
    loop = loop_for(tiny_model, tiny_tokenizer, script, {"calculator": CalculatorTool({}, None)})
    out = loop.generate_sequences(chat_prompts(tiny_tokenizer, [q1, q2]))
    expected = {
        q1: [{"role": "user", "content": q1}, {"role": "assistant", "content": script[q1][0]},
             {"role": "tool", "content": "915"}, {"role": "assistant", "content": script[q1][1]}],
        q2: [{"role": "user", "content": q2}, {"role": "assistant", "content": script[q2][0]}],
    }
    for i, question in enumerate((q1, q2)):
        ids, mask = conversation_row(out, i)
        whole_ids, assistant_mask = encode_chat(tiny_tokenizer, expected[question])
        # the template's newline after the last EOS is never generated: the conversation ends at that EOS
        assert ids == whole_ids[:-1] and whole_ids[-1:] == tiny_tokenizer("\n")["input_ids"]
        assert mask == assistant_mask[:-1]
    assert out.non_tensor_batch["__num_turns__"].tolist() == [4, 2]
    assert out.non_tensor_batch["tool_calls"].tolist() == [1, 0]
    assert out.non_tensor_batch["agent_finish"].tolist() == ["answer", "answer"]
    assert out.non_tensor_batch["tokenization_mismatch"].tolist() == [0, 0]  # the loop's own check agrees
    # the rollout's log-probs sit on the model tokens only, and a forward over the assembled layout (the
    # trainer's view) gives the same values there: positions and context match what each turn saw
    mask = out.batch["response_mask"].bool()
    assert torch.equal(out.batch["rollout_log_probs"] != 0, mask)
    recomputed = full_forward_log_probs(tiny_model, out)
    assert torch.allclose(recomputed[mask], out.batch["rollout_log_probs"][mask], atol=1e-5)
    # attention covers model and tool tokens alike; the response mask is a subset of it
    response_attention = out.batch["attention_mask"][:, -out.batch["responses"].shape[1]:]
    assert bool((out.batch["response_mask"] <= response_attention).all())
    assert int(response_attention[0].sum()) > int(out.batch["response_mask"][0].sum())
    loop.close()


class RaisingTool(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        raise RuntimeError("the backend is down")


class HangingTool(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        await asyncio.Event().wait()


class BlockingTool(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        time.sleep(2.0)  # blocks the tools' event loop; the loop moves on after timeout + grace (1.5 s)
        return ToolResponse(text="late"), 0.0, {}


class GarbageTool(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        return {"not": "a tuple"}


def schema(name: str) -> OpenAIFunctionToolSchema:
    return OpenAIFunctionToolSchema.model_validate({"type": "function", "function": {"name": name, "description": name}})


def test_failing_tools_become_error_messages_and_counts_and_the_run_goes_on(tiny_model, tiny_tokenizer):
    tools = {name: cls({}, schema(name)) for name, cls in
             (("raises", RaisingTool), ("hangs", HangingTool), ("garbage", GarbageTool), ("blocks", BlockingTool))}
    tools["calculator"] = CalculatorTool({}, None)
    questions = ["q raises", "q hangs", "q garbage", "q json", "q unknown", "q parallel", "q blocks"]
    first = [call("raises", "{}"), call("hangs", "{}"), call("garbage", "{}"),
             '<tool_call>{"name": "calculator", "arguments": {"expression": </tool_call>', call("nope", "{}"),
             call("calculator", '{"expression": "1 + 1"}') + call("calculator", '{"expression": "2 + 2"}'),
             call("blocks", "{}")]
    # a tool that blocks the event loop holds up every call sharing it (asyncio's contract), so it runs in a
    # batch of its own: the first six prompts, then the seventh
    script = {q: [turn, "<answer>0</answer>"] for q, turn in zip(questions, first, strict=True)}
    # timeouts wide enough that a tool that returns at once does so in time on a loaded machine
    loop = loop_for(tiny_model, tiny_tokenizer, script, tools, response_length=200, tool_timeout=1.0)
    loop.runner.blocked_loop_grace_s = 0.5
    assert loop.runner.abandoned_loops == 0
    out = DataProto.concat([loop.generate_sequences(chat_prompts(tiny_tokenizer, questions[:6])),
                            loop.generate_sequences(chat_prompts(tiny_tokenizer, questions[6:]))])
    texts = [tiny_tokenizer.decode(r[m.bool()]) for r, m in
             zip(out.batch["responses"], out.batch["attention_mask"][:, -200:], strict=True)]
    tool_part = [re.findall(r"<\|im_start\|>tool\n(.*?)<\|im_end\|>", t, re.DOTALL) for t in texts]
    assert tool_part[0] == ["Error: RuntimeError: the backend is down"]
    assert tool_part[1] == ["Error: timed out after 1s"]
    assert tool_part[2][0].startswith("Error: execute returned dict")
    assert tool_part[3][0].startswith("Error: the tool call is not valid JSON")
    assert tool_part[4][0].startswith("Error: there is no tool named 'nope'")
    assert tool_part[5] == ["2", "Error: only 1 tool call(s) run per turn; this one did not"]
    assert tool_part[6][0].startswith("Error: timed out after 1s (the tool blocked its event loop)")
    columns = out.non_tensor_batch
    assert columns["tool_errors"].tolist() == [1, 1, 1, 1, 1, 1, 1]
    assert columns["tool_timeouts"].tolist() == [0, 1, 0, 0, 0, 0, 1]
    assert columns["tool_calls"].tolist() == [1, 1, 1, 1, 1, 2, 1]
    assert columns["agent_finish"].tolist() == ["answer"] * 7  # every conversation reached its answer
    metrics = compute_agent_metrics(out)
    assert metrics["agent/tool_errors"] == 7 and metrics["agent/tool_timeouts"] == 2
    assert metrics["agent/tool_calls/mean"] == pytest.approx(8 / 7) and metrics["agent/finish/answer"] == 1.0
    assert metrics["agent/num_turns/mean"] == 4.0
    assert loop.runner.abandoned_loops == 1  # the blocked loop was left behind, the last turn ran on a new one
    loop.close()


def test_turn_and_length_limits(tiny_model, tiny_tokenizer):
    q = "What is 2 + 2?"
    again = call("calculator", '{"expression": "2 + 2"}')
    script = {q: [again, again, "<answer>4</answer>"]}
    tools = {"calculator": CalculatorTool({}, None)}
    prompts = chat_prompts(tiny_tokenizer, [q])

    def run(response_length: int = 300, **settings) -> DataProto:
        loop = loop_for(tiny_model, tiny_tokenizer, script, tools, response_length, **settings)
        try:
            return loop.generate_sequences(prompts)
        finally:
            loop.close()

    whole = run()
    assert whole.non_tensor_batch["__num_turns__"][0] == 6  # prompt, call, tool, call, tool, answer
    one_turn = run(max_assistant_turns=1)  # the call is written, never answered
    assert one_turn.non_tensor_batch["agent_finish"][0] == "max_assistant_turns"
    assert one_turn.non_tensor_batch["tool_calls"][0] == 0
    assert int(one_turn.batch["response_mask"].sum()) == int(one_turn.batch["attention_mask"][:, -300:].sum())
    one_answer = run(max_user_turns=1)  # one tool answer, then the second call ends the conversation
    assert one_answer.non_tensor_batch["agent_finish"][0] == "max_user_turns"
    assert one_answer.non_tensor_batch["__num_turns__"][0] == 4
    call_ids = tiny_tokenizer(again, add_special_tokens=False)["input_ids"]
    short = run(response_length=len(call_ids) + 5)  # the call fits, the tool's answer is cut off
    assert short.non_tensor_batch["agent_finish"][0] == "length"
    assert int(short.batch["attention_mask"][0, -(len(call_ids) + 5):].sum()) == len(call_ids) + 5
    assert int(short.batch["response_mask"][0].sum()) == len(call_ids) + 1  # the call and its EOS
    cut = run(response_length=len(call_ids) - 3)  # the model's own turn runs out of room
    assert cut.non_tensor_batch["agent_finish"][0] == "length"
    assert int(cut.batch["response_mask"][0].sum()) == len(call_ids) - 3


def test_tool_response_truncation_sides(tiny_model, tiny_tokenizer):
    q = "big"
    script = {q: [call("calculator", '{"expression": "10 ** 30"}'), "<answer>x</answer>"]}
    digits = "1" + "0" * 30
    for side, expected in (("left", digits[:8] + "...(truncated)"), ("right", "(truncated)..." + digits[-8:]),
                           ("middle", digits[:4] + "...(truncated)..." + digits[-4:])):
        loop = loop_for(tiny_model, tiny_tokenizer, script, {"calculator": CalculatorTool({}, None)},
                        max_tool_response_length=8, tool_response_truncate_side=side)
        out = loop.generate_sequences(chat_prompts(tiny_tokenizer, [q]))
        loop.close()
        text = tiny_tokenizer.decode(out.batch["responses"][0])
        assert f"<|im_start|>tool\n{expected}<|im_end|>" in text


def test_tools_kwargs_drive_the_life_cycle_and_tool_rewards_reach_the_reward_function(
        tiny_model, tiny_tokenizer, monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))
    tools = load_all_tools(FIXTURES / "verl_tools.yaml", None)
    q_right, q_wrong, q_single = "Natalia sold 48 clips", "Another question", "single turn"
    answer = call("calc_gsm8k_reward", '{"answer": "72"}')
    script = {q_right: [answer, "<answer>72</answer>"], q_wrong: [answer, "<answer>72</answer>"],
              q_single: [answer]}
    infos = [{"tools_kwargs": {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "72"}}}},
             {"tools_kwargs": {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "70"}}}},
             {"tools_kwargs": {}}]
    prompts = chat_prompts(tiny_tokenizer, [q_right, q_wrong, q_single], infos)
    prompts.non_tensor_batch["agent_name"] = np.array(["tool_agent", "tool_agent", "single_turn_agent"], dtype=object)
    loop = loop_for(tiny_model, tiny_tokenizer, script, tools)
    out = loop.generate_sequences(prompts)
    loop.close()
    assert out.non_tensor_batch["reward_scores"].tolist() == [{"calc_gsm8k_reward": 1.0}, {"calc_gsm8k_reward": 0.0},
                                                              {}]
    # the verl example's step reward: 0 for an answer better than the last, -0.05 otherwise
    assert out.non_tensor_batch["tool_rewards"].tolist() == [[0.0], [-0.05], []]
    assert out.non_tensor_batch["agent_finish"].tolist() == ["answer"] * 3  # single_turn_agent answers nothing
    assert not tools["calc_gsm8k_reward"]._instance_dict  # every instance was released
    assert "extra_info" not in out.non_tensor_batch  # the trainer's batch keeps its own copy
    out.non_tensor_batch["extra_info"] = np.array(infos, dtype=object)
    out.non_tensor_batch["data_source"] = np.array(["gsm8k"] * 3, dtype=object)
    out.non_tensor_batch["reward_model"] = np.array([{"ground_truth": "72"}] * 3, dtype=object)
    rows = decode_rows(out, tiny_tokenizer)
    assert rows[0].extra_info["rollout_reward_scores"] == {"calc_gsm8k_reward": 1.0}
    assert rows[1].extra_info["tool_rewards"] == [-0.05] and rows[2].extra_info["num_turns"] == 2
    assert rows[0].extra_info["tools_kwargs"] == infos[0]["tools_kwargs"]
    with pytest.raises(ValueError, match="agent_name='planner'"):
        prompts.non_tensor_batch["agent_name"][0] = "planner"
        loop_for(tiny_model, tiny_tokenizer, script, tools).generate_sequences(prompts)


def test_real_hf_engine_samples_every_turn_with_consistent_log_probs(tiny_model, tiny_tokenizer):
    config = RolloutConfig(response_length=24, n=2, multi_turn={"enable": True})
    loop = AgentLoop(HFRollout(tiny_model, config, tiny_tokenizer), tiny_tokenizer, config,
                     {"calculator": CalculatorTool({}, None)})
    prompts = chat_prompts(tiny_tokenizer, ["What is 1 + 2?", "hello"])
    out = loop.generate_sequences(prompts.select(deepcopy=True))
    loop.close()
    assert out.batch["responses"].shape == (4, 24) and len(out) == 4
    assert torch.equal(out.batch["prompts"], prompts.batch["input_ids"].repeat_interleave(2, dim=0))
    mask = out.batch["response_mask"].bool()
    recomputed = full_forward_log_probs(tiny_model, out)
    assert torch.allclose(recomputed[mask], out.batch["rollout_log_probs"][mask], atol=1e-5)
    assert set(out.non_tensor_batch["agent_finish"]) <= {"answer", "length"}
    greedy = AgentLoop(HFRollout(tiny_model, config, tiny_tokenizer), tiny_tokenizer, config, {})
    validation = greedy.generate_sequences(chat_prompts(tiny_tokenizer, ["What is 1 + 2?"], None))
    assert len(validation) == 2  # rollout.n without validate=True
    prompts.meta_info = {"validate": True}
    assert len(greedy.generate_sequences(prompts)) == 2  # val_kwargs.n = 1 per prompt
    greedy.close()


def test_turns_and_the_output_are_made_on_the_prompts_device(tiny_model, tiny_tokenizer):
    # No GPU here: under torch.device("meta") a tensor made without naming a device lands on meta and fails
    # the first time it meets a prompt or model tensor or its values are read, as a CPU tensor beside CUDA
    # ones does. The calculator turns make the loop build each turn's batch and the output itself.
    config = RolloutConfig(response_length=24, n=2, multi_turn={"enable": True})
    loop = AgentLoop(HFRollout(tiny_model, config, tiny_tokenizer), tiny_tokenizer, config,
                     {"calculator": CalculatorTool({}, None)})
    prompts = chat_prompts(tiny_tokenizer, ["What is 1 + 2?", "hello"])
    prompts.meta_info["seed"] = 5
    expected = loop.generate_sequences(prompts.select(deepcopy=True))
    with torch.device("meta"):
        got = loop.generate_sequences(prompts.select(deepcopy=True))
    loop.close()
    assert {t.device.type for t in got.batch.values()} == {"cpu"}
    for key, value in expected.batch.items():
        assert torch.equal(got.batch[key], value), key


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm runs in its own venv (requirements-vllm.txt)")
def test_real_vllm_engine_samples_every_turn_with_consistent_log_probs(tiny_model, tiny_model_dir, tiny_tokenizer):
    config = RolloutConfig(name="vllm", response_length=24, prompt_length=40, n=2, multi_turn={"enable": True})
    engine = build_rollout(config, model_path=tiny_model_dir, tokenizer=tiny_tokenizer)
    loop = AgentLoop(engine, tiny_tokenizer, config, {"calculator": CalculatorTool({}, None)})
    out = loop.generate_sequences(chat_prompts(tiny_tokenizer, ["What is 1 + 2?", "hello"]))
    loop.close()
    assert out.batch["responses"].shape == (4, 24)
    mask = out.batch["response_mask"].bool()
    recomputed = full_forward_log_probs(tiny_model, out)
    assert torch.allclose(recomputed[mask], out.batch["rollout_log_probs"][mask], atol=1e-4)


# The tiny model's ChatML template, and two variants that change what a whole-conversation rendering
# gives: one trims message contents (as many real templates do), one drops an assistant turn's
# <think>...</think> part (as Qwen3's does for earlier turns).
CHATML = ("{{- bos_token }}{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + "
          "CONTENT + '<|im_end|>' + '\\n' }}{%- endfor %}"
          "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
TRIMMING = CHATML.replace("CONTENT", "(message['content'] | trim)")
THINK_DROPPING = CHATML.replace("CONTENT", "(message['content'].split('</think>')[-1] if message['role'] == "
                                           "'assistant' else message['content'])")


def with_template(tokenizer, template: str):
    clone = copy.deepcopy(tokenizer)
    clone.chat_template = template
    return clone


@pytest.mark.parametrize("case, expected", [
    # (how the turns differ from the whole conversation) -> mismatch per mode
    ("canonical", {"strict": 0, "ignore_strippable": 0}),
    ("char_by_char", {"strict": 1, "ignore_strippable": 0}),      # same text, other token ids
    ("trailing_space", {"strict": 1, "ignore_strippable": 0}),    # the template trims what the model wrote
    ("think_dropped", {"strict": 1, "ignore_strippable": 1}),     # the template drops text the model saw
])
def test_tokenization_sanity_check_modes(tiny_model, tiny_tokenizer, case, expected):
    question = "What is 347 + 568?"
    first, answer = call("calculator", '{"expression": "347 + 568"}'), "<answer>915</answer>"
    template = {"trailing_space": TRIMMING, "think_dropped": THINK_DROPPING}.get(case, CHATML.replace(
        "CONTENT", "message['content']"))
    tokenizer = with_template(tiny_tokenizer, template)
    if case == "trailing_space":
        answer += " "
    if case == "think_dropped":
        first = "<think>the calculator is exact</think>" + first
    for mode, flag in {**expected, "disable": None}.items():
        loop = loop_for(tiny_model, tokenizer, {question: [first, answer]}, {"calculator": CalculatorTool({}, None)},
                        char_by_char=case == "char_by_char", tokenization_sanity_check_mode=mode)
        out = loop.generate_sequences(chat_prompts(tokenizer, [question]))
        loop.close()
        assert out.non_tensor_batch["tool_calls"].tolist() == [1]  # the conversation ran its two turns
        assert out.non_tensor_batch["tokenization_mismatch"].tolist() == [flag], (case, mode)
        metrics = compute_agent_metrics(out)
        assert metrics.get("agent/tokenization_mismatch") == (None if flag is None else float(flag))


def test_a_trajectory_cut_by_the_length_limit_is_not_checked(tiny_model, tiny_tokenizer):
    question = "What is 347 + 568?"
    loop = loop_for(tiny_model, tiny_tokenizer, {question: ["<answer>" + "9" * 40 + "</answer>"]}, {},
                    response_length=12)
    out = loop.generate_sequences(chat_prompts(tiny_tokenizer, [question]))
    loop.close()
    assert out.non_tensor_batch["agent_finish"].tolist() == ["length"]
    assert out.non_tensor_batch["tokenization_mismatch"].tolist() == [None]


def test_rows_without_agent_name_run_the_configured_default_loop(tiny_model, tiny_tokenizer):
    question = "What is 347 + 568?"
    script = {question: [call("calculator", '{"expression": "347 + 568"}'), "<answer>915</answer>"]}
    tools = {"calculator": CalculatorTool({}, None)}
    single = loop_for(tiny_model, tiny_tokenizer, script, tools, agent={"default_agent_loop": "single_turn_agent"})
    out = single.generate_sequences(chat_prompts(tiny_tokenizer, [question]))
    single.close()
    assert out.non_tensor_batch["__num_turns__"].tolist() == [2]  # the call was written, and left unanswered
    prompts = chat_prompts(tiny_tokenizer, [question])
    prompts.non_tensor_batch["agent_name"] = np.array(["tool_agent"], dtype=object)  # a row's own choice wins
    single = loop_for(tiny_model, tiny_tokenizer, script, tools, agent={"default_agent_loop": "single_turn_agent"})
    out = single.generate_sequences(prompts)
    single.close()
    assert out.non_tensor_batch["__num_turns__"].tolist() == [4]


class RaisingInteraction(BaseInteraction):
    async def generate_response(self, instance_id, messages, **kwargs):
        raise RuntimeError("the simulated user crashed")


def interactions_yaml(tmp_path) -> Path:
    path = tmp_path / "interactions.yaml"
    path.write_text("interaction:\n  - name: gsm8k\n    class_name: hybridrl.tools.interaction.Gsm8kInteraction\n"
                    "    config: {}\n")
    return path


def test_an_interaction_answers_turns_without_tool_calls_until_it_ends_the_conversation(
        tiny_model, tiny_tokenizer, tmp_path):
    interactions = load_interactions(interactions_yaml(tmp_path))
    q_retry, q_plain = "What is 36 + 36?", "Say hi"
    script = {q_retry: ["It is #### 70", "Sorry, #### 72"], q_plain: ["hi"]}
    infos = [{"interaction_kwargs": {"name": "gsm8k", "ground_truth": "72"}}, {}]
    prompts = chat_prompts(tiny_tokenizer, [q_retry, q_plain], infos)
    loop = AgentLoop(ScriptedRollout(tiny_model, tiny_tokenizer, RolloutConfig(response_length=160,
                                                                               multi_turn={"enable": True}),
                                     script), tiny_tokenizer, RolloutConfig(response_length=160,
                                                                            multi_turn={"enable": True}),
                     {}, interactions)
    out = loop.generate_sequences(prompts)
    loop.close()
    retry_reply = "Your response is incorrect! You need to reflect on your answer and try again."
    # the conversation, rendered whole by the chat template: the interaction's replies are user turns
    whole_ids, assistant_mask = encode_chat(tiny_tokenizer, [
        {"role": "user", "content": q_retry}, {"role": "assistant", "content": "It is #### 70"},
        {"role": "user", "content": retry_reply}, {"role": "assistant", "content": "Sorry, #### 72"},
        {"role": "user", "content": "Your response is correct!"}])
    # after the last user turn the loop has also written the header the model's next turn would follow
    header = tiny_tokenizer("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    ids, model_mask = conversation_row(out, 0)
    assert ids == whole_ids + header
    assert model_mask == assistant_mask + [0] * len(header)  # user turns are context, not trained on
    assert out.non_tensor_batch["turn_scores"].tolist() == [[0.0, 1.0], []]
    assert out.non_tensor_batch["agent_finish"].tolist() == ["interaction", "answer"]
    assert out.non_tensor_batch["__num_turns__"].tolist() == [5, 2]
    assert not interactions["gsm8k"]._instance_dict  # finalized
    out.non_tensor_batch.update(extra_info=np.array(infos, dtype=object),
                                data_source=np.array(["gsm8k"] * 2, dtype=object),
                                reward_model=np.array([{"ground_truth": "72"}] * 2, dtype=object))
    assert decode_rows(out, tiny_tokenizer)[0].extra_info["turn_scores"] == [0.0, 1.0]


def test_interaction_limits_failures_and_unknown_names(tiny_model, tiny_tokenizer, tmp_path):
    config = RolloutConfig(response_length=160, multi_turn={"enable": True, "max_user_turns": 1})
    script = {"What is 36 + 36?": ["#### 1", "#### 2", "#### 3"]}
    infos = [{"interaction_kwargs": {"name": "gsm8k", "ground_truth": "72"}}]
    prompts = chat_prompts(tiny_tokenizer, ["What is 36 + 36?"], infos)
    loop = AgentLoop(ScriptedRollout(tiny_model, tiny_tokenizer, config, script), tiny_tokenizer, config, {},
                     load_interactions(interactions_yaml(tmp_path)))
    out = loop.generate_sequences(prompts)
    assert out.non_tensor_batch["agent_finish"].tolist() == ["max_user_turns"]  # one reply, then the limit
    assert out.non_tensor_batch["turn_scores"].tolist() == [[0.0]]
    crashing = AgentLoop(ScriptedRollout(tiny_model, tiny_tokenizer, config, script), tiny_tokenizer, config, {},
                         {"gsm8k": RaisingInteraction({})})
    out = crashing.generate_sequences(prompts)
    assert out.non_tensor_batch["agent_finish"].tolist() == ["interaction_error"]
    assert out.non_tensor_batch["tool_errors"].tolist() == [1]  # counted, and the run goes on
    prompts.non_tensor_batch["extra_info"][0] = {"interaction_kwargs": {"name": "weather"}}
    with pytest.raises(ValueError, match="interaction_kwargs.name='weather' is not loaded"):
        loop.generate_sequences(prompts)
    loop.close()
    crashing.close()


def test_interaction_yaml_names_hybridrl_classes(tmp_path):
    verl_yaml = tmp_path / "verl.yaml"
    verl_yaml.write_text("interaction:\n  - name: gsm8k\n    class_name: verl.interactions.gsm8k_interaction."
                         "Gsm8kInteraction\n")
    with pytest.raises(ImportError, match="cannot be imported"):
        load_interactions(verl_yaml)
    unnamed = tmp_path / "unnamed.yaml"
    unnamed.write_text("interaction:\n  - class_name: hybridrl.tools.interaction.Gsm8kInteraction\n")
    assert list(load_interactions(unnamed)) == ["gsm8k"]  # the class name without its suffix
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("interaction:\n  - class_name: hybridrl.tools.builtin_tools.CalculatorTool\n")
    with pytest.raises(TypeError, match="not a subclass of hybridrl.tools.interaction.BaseInteraction"):
        load_interactions(wrong)
