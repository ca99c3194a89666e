"""The trainer's typed handles on its worker groups: one class per role, one method per worker method.

`groups.actor_rollout.generate_sequences(batch)` in the trainer lands on
`ActorRolloutRefGroup.generate_sequences`, which names `ActorRolloutRefWorker.generate_sequences`, the
code each rank runs on its share of the batch. Each method has its worker method's parameters; what it
returns is what the dispatch mode collects (`TypedWorkerGroup`, hybridrl/controller/worker_group.py).
tests/trainer/test_role_groups.py holds every method here to its worker method's signature.
"""

from __future__ import annotations

from typing import Any

from hybridrl.controller.worker_group import TypedWorkerGroup
from hybridrl.protocol import DataProto
from hybridrl.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker
from hybridrl.workers.reward_model import RewardModelWorker
from hybridrl.workers.sft_worker import SFTWorker


class ActorRolloutRefGroup(TypedWorkerGroup):
    """Actor, rollout and (with a reference role) reference policy, on every rank of the pool."""

    worker_cls = ActorRolloutRefWorker

    def init_model(self) -> None:
        self.group.call(ActorRolloutRefWorker.init_model)

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """`rollout.n` responses per prompt, rows grouped by prompt (layout: hybridrl/workers/rollout/base.py)."""
        return self.group.call(ActorRolloutRefWorker.generate_sequences, prompts)

    def compute_log_prob(self, data: DataProto) -> DataProto:
        """`old_log_probs` and `entropys` under the current actor."""
        return self.group.call(ActorRolloutRefWorker.compute_log_prob, data)

    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """`ref_log_prob` under the reference policy."""
        return self.group.call(ActorRolloutRefWorker.compute_ref_log_prob, data)

    def update_actor(self, data: DataProto) -> DataProto:
        """One policy update on the batch; the metrics come back in `meta_info["metrics"]`."""
        return self.group.call(ActorRolloutRefWorker.update_actor, data)

    def save_checkpoint(self, local_path: str, hdfs_path: str | None = None, global_step: int = 0,
                        max_ckpt_to_keep: int | None = None) -> None:
        self.group.call(ActorRolloutRefWorker.save_checkpoint, local_path, hdfs_path, global_step,
                        max_ckpt_to_keep)

    def load_checkpoint(self, local_path: str, hdfs_path: str | None = None,
                        del_local_after_load: bool = False) -> None:
        self.group.call(ActorRolloutRefWorker.load_checkpoint, local_path, hdfs_path, del_local_after_load)


class CriticGroup(TypedWorkerGroup):
    """The value model."""

    worker_cls = CriticWorker

    def init_model(self) -> None:
        self.group.call(CriticWorker.init_model)

    def compute_values(self, data: DataProto) -> DataProto:
        """`values` of every response token."""
        return self.group.call(CriticWorker.compute_values, data)

    def update_critic(self, data: DataProto) -> DataProto:
        """One value update on the batch; the metrics come back in `meta_info["metrics"]`."""
        return self.group.call(CriticWorker.update_critic, data)

    def save_checkpoint(self, local_path: str, hdfs_path: str | None = None, global_step: int = 0,
                        max_ckpt_to_keep: int | None = None) -> None:
        self.group.call(CriticWorker.save_checkpoint, local_path, hdfs_path, global_step, max_ckpt_to_keep)

    def load_checkpoint(self, local_path: str, hdfs_path: str | None = None,
                        del_local_after_load: bool = False) -> None:
        self.group.call(CriticWorker.load_checkpoint, local_path, hdfs_path, del_local_after_load)


class RewardModelGroup(TypedWorkerGroup):
    """A learned reward model that scores whole sequences."""

    worker_cls = RewardModelWorker

    def init_model(self) -> None:
        self.group.call(RewardModelWorker.init_model)

    def compute_rm_score(self, data: DataProto) -> DataProto:
        """`rm_scores`: each sequence's score on its last valid response token."""
        return self.group.call(RewardModelWorker.compute_rm_score, data)


class SFTGroup(TypedWorkerGroup):
    """The SFT trainer's ranks (hybridrl/trainer/sft_trainer.py)."""

    worker_cls = SFTWorker

    def init_model(self, total_training_steps: int) -> list[dict[str, int]]:
        return self.group.call(SFTWorker.init_model, total_training_steps)

    def train_batch(self, data: DataProto) -> list[dict[str, float]]:
        """One optimizer step over the global batch; every rank returns the same all-reduced metrics."""
        return self.group.call(SFTWorker.train_batch, data)

    def eval_batch(self, data: DataProto) -> DataProto:
        return self.group.call(SFTWorker.eval_batch, data)

    def save_checkpoint(self, local_path: str, global_step: int, max_ckpt_to_keep: int | None = None,
                        hf_model: bool = False) -> list[str]:
        return self.group.call(SFTWorker.save_checkpoint, local_path, global_step, max_ckpt_to_keep, hf_model)

    def load_checkpoint(self, local_path: str) -> list[dict[str, Any]]:
        return self.group.call(SFTWorker.load_checkpoint, local_path)
