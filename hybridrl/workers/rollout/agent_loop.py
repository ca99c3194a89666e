"""The multi-turn agent loop: generate, run the tools the model calls, append their answers, continue
(docs/agents.md). `AgentLoop.generate_sequences` returns a rollout engine's layout with every turn in
`responses`; tool failures become `Error: ...` messages the model reads, never stop the run.
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import torch

from hybridrl.data.rl_dataset import left_pad
from hybridrl.protocol import DataProto, object_column
from hybridrl.tools.base_tool import BaseTool, ToolResponse
from hybridrl.tools.interaction import BaseInteraction
from hybridrl.tools.tool_calls import CALL_FORMATS, CallError, CallOutcome, ParsedCall, ToolRunner
from hybridrl.workers.config import AGENT_LOOPS, RolloutConfig
from hybridrl.workers.rollout.base import BaseRollout, assemble_output, check_prompts, eos_token_ids
from hybridrl.workers.rollout.chat_delta import ChatTemplateDelta, tokenization_mismatch
from hybridrl.workers.rollout.sampling import CALL_OVERRIDES, resolve_sampling_params

# Per-sample columns the loop adds (`sample_columns`); reward functions get some in extra_info.
NUMERIC_COLUMNS = ("__num_turns__", "tool_calls", "tool_errors", "tool_timeouts")
FINISH_COLUMN = "agent_finish"


def compute_agent_metrics(batch: DataProto) -> dict[str, float]:
    """`agent/*` metrics of a step's batch (empty for a single-turn rollout); finish/<reason>: share of samples."""
    columns = batch.non_tensor_batch
    if "__num_turns__" not in columns:
        return {}
    turns, calls, errors, timeouts = (np.asarray(columns[key], dtype=float) for key in NUMERIC_COLUMNS)
    metrics = {
        "agent/num_turns/mean": float(turns.mean()),
        "agent/num_turns/min": float(turns.min()),
        "agent/num_turns/max": float(turns.max()),
        "agent/tool_calls/mean": float(calls.mean()),
        "agent/tool_errors": float(errors.sum()),
        "agent/tool_timeouts": float(timeouts.sum()),
    }
    latencies = [seconds for row in columns["tool_latency_s"] for seconds in row]
    if latencies:
        metrics["agent/tool_latency_s/mean"] = float(np.mean(latencies))
        metrics["agent/tool_latency_s/max"] = float(np.max(latencies))
    checked = [flag for flag in columns.get("tokenization_mismatch", ()) if flag is not None]
    if checked:
        metrics["agent/tokenization_mismatch"] = float(sum(checked))
    finishes = list(columns[FINISH_COLUMN])
    for reason in Finish:
        metrics[f"agent/finish/{reason.value}"] = finishes.count(reason.value) / len(finishes)
    return metrics


logger = logging.getLogger(__name__)

# The prompt columns the loop reads besides the prompt tensors; the trainer sends them to the rollout.
AGENT_INPUT_COLUMNS = ("extra_info", "agent_name", "raw_prompt")
# Turn t of a call seeded s samples with seed s + t * TURN_SEED_STRIDE: fresh randomness each turn.
TURN_SEED_STRIDE = 7919


class AgentState(enum.Enum):
    GENERATING = "generating"
    CALLING_TOOLS = "calling_tools"
    INTERACTING = "interacting"
    DONE = "done"


class Finish(enum.Enum):
    ANSWER = "answer"
    LENGTH = "length"
    ASSISTANT_TURNS = "max_assistant_turns"
    USER_TURNS = "max_user_turns"
    INTERACTION = "interaction"  # the interaction ended the conversation
    INTERACTION_ERROR = "interaction_error"  # the interaction failed to start or to reply


