"""StageCosts: the workers' own seconds beside the driver's, and MFU per model pass, by hand."""

from __future__ import annotations

import pytest
import torch

from hybridrl.protocol import DataProto
from hybridrl.trainer.metrics import StageCosts, real_tokens
from hybridrl.utils.metric import WORKER_SECONDS, ModelPass


def collected(seconds_per_rank: list[float], **metrics) -> DataProto:
    """A worker group's collected output: one seconds entry per rank, as concat gathers them."""
    return DataProto(meta_info={"metrics": {WORKER_SECONDS: seconds_per_rank, **metrics}})


def test_worker_seconds_and_mfu_per_pass():
    # a 1,000-parameter model on 2 ranks of 1e6 FLOP/s each (2e6 together), 1 epoch per update
    costs = StageCosts({"actor": ModelPass(1000, 6, 1, 2e6), "rollout": ModelPass(1000, 2, 1, 2e6)})
    timing = {"gen": 0.6, "update_actor": 2.0}  # the driver's own timers
    costs.start_step()
    costs.record("gen", collected([0.3, 0.5]), tokens=100, timing=timing)
    costs.record("gen", collected([0.4, 0.2]), tokens=50, timing=timing)  # a second round (filter_groups)
    update = collected([1.5, 1.8], **{"actor/pg_loss": [0.1, 0.2]})
    costs.record("update_actor", update, tokens=200, timing=timing)
    # slowest ranks: gen 0.5 + 0.4 = 0.9 s, update 1.8 s; the driver's entries are untouched
    assert timing == {"gen": 0.6, "update_actor": 2.0, "gen_worker": pytest.approx(0.9), "update_actor_worker": 1.8}
    assert update.meta_info["metrics"] == {"actor/pg_loss": [0.1, 0.2]}
    # rollout: 2 x 1000 x 150 = 3e5 FLOPs / (0.9 s x 2e6) = 1/6; actor: 6 x 1000 x 200 = 1.2e6 / (1.8 x 2e6) = 1/3
    assert costs.mfu_metrics() == {"perf/mfu/rollout": pytest.approx(1 / 6), "perf/mfu/actor": pytest.approx(1 / 3)}
    costs.start_step()
    assert costs.mfu_metrics() == {}


def test_stages_without_a_pass_or_without_worker_time():
    costs = StageCosts({})
    timing: dict[str, float] = {}
    costs.record("gen_baseline", collected([0.25]), tokens=10, timing=timing)
    costs.record("values", DataProto(), tokens=10, timing=timing)  # a worker that does not time itself
    assert timing == {"gen_baseline_worker": 0.25}
    assert costs.mfu_metrics() == {}


def test_real_tokens_count_the_attention_mask():
    batch = DataProto.from_dict({"attention_mask": torch.tensor([[0, 1, 1], [1, 1, 1]])})
    assert real_tokens(batch) == 5
