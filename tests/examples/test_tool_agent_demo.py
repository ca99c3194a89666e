"""The tool-use demo end to end, shrunk: task, model, multi-turn SFT, GRPO with the calculator, summary.

Whether it learns is measured by benchmarks/tool_agent_learning.py (results in
benchmarks/results/tool_agent.md); this checks that every stage runs and reports what the README says.
"""

from __future__ import annotations

import json

import pytest
import tool_agent
import torch

from hybridrl.trainer.config_checks import read_run_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_the_demo_runs_every_stage_and_writes_its_summary(tmp_path, monkeypatch):
    threads = torch.get_num_threads()
    monkeypatch.setattr(tool_agent, "TASK", {**tool_agent.TASK, "train_size": 256, "test_size": 16})
    tool_agent.main(["--workdir", str(tmp_path), "--steps", "2", "--sft-steps", "20", "--threads", "1",
                     "--sft", "optim.lr=0.002",
                     "trainer.backend=local", "trainer.n_gpus_per_node=1", "trainer.test_freq=1", "data.train_batch_size=4",
                     "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.rollout.n=4"])
    # --threads 1 held for the demo only: the rest of this process (the test session) keeps its count
    assert torch.get_num_threads() == threads
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["training steps"] == 2
    for key in ("held-out accuracy before", "held-out accuracy after"):
        assert 0.0 <= summary[key] <= 1.0
    for key in ("held-out tool calls per sample before", "held-out tool calls per sample after"):
        assert summary[key] >= 0.0
    assert (tmp_path / summary["trained model"] / "config.json").exists()
    sft_config = read_run_config(tmp_path / "sft" / "global_step_20")
    assert sft_config["optim"]["lr"] == 0.002 and sft_config["optim"]["betas"] == [0.9, 0.95]  # --sft on the recipe
    history = [json.loads(line) for line in (tmp_path / "grpo" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in history if "timing_s/step" in m]
    # the agent loop ran the rollouts: its metrics are in every step
    assert all("agent/num_turns/mean" in m and "agent/tool_calls/mean" in m for m in steps)
    assert all(m["agent/num_turns/min"] >= 2 for m in steps)  # prompt + at least one assistant turn
    assert sum(1 for m in history if tool_agent.TOOL_CALLS_KEY in m) == 3  # before, and after each step