@dataclass
class Trajectory:
    """One sample's conversation after its prompt, and what its tools did."""

    prompt_ids: list[int]
    agent_name: str
    tools_kwargs: Mapping[str, Any]
    response_ids: list[int] = field(default_factory=list)
    model_mask: list[int] = field(default_factory=list)  # 1: the model wrote the token
    log_probs: list[float] = field(default_factory=list)
    state: AgentState = AgentState.GENERATING
    finish: Finish | None = None
    assistant_turns: int = 0
    user_turns: int = 0
    pending: list[ParsedCall | CallError] = field(default_factory=list)  # calls of the last turn
    instances: dict[str, str] = field(default_factory=dict)  # tool name -> instance id
    tool_calls: int = 0
    tool_errors: int = 0
    tool_timeouts: int = 0
    tool_latencies: list[float] = field(default_factory=list)  # seconds of each execute call
    tool_rewards: list[float] = field(default_factory=list)  # execute's step rewards, in call order
    reward_scores: dict[str, float] = field(default_factory=dict)  # calc_reward per tool
    messages: list[dict[str, str]] = field(default_factory=list)  # the turns as chat messages
    prompt_messages: list[dict[str, Any]] = field(default_factory=list)  # the prompt's chat (data.return_raw_chat)
    interaction: str | None = None  # the name of the row's interaction, if it has one
    interaction_kwargs: dict[str, Any] = field(default_factory=dict)  # start_interaction's (less `name`)
    interaction_id: str | None = None  # set once started
    turn_scores: list[float] = field(default_factory=list)  # the interaction's score of each reply
    tokenization_mismatch: int | None = None  # 1: the turns' ids differ from the whole chat's; None: unchecked

    def room(self, limit: int) -> int:
        return limit - len(self.response_ids)

    def append(self, ids: Sequence[int], from_model: bool, log_probs: Sequence[float] | None = None) -> None:
        self.response_ids += list(ids)
        self.model_mask += [int(from_model)] * len(ids)
        self.log_probs += list(log_probs) if log_probs is not None else [0.0] * len(ids)

    def end(self, finish: Finish) -> None:
        self.state, self.finish, self.pending = AgentState.DONE, finish, []

    def kwargs_for(self, tool: str, stage: str) -> dict[str, Any]:
        return dict((self.tools_kwargs.get(tool) or {}).get(stage) or {})

    def count_failure(self, outcome: CallOutcome) -> None:
        self.tool_errors += 1
        self.tool_timeouts += int(outcome.timed_out)


def sample_columns(trajectories: Sequence[Trajectory]) -> dict[str, np.ndarray]:
    """The per-sample columns of finished trajectories (`compute_agent_metrics` reads them)."""
    return {
        "__num_turns__": object_column([1 + t.assistant_turns + t.user_turns for t in trajectories]),
        "tool_calls": object_column([t.tool_calls for t in trajectories]),
        "tool_errors": object_column([t.tool_errors for t in trajectories]),
        "tool_timeouts": object_column([t.tool_timeouts for t in trajectories]),
        "tool_latency_s": object_column([list(t.tool_latencies) for t in trajectories]),
        FINISH_COLUMN: object_column([t.finish.value if t.finish else "" for t in trajectories]),
        "tool_rewards": object_column([list(t.tool_rewards) for t in trajectories]),
        "reward_scores": object_column([dict(t.reward_scores) for t in trajectories]),
        "turn_scores": object_column([list(t.turn_scores) for t in trajectories]),
        "tokenization_mismatch": object_column([t.tokenization_mismatch for t in trajectories]),
    }


def truncate_text(text: str, limit: int, side: str) -> str:
    """Keep `limit` characters of `text`: the start (left), the end (right) or both ends (middle)."""
    if len(text) <= limit:
        return text
    if side == "left":
        return text[:limit] + "...(truncated)"
    if side == "right":
        return "(truncated)..." + text[-limit:]
    head = limit // 2
    return text[:head] + "...(truncated)..." + text[len(text) - (limit - head):]


def _created_id(value: Any) -> str:
    """`create`'s result: (instance_id, ToolResponse) as verl returns it now, or an older tool's bare id."""
    instance = value[0] if isinstance(value, tuple) and value else value
    if not isinstance(instance, str) or not instance:
        raise TypeError(f"create returned {value!r}; expected (instance_id, ToolResponse) or an instance id")
    return instance


