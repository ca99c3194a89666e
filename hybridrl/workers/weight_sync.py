"""The weight sync between pools: the actor's rank 0 broadcasts the full weights, bucket by bucket in the
rollout's dtype, to every rollout rank over a process group of their own (gloo on CPU, NCCL on GPU).

The group spans two pools, each with its own default process group, so it is built directly on a TCP store
that the actor's rank 0 hosts (`host_store`) and is used through its own handle, never as a default group.
Both ends follow one `BucketPlan`, made once from the actor's weight list (`weight_manifest`). The driver's
side is `WeightSync`, the split layout's counterpart of the colocated hand-off `rollout.serving`
(docs/placement.md); the rollout reports the version of its weights with every batch
(`meta_info["weight_version"]`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from hybridrl.controller.worker import (
    bind_sockets_to_node_address,
    check_ranks_reach_each_other,
    check_store_reachable,
)
from hybridrl.models.loading import resolve_dtype

SYNC_STORE_PREFIX = "hybridrl_weight_sync"  # the sync group's keys in the store it may share with others
SYNC_ROOT = 0  # the actor's rank 0 is rank 0 of the sync group; rollout rank r is rank r + 1


@dataclass(frozen=True)
class TensorSlot:
    name: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class BucketPlan:
    """The weights in the actor's order, cut into buckets of at most `bucket_bytes` each (a tensor larger than
    that travels alone), sent in `dtype` (the rollout's)."""

    dtype: str
    buckets: tuple[tuple[TensorSlot, ...], ...]

    @classmethod
    def from_manifest(cls, manifest: Iterable[tuple[str, tuple[int, ...]]], dtype: str, bucket_bytes: int) -> BucketPlan:
        item = resolve_dtype(dtype).itemsize
        buckets: list[tuple[TensorSlot, ...]] = []
        current: list[TensorSlot] = []
        size = 0
        for name, shape in manifest:
            slot = TensorSlot(name, tuple(shape))
            if current and size + slot.numel * item > bucket_bytes:
                buckets.append(tuple(current))
                current, size = [], 0
            current.append(slot)
            size += slot.numel * item
        if current:
            buckets.append(tuple(current))
        return cls(dtype, tuple(buckets))

    @property
    def torch_dtype(self) -> torch.dtype:
        return resolve_dtype(self.dtype)

    @property
    def names(self) -> list[str]:
        return [slot.name for bucket in self.buckets for slot in bucket]

    @property
    def total_bytes(self) -> int:
        return sum(slot.numel for bucket in self.buckets for slot in bucket) * self.torch_dtype.itemsize


def weight_manifest(pairs: Iterable[tuple[str, torch.Tensor]]) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every weight, in the order the pairs come."""
    return [(name, tuple(tensor.shape)) for name, tensor in pairs]


def host_store() -> tuple[dist.TCPStore, int]:
    """The sync group's TCP store, hosted by the actor's rank 0 on a port of the OS's choosing: (store, port)."""
    store = dist.TCPStore("0.0.0.0", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=300))
    return store, store.port


class SyncGroup:
    """One end of the process group between the actor's rank 0 and the rollout ranks."""

    def __init__(self, store: dist.Store, rank: int, world_size: int, device: torch.device,
                 timeout_s: float) -> None:
        prefixed = dist.PrefixStore(SYNC_STORE_PREFIX, store)
        timeout = timedelta(seconds=timeout_s)
        if device.type == "cuda":
            self.group = dist.ProcessGroupNCCL(prefixed, rank, world_size, dist.ProcessGroupNCCL.Options())
        else:
            self.group = dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)
        self.rank, self.world_size, self.device = rank, world_size, device

    @classmethod
    def join(cls, host: str, port: int, rank: int, world_size: int, device: torch.device,
             timeout_s: float, store: dist.Store | None = None) -> SyncGroup:
        """Join as `rank` (the store's host passes its own store); the pools may be on different hosts, so a rank
        that cannot reach the store or another member fails naming both addresses (hybridrl/controller/worker.py)."""
        address = bind_sockets_to_node_address()
        if store is None:
            if address is not None:
                check_store_reachable(host, port, rank, address)
            store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_s))
        if address is not None:
            check_ranks_reach_each_other(dist.PrefixStore(SYNC_STORE_PREFIX, store), rank, world_size, address)
        return cls(store, rank, world_size, device, timeout_s)

    def broadcast(self, tensor: torch.Tensor) -> None:
        self.group.broadcast(tensor, SYNC_ROOT).wait()


def send_weights(pairs: Iterable[tuple[str, torch.Tensor]], plan: BucketPlan, group: SyncGroup | None) -> int:
    """Consume `pairs` (on every actor rank: gathering a sharded weight is a collective); on the rank holding the
    sync group, pack each bucket in the plan's dtype and broadcast it. Returns the bytes sent (0 elsewhere)."""
    pairs = iter(pairs)
    sent = 0
    for bucket in plan.buckets:
        size = sum(slot.numel for slot in bucket)
        flat = None if group is None else torch.empty(size, dtype=plan.torch_dtype, device=group.device)
        offset = 0
        for slot in bucket:
            name, tensor = next(pairs, (None, None))
            if name != slot.name or tuple(tensor.shape) != slot.shape:
                raise RuntimeError(
                    f"weight sync: the actor's weights changed since the sync was planned: expected {slot.name} "
                    f"{slot.shape}, got {name} {None if tensor is None else tuple(tensor.shape)}")
            if flat is not None:
                flat[offset:offset + slot.numel].copy_(tensor.reshape(-1))  # casts to the rollout's dtype
            offset += slot.numel
        if group is not None:
            group.broadcast(flat)
            sent += flat.numel() * flat.element_size()
    leftover = next(pairs, None)
    if leftover is not None:
        raise RuntimeError(f"weight sync: the actor has a weight the plan lacks ({leftover[0]}); it was planned "
                           f"on other weights")
    return sent


def receive_weights(plan: BucketPlan, group: SyncGroup) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of every weight as its bucket arrives; a tensor is a view of its bucket, so copy it before
    asking for the next bucket's weights if it must outlive them."""
    for bucket in plan.buckets:
        flat = torch.empty(sum(slot.numel for slot in bucket), dtype=plan.torch_dtype, device=group.device)
        group.broadcast(flat)
        offset = 0
        for slot in bucket:
            yield slot.name, flat[offset:offset + slot.numel].view(slot.shape)
            offset += slot.numel

MEGABYTE = 2**20


def _results(*calls: tuple[Any, list]) -> list[list]:
    """The values of non-blocking calls on several Ray worker groups, waited on together: a rank that died on
    either side stops the wait at once, named by its pool and rank."""
    from hybridrl.controller.ray import get_naming_dead

    labelled = [(future, group.describe_rank(rank)) for group, futures in calls for rank, future in enumerate(futures)]
    values = iter(get_naming_dead(labelled, "the weight sync"))
    return [[next(values) for _ in futures] for _, futures in calls]


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
        """Plan the transfer once (the actor's weights in its order, checked against what the rollout takes, in
        buckets of `rollout.checkpoint_engine.update_weights_bucket_megabytes`); the actor's rank 0 and every
        rollout rank join the group."""
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
        """Move the actor's current weights into every rollout rank, as `version` (every actor rank gathers them,
        rank 0 broadcasts each bucket); returns the sync's metrics."""
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
