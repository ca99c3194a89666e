"""The weight sync from the training pool to a rollout pool of its own: the split layout's counterpart of the
colocated hand-off `rollout.serving` (docs/placement.md).

`WeightSync.connect` plans the transfer once: the actor's weights in its own order, checked against what
the rollout takes, cut into buckets of `rollout.checkpoint_engine.update_weights_bucket_megabytes` in the
rollout's dtype; then the actor's rank 0 and every rollout rank join a process group of their own. `sync`
moves the actor's current weights: every actor rank gathers them (FSDP), rank 0 broadcasts each bucket
(hybridrl/workers/weight_transfer.py), and the rollout generates with them from then on, reporting their
version with every batch (`meta_info["weight_version"]`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from hybridrl.workers.weight_transfer import BucketPlan

MEGABYTE = 2**20


def _results(*calls: tuple[Any, list]) -> list[list]:
    """The values of non-blocking calls on several Ray worker groups, waited on together: a rank that died on
    either side stops the wait at once, named by its pool and rank."""
    from hybridrl.controller.ray import get_naming_dead

    labelled = [(future, group.describe_rank(rank)) for group, futures in calls for rank, future in enumerate(futures)]
    values = get_naming_dead(labelled, "the weight sync")
    out, start = [], 0
    for _, futures in calls:
        out.append(values[start:start + len(futures)])
        start += len(futures)
    return out


def check_names(manifest: list[tuple[str, tuple[int, ...]]], shapes: dict[str, tuple[int, ...]] | None) -> None:
    """The actor sends exactly the weights the rollout takes, each in the rollout's shape, or a clear error."""
    if shapes is None:
        return
    sent = dict(manifest)
    missing, extra = sorted(set(shapes) - set(sent)), sorted(set(sent) - set(shapes))
    wrong = sorted(name for name in set(sent) & set(shapes) if tuple(sent[name]) != tuple(shapes[name]))
    if missing or extra or wrong:
        raise RuntimeError(
            f"the actor's weights do not fit the rollout's model: the rollout lacks {extra[:3]}, the actor lacks "
            f"{missing[:3]}, shapes differ for {wrong[:3]}. Both load actor_rollout_ref.model.path; a model class "
            f"that renames its weights when loaded (actor_rollout_ref.model.override_config) cannot be synced")


@dataclass
class WeightSync:
    """The planned transfer between the actor's group and the rollout's group (both typed handles), and the
    version the rollout holds (None until the first sync)."""

    actor: Any  # ActorRolloutRefGroup of the training pool
    rollout: Any  # ActorRolloutRefGroup of the rollout pool
    plan: BucketPlan
    version: int | None = None

    @classmethod
    def connect(cls, actor: Any, rollout: Any, bucket_megabytes: int, timeout_s: float) -> WeightSync:
        manifest = actor.weight_manifest()[0]
        spec = rollout.rollout_weight_spec()[0]
        check_names(manifest, spec["shapes"])
        plan = BucketPlan.from_manifest(manifest, spec["dtype"], bucket_megabytes * MEGABYTE)
        host, port = actor.host_weight_sync()
        world_size = 1 + rollout.world_size
        _results((actor.group, actor.join_weight_sync(host, port, world_size, timeout_s)),
                 (rollout.group, rollout.join_weight_sync(host, port, world_size, timeout_s)))
        return cls(actor, rollout, plan)

    def sync(self, version: int) -> dict[str, float]:
        """Move the actor's current weights into every rollout rank, as `version`; returns the sync's metrics."""
        start = time.perf_counter()
        sent, _ = _results((self.actor.group, self.actor.send_weights(self.plan, version)),
                           (self.rollout.group, self.rollout.receive_weights(self.plan, version)))
        seconds = time.perf_counter() - start
        self.version = version
        payload = self.plan.total_bytes
        return {
            "timing_s/weight_sync": seconds,
            "perf/weight_sync_bytes": float(payload),
            "perf/weight_sync_gbps": payload / seconds / 1e9,
            # the actor's side alone: gathering its shards and sending (the rest is the driver's round trip)
            "timing_s/weight_sync_send": sent[0]["seconds"],
        }