def _executed(value: Any) -> tuple[str, float]:
    """`execute`'s result as (text, step reward), or TypeError saying what came back instead."""
    if not (isinstance(value, tuple) and len(value) == 3):
        raise TypeError(f"execute returned {type(value).__name__} {str(value)[:80]!r}; expected "
                        f"(ToolResponse, reward, metrics)")
    response, reward, _ = value
    if isinstance(response, str):
        response = ToolResponse(text=response)
    if not isinstance(response, ToolResponse):
        raise TypeError(f"execute returned a {type(response).__name__} as its response; expected a ToolResponse")
    if response.image is not None or response.video is not None:
        raise TypeError("execute returned an image or video; only text tool responses are supported")
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise TypeError(f"execute returned the reward {reward!r}; expected a finite number")
    return response.text or "", float(reward)


class AgentLoop:
    """Multi-turn generation over `engine` with `tools` (by name), per `config.multi_turn`."""

    def __init__(self, engine: BaseRollout, tokenizer: Any, config: RolloutConfig,
                 tools: Mapping[str, BaseTool], interactions: Mapping[str, BaseInteraction] | None = None) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.config = config
        self.tools = dict(tools)
        self.interactions = dict(interactions or {})
        self.parse = CALL_FORMATS.get(config.multi_turn.format)
        self.delta = ChatTemplateDelta(tokenizer)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_token_id = int(pad)
        self.eos_token_ids = eos_token_ids(tokenizer.eos_token_id)
        self.runner = ToolRunner()
        self._warned_tokenization = False

    def close(self) -> None:
        self.runner.close()

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        input_ids, attention_mask, _ = check_prompts(prompts)
        params = resolve_sampling_params(self.config, prompts.meta_info, self.eos_token_ids)
        stop_ids = set(params.stop_token_ids)
        trajectories = self._start(prompts, input_ids, attention_mask, params.n)
        turn = 0
        while any(t.state is AgentState.GENERATING for t in trajectories):
            self._model_turn([t for t in trajectories if t.state is AgentState.GENERATING], prompts.meta_info,
                             turn, stop_ids, input_ids.device)
            self._tool_turn([t for t in trajectories if t.state is AgentState.CALLING_TOOLS])
            self._interaction_turn([t for t in trajectories if t.state is AgentState.INTERACTING])
            turn += 1
        self._close_instances(trajectories)
        self._check_tokenization(trajectories)
        return self._assemble(prompts, trajectories, params.n)

    def _check_tokenization(self, trajectories: list[Trajectory]) -> None:
        """Mark each trajectory (not cut by the length limit) whose turn-by-turn ids differ from its whole chat's."""
        mode = self.config.multi_turn.tokenization_sanity_check_mode
        if mode == "disable":
            return
        for t in trajectories:
            if t.finish is Finish.LENGTH or not t.messages:
                continue
            where = tokenization_mismatch(self.delta, t.messages, t.response_ids, mode)
            t.tokenization_mismatch = int(where is not None)
            if where is not None and not self._warned_tokenization:
                self._warned_tokenization = True
                logger.warning("multi-turn tokenization: a trajectory's turn-by-turn ids differ from its "
                               "conversation tokenised at once (%s); counted in agent/tokenization_mismatch. "
                               "multi_turn.tokenization_sanity_check_mode=ignore_strippable ignores whitespace "
                               "differences, disable turns the check off", where)

    def _start(self, prompts: DataProto, input_ids: torch.Tensor, attention_mask: torch.Tensor,
               n: int) -> list[Trajectory]:
        rows = len(prompts)
        absent = np.full(rows, None, dtype=object)
        extra_infos, agent_names, raw_prompts = (prompts.non_tensor_batch.get(column, absent)
                                                 for column in AGENT_INPUT_COLUMNS)
        default_loop = self.config.agent.default_agent_loop or "tool_agent"
        trajectories = []
        for i in range(rows):
            extra = extra_infos[i] if isinstance(extra_infos[i], Mapping) else {}
            name = agent_names[i] or default_loop
            if name not in AGENT_LOOPS:
                raise ValueError(f"prompt row {i} has agent_name={name!r}; the agent loops are {AGENT_LOOPS}")
            tools_kwargs = extra.get("tools_kwargs") or {}
            unknown = sorted(set(tools_kwargs) - set(self.tools))
            if unknown:
                raise ValueError(f"prompt row {i}: extra_info.tools_kwargs names tools {unknown} that are not loaded; "
                                 f"loaded: {sorted(self.tools)} (multi_turn.tool_config_path / function_tool_path)")
            interaction = dict(extra.get("interaction_kwargs") or {})
            chosen = interaction.pop("name", None)
            if interaction and chosen is None:
                raise ValueError(f"prompt row {i}: extra_info.interaction_kwargs has no `name` of the interaction to "
                                 f"run; loaded: {sorted(self.interactions)}")
            if chosen is not None and chosen not in self.interactions:
                raise ValueError(f"prompt row {i}: extra_info.interaction_kwargs.name={chosen!r} is not loaded; loaded: "
                                 f"{sorted(self.interactions)} (multi_turn.interaction_config_path)")
            prompt = input_ids[i][attention_mask[i].bool()].tolist()
            chat = [dict(m) for m in raw_prompts[i]] if isinstance(raw_prompts[i], (list, np.ndarray)) else []
            trajectories += [Trajectory(prompt, name, tools_kwargs, prompt_messages=chat, interaction=chosen,
                                        interaction_kwargs=interaction) for _ in range(n)]
        return trajectories

    def _model_turn(self, active: list[Trajectory], meta_info: Mapping[str, Any], turn: int,
                    stop_ids: set[int], device: torch.device) -> None:
        limit = self.config.response_length
        rooms = [t.room(limit) for t in active]
        context = max(len(t.prompt_ids) + len(t.response_ids) for t in active)
        columns = [left_pad(t.prompt_ids + t.response_ids, context, self.pad_token_id) for t in active]
        batch = DataProto.from_dict({key: torch.stack([c[k] for c in columns])  # each (active, context)
                                     for k, key in enumerate(("input_ids", "attention_mask", "position_ids"))})
        batch.to(device)  # built from token lists on the CPU; the engine generates on the prompts' device
        batch.meta_info = {k: v for k, v in meta_info.items() if k in CALL_OVERRIDES}
        batch.meta_info.update(n=1, response_length=max(rooms))
        if meta_info.get("seed") is not None:
            batch.meta_info["seed"] = int(meta_info["seed"]) + TURN_SEED_STRIDE * turn
        out = self.engine.generate_sequences(batch)
        lengths = out.batch["response_mask"].sum(dim=-1).tolist()
        for i, (t, room) in enumerate(zip(active, rooms, strict=True)):
            # a row past its own budget: its first `room` tokens are exactly a sample with that budget
            keep = min(int(lengths[i]), room)
            ids = out.batch["responses"][i, :keep].tolist()
            t.append(ids, True, out.batch["rollout_log_probs"][i, :keep].tolist())
            t.assistant_turns += 1
            if not ids or ids[-1] not in stop_ids:
                t.end(Finish.LENGTH)
            else:
                t.messages.append({"role": "assistant", "content": self.tokenizer.decode(ids[:-1])})
                self._after_model_turn(t, self.tokenizer.decode(ids, skip_special_tokens=True))

    def _after_model_turn(self, t: Trajectory, text: str) -> None:
        calls = self.parse(text) if t.agent_name == "tool_agent" else []
        max_assistant, max_user = self.config.multi_turn.max_assistant_turns, self.config.multi_turn.max_user_turns
        if not calls and (t.interaction is None or t.agent_name != "tool_agent"):
            t.end(Finish.ANSWER)
        elif max_assistant is not None and t.assistant_turns >= max_assistant:
            t.end(Finish.ASSISTANT_TURNS)
        elif max_user is not None and t.user_turns >= max_user:
            t.end(Finish.USER_TURNS)
        elif calls:
            t.state, t.pending = AgentState.CALLING_TOOLS, calls
        else:  # the row's interaction answers
            t.state = AgentState.INTERACTING

    def _tool_turn(self, calling: list[Trajectory]) -> None:
        if not calling:
            return
        # per trajectory, per call: the error, or None until executed
        replies = [[self._call_problem(t, j, call) for j, call in enumerate(t.pending)] for t in calling]
        self._create_instances(calling, replies)
        self._execute(calling, replies)
        for t, texts in zip(calling, replies, strict=True):
            messages = [{"role": "tool", "content": text} for text in texts]
            t.messages += messages
            self._append_context(t, self.delta.ids_after_turn(messages))

    def _interaction_turn(self, asking: list[Trajectory]) -> None:
        """Each trajectory's interaction replies as the user (started first where needed); a failure ends it."""
        starting = [t for t in asking if t.interaction_id is None]
        started = self._run([partial(self.interactions[t.interaction].start_interaction, None, **t.interaction_kwargs)
                             for t in starting])
        for t, outcome in zip(starting, started, strict=True):
            if outcome.ok and isinstance(outcome.value, str):
                t.interaction_id = outcome.value
            else:
                t.count_failure(outcome)
                t.end(Finish.INTERACTION_ERROR)
        asking = [t for t in asking if t.state is AgentState.INTERACTING]
        # the whole conversation, as verl passes it: the prompt's chat (with data.return_raw_chat) and the turns
        replies = self._run([partial(self.interactions[t.interaction].generate_response, t.interaction_id,
                                     t.prompt_messages + t.messages, **t.interaction_kwargs) for t in asking])
        for t, outcome in zip(asking, replies, strict=True):
            try:
                if not outcome.ok:
                    raise RuntimeError(outcome.error)
                stop, reply, score, _ = outcome.value
            except (RuntimeError, TypeError, ValueError):
                t.count_failure(outcome)
                t.end(Finish.INTERACTION_ERROR)
                continue
            if score is not None:
                t.turn_scores.append(float(score))
            message = {"role": "user", "content": str(reply)}
            t.messages.append(message)
            self._append_context(t, self.delta.ids_after_turn([message]))
            if stop and t.state is not AgentState.DONE:
                t.end(Finish.INTERACTION)

    def _call_problem(self, t: Trajectory, index: int, call: ParsedCall | CallError) -> str | None:
        """Why a call cannot run (the message the model reads), or None; counts the failure."""
        problem = None
        if isinstance(call, CallError):
            problem = call.message
        elif index >= self.config.multi_turn.max_parallel_calls:
            problem = f"only {self.config.multi_turn.max_parallel_calls} tool call(s) run per turn; this one did not"
        elif call.name not in self.tools:
            problem = f"there is no tool named {call.name!r}; the tools are {sorted(self.tools)}"
        t.tool_calls += 1
        if problem is not None:
            t.tool_errors += 1
            return f"Error: {problem}"
        return None

    def _runnable(self, calling: list[Trajectory], replies: list[list[str | None]]):
        for t, texts in zip(calling, replies, strict=True):
            for j, call in enumerate(t.pending):
                if texts[j] is None:
                    yield t, texts, j, call

    def _create_instances(self, calling: list[Trajectory], replies: list[list[str | None]]) -> None:
        needed = {(id(t), call.name): t for t, _, _, call in self._runnable(calling, replies)
                  if call.name not in t.instances}
        created = self._run([partial(self.tools[name].create, **t.kwargs_for(name, "create_kwargs"))
                             for (_, name), t in needed.items()])
        failed: dict[tuple[int, str], str] = {}
        for ((key, name), t), outcome in zip(needed.items(), created, strict=True):
            try:
                if not outcome.ok:
                    raise RuntimeError(outcome.error)
                t.instances[name] = _created_id(outcome.value)
            except (RuntimeError, TypeError) as err:
                t.count_failure(outcome)
                failed[(key, name)] = f"Error: the tool {name!r} could not start: {err}"
        for t, texts, j, call in list(self._runnable(calling, replies)):
            texts[j] = failed.get((id(t), call.name))  # None (still to execute) unless the instance failed

    def _execute(self, calling: list[Trajectory], replies: list[list[str | None]]) -> None:
        runnable = list(self._runnable(calling, replies))
        executed = self._run([partial(self.tools[call.name].execute, t.instances[call.name], call.arguments,
                                      **t.kwargs_for(call.name, "execute_kwargs")) for t, _, _, call in runnable])
        for (t, texts, j, _), outcome in zip(runnable, executed, strict=True):
            t.tool_latencies.append(outcome.seconds)
            try:
                if not outcome.ok:
                    raise RuntimeError(outcome.error)
                text, reward = _executed(outcome.value)
            except (RuntimeError, TypeError) as err:
                t.count_failure(outcome)
                texts[j] = f"Error: {err}"
                continue
            t.tool_rewards.append(reward)
            texts[j] = truncate_text(text, self.config.multi_turn.max_tool_response_length,
                                     self.config.multi_turn.tool_response_truncate_side)

    def _append_context(self, t: Trajectory, ids: list[int]) -> None:
        room = t.room(self.config.response_length)
        t.append(ids[:room], False)
        t.user_turns += 1
        if len(ids) >= room:  # no room left for the model to answer
            t.end(Finish.LENGTH)
        else:
            t.state, t.pending = AgentState.GENERATING, []

    def _close_instances(self, trajectories: list[Trajectory]) -> None:
        """Finalize every interaction the trajectories started; calc_reward, then release, every tool instance."""
        owned = [(t, name, instance) for t in trajectories for name, instance in t.instances.items()]
        talked = [t for t in trajectories if t.interaction_id is not None]
        finalized = self._run([partial(self.interactions[t.interaction].finalize_interaction, t.interaction_id)
                               for t in talked])
        for t, outcome in zip(talked, finalized, strict=True):
            if not outcome.ok:
                t.count_failure(outcome)
        for method, stage in (("calc_reward", "calc_reward_kwargs"), ("release", "release_kwargs")):
            outcomes = self._run([partial(getattr(self.tools[name], method), instance, **t.kwargs_for(name, stage))
                                  for t, name, instance in owned])
            for (t, name, _), outcome in zip(owned, outcomes, strict=True):
                if not outcome.ok:
                    t.count_failure(outcome)
                elif method == "calc_reward":
                    value = outcome.value
                    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                        t.count_failure(outcome)
                    else:
                        t.reward_scores[name] = float(value)

    def _run(self, calls: list[Callable[[], Any]]) -> list[CallOutcome]:
        """Run the calls (coroutine factories) at once, each under multi_turn.tool_timeout."""
        return self.runner.run([(call, self.config.multi_turn.tool_timeout) for call in calls])

    def _assemble(self, prompts: DataProto, trajectories: list[Trajectory], n: int) -> DataProto:
        width, device = self.config.response_length, prompts.batch["input_ids"].device

        def padded(rows: list[list], fill: float, dtype: torch.dtype) -> torch.Tensor:  # (B*n, R), right-padded
            return torch.tensor([list(row) + [fill] * (width - len(row)) for row in rows], dtype=dtype, device=device)

        responses = padded([t.response_ids for t in trajectories], self.pad_token_id, torch.long)
        model_mask = padded([t.model_mask for t in trajectories], 0, torch.long)
        log_probs = padded([t.log_probs for t in trajectories], 0.0, torch.float32)
        lengths = torch.tensor([len(t.response_ids) for t in trajectories], device=device)  # (B*n,)
        inputs = prompts.select(batch_keys=list(prompts.batch.keys()), non_tensor_batch_keys=[
            key for key in prompts.non_tensor_batch if key not in AGENT_INPUT_COLUMNS])
        output = assemble_output(inputs, responses, lengths, log_probs, n)
        # only the model's tokens count; the others' log-probs are already 0 (Trajectory.append)
        output.batch["response_mask"] = model_mask.to(output.batch["response_mask"])
        output.non_tensor_batch.update(sample_columns(trajectories))
        return output
