"""The weight sync's wire: buckets planned by hand, the broadcast over a real gloo group between processes, and
the checks that keep a sync from loading the wrong weights."""

import multiprocessing as mp

import pytest
import torch
import torch.distributed as dist

from hybridrl.workers.weight_sync import (
    BucketPlan,
    SyncGroup,
    TensorSlot,
    host_store,
    receive_weights,
    send_weights,
    weight_manifest,
)

MANIFEST = [("a", (2, 3)), ("b", (4,)), ("c", (10,)), ("d", (1,))]  # 6, 4, 10, 1 values


def names(plan: BucketPlan) -> list[list[str]]:
    return [[slot.name for slot in bucket] for bucket in plan.buckets]


def test_buckets_fill_in_order_up_to_the_size_and_a_large_tensor_travels_alone():
    # fp32: a 24 B, b 16 B (40 <= 40), c 40 B, d 4 B (44 > 40)
    fp32 = BucketPlan.from_manifest(MANIFEST, "float32", bucket_bytes=40)
    assert names(fp32) == [["a", "b"], ["c"], ["d"]]
    assert fp32.total_bytes == 21 * 4 and fp32.names == ["a", "b", "c", "d"]
    # bf16 halves every size: a+b+c = 40 B, then d
    assert names(BucketPlan.from_manifest(MANIFEST, "bf16", bucket_bytes=40)) == [["a", "b", "c"], ["d"]]
    assert names(BucketPlan.from_manifest(MANIFEST, "float32", bucket_bytes=8)) == [["a"], ["b"], ["c"], ["d"]]
    assert BucketPlan.from_manifest([], "float32", 40).buckets == ()
    assert TensorSlot("x", (3, 4, 5)).numel == 60


def weights(seed: int) -> list[tuple[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [(name, torch.randn(shape, generator=generator)) for name, shape in MANIFEST]


def _receiver(rank: int, world_size: int, port: int, dtype: str, queue) -> None:
    group = SyncGroup.join("127.0.0.1", port, rank, world_size, torch.device("cpu"), timeout_s=60)
    plan = BucketPlan.from_manifest(MANIFEST, dtype, bucket_bytes=40)
    queue.put((rank, [(name, tensor.clone()) for name, tensor in receive_weights(plan, group)]))


@pytest.mark.parametrize("dtype", [pytest.param("float32", marks=pytest.mark.slow), "bfloat16"])
def test_every_rollout_rank_receives_the_weights_in_the_rollouts_dtype(dtype):
    world_size = 3  # the actor's rank 0 and two rollout ranks, each a process of its own
    store, port = host_store()
    context = mp.get_context("spawn")
    queue = context.Queue()
    receivers = [context.Process(target=_receiver, args=(rank, world_size, port, dtype, queue))
                 for rank in (1, 2)]
    for process in receivers:
        process.start()
    group = SyncGroup.join("127.0.0.1", port, 0, world_size, torch.device("cpu"), timeout_s=60, store=store)
    plan = BucketPlan.from_manifest(MANIFEST, dtype, bucket_bytes=40)
    sent = send_weights(weights(0), plan, group)
    received = dict(queue.get(timeout=60) for _ in receivers)
    for process in receivers:
        process.join(timeout=60)
        assert process.exitcode == 0
    assert sent == plan.total_bytes == 21 * torch.empty((), dtype=plan.torch_dtype).element_size()
    for rank in (1, 2):
        assert [name for name, _ in received[rank]] == ["a", "b", "c", "d"]
        for (name, want), (_, got) in zip(weights(0), received[rank], strict=True):
            assert got.dtype == plan.torch_dtype and got.shape == want.shape
            assert torch.equal(got, want.to(plan.torch_dtype)), name  # exactly the cast of the actor's weight


def test_an_actor_rank_without_the_group_only_consumes_the_weights():
    consumed = []

    def pairs():
        for pair in weights(0):
            consumed.append(pair[0])
            yield pair

    assert send_weights(pairs(), BucketPlan.from_manifest(MANIFEST, "float32", 40), group=None) == 0
    assert consumed == ["a", "b", "c", "d"]  # every gather of a sharded weight ran


def test_weights_that_differ_from_the_plan_stop_the_sync_naming_the_weight():
    plan = BucketPlan.from_manifest(MANIFEST, "float32", 40)
    reordered = [weights(0)[1], weights(0)[0], *weights(0)[2:]]
    with pytest.raises(RuntimeError, match=r"expected a \(2, 3\), got b \(4,\)"):
        send_weights(reordered, plan, group=None)
    with pytest.raises(RuntimeError, match="has a weight the plan lacks \\(e\\)"):
        send_weights([*weights(0), ("e", torch.zeros(1))], plan, group=None)
    assert weight_manifest(weights(0)) == MANIFEST


def test_the_hf_rollout_takes_every_weight_in_place_and_refuses_a_partial_or_foreign_set(tiny_model_dir):
    from hybridrl.models.loading import load_causal_lm, load_tokenizer
    from hybridrl.workers.rollout.hf import HFRollout

    model = load_causal_lm(tiny_model_dir)
    rollout = HFRollout(model, {"n": 1, "response_length": 4}, load_tokenizer(tiny_model_dir))
    before = {name: tensor.data_ptr() for name, tensor in model.state_dict().items()}
    new = {name: torch.full_like(tensor, 0.5) for name, tensor in model.state_dict().items()}
    rollout.update_weights(iter(new.items()))
    assert all(torch.equal(tensor, new[name]) for name, tensor in model.state_dict().items())
    assert {name: tensor.data_ptr() for name, tensor in model.state_dict().items()} == before  # in place
    with pytest.raises(KeyError, match="no value came for 1 of the model's weights"):
        rollout.update_weights(list(new.items())[1:])
    with pytest.raises(KeyError, match="has no weight 'not.a.weight'"):
        rollout.update_weights([("not.a.weight", torch.zeros(1))])


def test_the_sync_group_is_a_group_of_its_own_beside_the_default_one():
    assert not dist.is_initialized()  # built on its store alone: no default process group is needed or made
    store, port = host_store()
    group = SyncGroup.join("127.0.0.1", port, 0, 1, torch.device("cpu"), timeout_s=10, store=store)
    tensor = torch.arange(3.0)
    group.broadcast(tensor)
    assert torch.equal(tensor, torch.arange(3.0)) and not dist.is_initialized()


@pytest.mark.gpu
def test_the_sync_group_on_a_gpu_is_an_nccl_group_that_sends_every_bucket():
    # one GPU holds one NCCL rank, so the group is the actor's rank 0 alone: this checks NCCL's constructor and
    # broadcast overload and the bucket packing on the card, not the transfer between ranks (gloo's tests above)
    store, port = host_store()
    device = torch.device("cuda")
    group = SyncGroup.join("127.0.0.1", port, 0, 1, device, timeout_s=60, store=store)
    assert isinstance(group.group, dist.ProcessGroupNCCL) and not dist.is_initialized()
    plan = BucketPlan.from_manifest(MANIFEST, "bfloat16", bucket_bytes=20)
    assert send_weights(weights(3), plan, group) == 21 * 2
    received = [(name, tensor.clone()) for name, tensor in receive_weights(plan, group)]
    assert [name for name, _ in received] == plan.names
    assert all(tensor.device.type == "cuda" and tensor.dtype == torch.bfloat16 for _, tensor in received)
    tensor = torch.arange(4.0, device=device)
    group.broadcast(tensor)
    assert torch.equal(tensor.cpu(), torch.arange(4.0))
