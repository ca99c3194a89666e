"""Typed settings of the rollout (`actor_rollout_ref.rollout.*`), under verl's key names.

This dataclass is the one home of the rollout's defaults; Hydra YAML composes on top of it and
`hybridrl.workers.config.to_dataclass(RolloutConfig, node)` builds it from a dict or OmegaConf node
with type checks. Keys that only the vLLM engine reads are kept so verl launch scripts run unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def _check_sampling(where: str, temperature: float, top_k: int, top_p: float, n: int) -> None:
    """Raise on values no sampler can use, naming the config key and the valid range."""
    if temperature < 0:
        raise ValueError(f"{where}.temperature must be >= 0 (0 means greedy), got {temperature}")
    if top_k < -1:
        raise ValueError(f"{where}.top_k must be -1 or 0 (off) or a positive count, got {top_k}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"{where}.top_p must be in (0, 1] (1 means off), got {top_p}")
    if n < 1:
        raise ValueError(f"{where}.n must be >= 1 samples per prompt, got {n}")


@dataclass
class ValKwargs:
    """Sampling used when a call's meta_info has `validate=True` (verl's `rollout.val_kwargs`)."""

    # -1 (or 0) turns top-k filtering off
    top_k: int = -1
    # 1.0 turns nucleus filtering off
    top_p: float = 1.0
    # 0 means greedy decoding
    temperature: float = 0.0
    # samples per validation prompt
    n: int = 1
    # False decodes greedily whatever the temperature
    do_sample: bool = False

    def __post_init__(self) -> None:
        _check_sampling("rollout.val_kwargs", self.temperature, self.top_k, self.top_p, self.n)


TRUNCATE_SIDES = ("left", "right", "middle")
CALL_FORMATS = ("hermes",)
SANITY_CHECK_MODES = ("strict", "ignore_strippable", "disable")
AGENT_LOOPS = ("tool_agent", "single_turn_agent")


@dataclass
class MultiTurnConfig:
    """`rollout.multi_turn.*` (verl's keys): the agent loop that lets the model call tools over several turns.

    See hybridrl/workers/rollout/agent_loop.py. Responses then hold every turn, model and tool, within
    `rollout.response_length` tokens; `response_mask` is 1 on the model's tokens only.
    """

    # run the agent loop (generate, parse tool calls, run the tools, continue) instead of one turn
    enable: bool = False
    # most assistant turns per trajectory; null: only the response length limits them
    max_assistant_turns: int | None = None
    # most tool-response turns per trajectory; null: only the response length limits them
    max_user_turns: int | None = None
    # verl's tool YAML (`tools: - class_name, config, tool_schema`)
    tool_config_path: str | None = None
    # a Python file of @function_tool functions (hybridrl.tools.base_tool.function_tool)
    function_tool_path: str | None = None
    # tool calls run per assistant turn; later calls in the same turn are answered with an error
    max_parallel_calls: int = 1
    # characters of a tool response the model sees; the rest is cut
    max_tool_response_length: int = 256
    # which part of a longer tool response is kept: left (the start), right (the end), middle (both ends)
    tool_response_truncate_side: str = "middle"
    # how the model writes tool calls: hermes, <tool_call>{"name": ..., "arguments": {...}}</tool_call>
    format: str = "hermes"
    # seconds each tool call (create, execute, calc_reward, release) may take before it counts as timed out
    # (hybridrl's key; verl has none)
    tool_timeout: float = 30.0
    # after each trajectory, compare its turn-by-turn token ids with the whole conversation tokenised at
    # once: strict counts any difference, ignore_strippable only those beyond whitespace, disable skips the
    # check (the count is agent/tokenization_mismatch; the first mismatch is logged)
    tokenization_sanity_check_mode: str = "strict"
    # verl's keys for features hybridrl does not have; only their off values are accepted:
    # re-rendering earlier turns with an inference-only chat template (the loop keeps every turn's tokens
    # as the model sampled them), interactions (simulated users), and repeated multi-turn rollouts
    use_inference_chat_template: bool = False
    interaction_config_path: str | None = None
    num_repeat_rollouts: int | None = None

    def __post_init__(self) -> None:
        where = "actor_rollout_ref.rollout.multi_turn"
        if self.tokenization_sanity_check_mode not in SANITY_CHECK_MODES:
            raise ValueError(f"{where}.tokenization_sanity_check_mode must be one of {SANITY_CHECK_MODES}, "
                             f"got {self.tokenization_sanity_check_mode!r}")
        if self.tool_response_truncate_side not in TRUNCATE_SIDES:
            raise ValueError(f"{where}.tool_response_truncate_side must be one of {TRUNCATE_SIDES}, "
                             f"got {self.tool_response_truncate_side!r}")
        if self.format not in CALL_FORMATS:
            raise ValueError(f"{where}.format must be one of {CALL_FORMATS}, got {self.format!r}")
        for name in ("max_assistant_turns", "max_user_turns"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{where}.{name} must be null or >= 1, got {value}")
        for name in ("max_parallel_calls", "max_tool_response_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"{where}.{name} must be >= 1, got {getattr(self, name)}")
        if self.tool_timeout <= 0:
            raise ValueError(f"{where}.tool_timeout must be > 0 seconds, got {self.tool_timeout}")


@dataclass
class AgentConfig:
    """`rollout.agent.*` (verl's keys): which agent loop a prompt row without `agent_name` gets."""

    # tool_agent (generate, run the tools called, continue) or single_turn_agent (one turn); null picks
    # tool_agent when multi_turn.enable is set, single_turn_agent otherwise (verl's default is
    # single_turn_agent: a verl recipe that enables multi_turn sets this key or the rows' agent_name)
    default_agent_loop: str | None = None
    # verl's file of custom agent loop classes; only null is accepted (config_rules.UNSUPPORTED)
    agent_loop_config_path: str | None = None

    def __post_init__(self) -> None:
        if self.default_agent_loop is not None and self.default_agent_loop not in AGENT_LOOPS:
            raise ValueError(f"actor_rollout_ref.rollout.agent.default_agent_loop must be null or one of "
                             f"{AGENT_LOOPS}, got {self.default_agent_loop!r}")


@dataclass
class RolloutConfig:
    """`actor_rollout_ref.rollout.*`: which engine generates, and how it samples."""

    # engine registered in hybridrl.workers.rollout.ROLLOUT_ENGINES: "hf" (CPU/GPU) or "vllm" (optional)
    name: str = "hf"
    # softmax temperature; 0 means greedy
    temperature: float = 1.0
    # keep only the k most likely tokens; -1 (or 0) is off
    top_k: int = -1
    # keep the smallest set of tokens whose probability reaches top_p; 1.0 is off
    top_p: float = 1.0
    # prompts are left-padded to this length by the dataset (data.max_prompt_length)
    prompt_length: int = 512
    # responses are generated up to, and right-padded to, exactly this many tokens
    response_length: int = 512
    # samples per prompt (GRPO/RLOO group size)
    n: int = 1
    # False decodes greedily
    do_sample: bool = True
    # compute dtype of generation: float32 | bfloat16 | auto (as fsdp_config.mixed_precision.param_dtype) |
    # null, the default: the device's (bf16 on a bf16 GPU, as verl; fp32 on a CPU, where rollout and
    # trainer log-probs agree within ~1e-5)
    dtype: str | None = None
    # seed of the sampler's torch.Generator (the worker adds its rank); same seed, same samples
    seed: int = 0
    # keep generating past EOS (stop_token_ids still stop)
    ignore_eos: bool = False
    # extra token ids that end a response, on top of the tokenizer's/generation config's EOS ids
    stop_token_ids: list[int] | None = None
    # sampling for validation calls (meta_info validate=True)
    val_kwargs: ValKwargs = field(default_factory=ValKwargs)
    # multi-turn generation with tools (the agent loop); off by default
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    # which loop rows without agent_name run (verl's rollout.agent)
    agent: AgentConfig = field(default_factory=AgentConfig)
    # micro-batch rows / dynamic batching for the actor's log-prob recomputation (read by the worker)
    log_prob_micro_batch_size_per_gpu: int | None = None
    log_prob_use_dynamic_bsz: bool = False
    log_prob_max_token_len_per_gpu: int = 16384
    # the trainer reports rollout/log_prob_diff_* (the engine's rollout_log_probs against the actor's
    # recomputed ones) when True. On by default, unlike verl: the metric is what catches a rollout engine
    # that samples from stale weights (see hybridrl/workers/rollout/base.py).
    calculate_log_probs: bool = True
    # vLLM only: memory share of the KV cache, tensor parallel size
    gpu_memory_utilization: float = 0.5
    tensor_model_parallel_size: int = 1
    # false: CUDA graphs for decoding, vLLM's own and, on a GPU, the hf engine's (one graph per step,
    # hybridrl/workers/rollout/static_decode.py; the hf engine on a CPU always decodes eagerly).
    # null (default): each engine's measured best: graphs for hf on a GPU, where an eager step waits on
    # kernel launches (benchmarks/results/decode_bandwidth_cuda.md), eager for vLLM
    enforce_eager: bool | None = None
    # vLLM only: sleep between phases
    free_cache_engine: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.val_kwargs, dict):  # direct construction with a plain dict
            self.val_kwargs = ValKwargs(**self.val_kwargs)
        if isinstance(self.multi_turn, dict):
            self.multi_turn = MultiTurnConfig(**self.multi_turn)
        if isinstance(self.agent, dict):
            self.agent = AgentConfig(**self.agent)
        _check_sampling("rollout", self.temperature, self.top_k, self.top_p, self.n)
        if self.response_length < 1:
            raise ValueError(f"rollout.response_length must be >= 1, got {self.response_length}")
        if self.prompt_length < 1:
            raise ValueError(f"rollout.prompt_length must be >= 1, got {self.prompt_length}")
