"""What the agent loop reports: per-sample columns on the rollout output, and the step's metrics from them.

Columns (numpy object arrays, one entry per response, next to `uid`, `extra_info`, ...):

    __num_turns__          turns in the conversation: the prompt, each assistant turn, each tool turn
    tool_calls             tool calls the model wrote (malformed ones included)
    tool_errors            calls answered with an error (bad JSON, unknown tool, raised, timed out,
                           returned garbage), plus failed create / calc_reward / release calls
    tool_timeouts          the part of tool_errors that ran out of multi_turn.tool_timeout
    tool_latency_s         seconds of each execute call (list of floats)
    agent_finish           why the trajectory ended: answer, length, max_assistant_turns, max_user_turns
    tool_rewards           execute's step rewards, in call order (list of floats)
    reward_scores          calc_reward per tool name (dict), as verl's rollouts report them
    tokenization_mismatch  1 when the turn-by-turn ids differ from the conversation tokenised at once,
                           0 when they agree, None when not checked (cut by the length limit, or the
                           check is disabled: hybridrl/workers/rollout/tokenization_check.py)

The reward managers hand `__num_turns__`, `reward_scores` and `tool_rewards` to the reward function in
`extra_info` (`num_turns`, `rollout_reward_scores`, `tool_rewards`: hybridrl/rewards/managers.py).
Validation reports the numeric columns per data source (`val-aux/<source>/tool_calls/mean@1`, ...).
"""

from __future__ import annotations

import numpy as np

from hybridrl.protocol import DataProto

NUMERIC_COLUMNS = ("__num_turns__", "tool_calls", "tool_errors", "tool_timeouts")
FINISH_COLUMN = "agent_finish"
FINISH_REASONS = ("answer", "length", "max_assistant_turns", "max_user_turns")


def compute_agent_metrics(batch: DataProto) -> dict[str, float]:
    """`agent/*` metrics of a step's batch; empty when the rollout was single-turn (no agent columns).

    agent/num_turns/{mean,min,max}, agent/tool_calls/mean (per sample), agent/tool_errors and
    agent/tool_timeouts (counts in the step), agent/tool_latency_s/{mean,max} (seconds per execute call),
    agent/tokenization_mismatch (count of checked samples whose ids differ), agent/finish/<reason>
    (share of samples).
    """
    columns = batch.non_tensor_batch
    if "__num_turns__" not in columns:
        return {}
    turns = np.asarray(columns["__num_turns__"], dtype=float)
    calls = np.asarray(columns["tool_calls"], dtype=float)
    errors = np.asarray(columns["tool_errors"], dtype=float)
    metrics = {
        "agent/num_turns/mean": float(turns.mean()),
        "agent/num_turns/min": float(turns.min()),
        "agent/num_turns/max": float(turns.max()),
        "agent/tool_calls/mean": float(calls.mean()),
        "agent/tool_errors": float(errors.sum()),
        "agent/tool_timeouts": float(np.asarray(columns["tool_timeouts"], dtype=float).sum()),
    }
    latencies = [seconds for row in columns["tool_latency_s"] for seconds in row]
    if latencies:
        metrics["agent/tool_latency_s/mean"] = float(np.mean(latencies))
        metrics["agent/tool_latency_s/max"] = float(np.max(latencies))
    checked = [flag for flag in columns.get("tokenization_mismatch", ()) if flag is not None]
    if checked:
        metrics["agent/tokenization_mismatch"] = float(sum(checked))
    finishes = list(columns[FINISH_COLUMN])
    for reason in FINISH_REASONS:
        metrics[f"agent/finish/{reason}"] = finishes.count(reason) / len(finishes)
    return metrics
