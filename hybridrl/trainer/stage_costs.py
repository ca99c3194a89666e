"""What each stage of a step cost on the workers: their own time, and the model FLOPs of each model pass.

The trainer hands every worker call's output to `StageCosts.record`, which takes the ranks' own seconds
out of it (filed as `<stage>_worker` in the step's timing, next to the driver's `<stage>`) and adds the
pass's model FLOPs over the real tokens the call processed; `mfu_metrics` turns both into
`perf/mfu/<pass>` against the peaks the workers measured at start (`Worker.model_passes`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, MutableMapping

from hybridrl.protocol import DataProto
from hybridrl.trainer.metrics import compute_mfu_metrics
from hybridrl.utils.flops import ModelPass
from hybridrl.utils.metric import pop_worker_seconds, worker_stage

# The trainer's stages that run a model pass, and the pass's name in `perf/mfu/<name>`.
STAGE_PASSES = {"gen": "rollout", "old_log_prob": "actor_infer", "ref": "ref", "values": "critic_infer",
                "update_critic": "critic", "update_actor": "actor"}


def real_tokens(data: DataProto) -> int:
    """Attended (prompt + response) tokens of a batch: what the model FLOPs count."""
    return int(data.batch["attention_mask"].sum())


class StageCosts:
    """Accumulates one step's worker seconds and model FLOPs per pass (a stage may run more than once)."""

    def __init__(self, passes: Mapping[str, ModelPass]) -> None:
        self.passes = dict(passes)
        self.flops: dict[str, float] = defaultdict(float)
        self.seconds: dict[str, float] = defaultdict(float)

    def start_step(self) -> None:
        self.flops.clear()
        self.seconds.clear()

    def record(self, stage: str, output: DataProto, tokens: int, timing: MutableMapping[str, float]) -> None:
        """File the workers' seconds of one `stage` call; count its FLOPs over `tokens` real tokens."""
        seconds = pop_worker_seconds(output.meta_info)
        if seconds is None:  # a worker class that does not time itself
            return
        name = worker_stage(stage)
        timing[name] = timing.get(name, 0.0) + seconds
        model_pass = self.passes.get(STAGE_PASSES.get(stage, ""))
        if model_pass is not None:
            self.flops[STAGE_PASSES[stage]] += model_pass.flops(tokens)
            self.seconds[STAGE_PASSES[stage]] += seconds

    def mfu_metrics(self) -> dict[str, float]:
        peaks = {name: p.peak_flops for name, p in self.passes.items()}
        return compute_mfu_metrics(self.flops, self.seconds, peaks)
