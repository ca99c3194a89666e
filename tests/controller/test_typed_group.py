"""A typed handle calls its worker's methods through the group's dispatch, and refuses another worker's group."""

import pytest
import torch
from workers_for_tests import ScaleWorker, rows

from hybridrl.controller import (
    ClassWithInitArgs,
    Dispatch,
    LocalWorkerGroup,
    TypedWorkerGroup,
    Worker,
    hybrid_worker,
    register,
)
from hybridrl.protocol import DataProto


class ScaleGroup(TypedWorkerGroup):
    worker_cls = ScaleWorker

    def scale_rows(self, data: DataProto) -> DataProto:
        return self._call(ScaleWorker.scale_rows, data)

    def sample(self, data: DataProto, n: int) -> DataProto:
        return self._call(ScaleWorker.sample, data, n)

    def tag_with_rank(self, value: list[str]) -> list[str]:
        return self._call(ScaleWorker.tag_with_rank, value)


class EchoWorker(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def echo(self, value: int) -> int:
        return value


def test_typed_handle_runs_the_worker_methods(local_env):
    handle = ScaleGroup(LocalWorkerGroup(ClassWithInitArgs(ScaleWorker, scale=2.0)))
    out = handle.scale_rows(rows(5))
    torch.testing.assert_close(out.batch["y"], torch.arange(5.0) * 2)  # x * scale
    assert list(out.non_tensor_batch["tag"]) == ["r0", "r1", "r2", "r3", "r4"]
    # keyword and positional arguments reach the rank alike: 3 rows, 2 samples each, interleaved
    sampled = handle.sample(rows(3), n=2)
    assert sampled.batch["x"].tolist() == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0]
    assert handle.tag_with_rank(["a"]) == ["a@0"]  # ALL_TO_ALL: one entry per rank, one rank
    assert handle.world_size == 1
    # the methods every worker has, one entry per rank
    assert handle.process_info()[0]["rank"] == 0 and handle.model_passes() == [{}]


def test_typed_handle_on_a_hybrid_worker_role(local_env):
    group = LocalWorkerGroup(hybrid_worker({"actor": ClassWithInitArgs(ScaleWorker, scale=2.0),
                                            "critic": ClassWithInitArgs(ScaleWorker, scale=3.0)}))
    actor, critic = ScaleGroup(group, "actor"), ScaleGroup(group, "critic")
    torch.testing.assert_close(actor.scale_rows(rows(2)).batch["y"], torch.tensor([0.0, 2.0]))
    torch.testing.assert_close(critic.scale_rows(rows(2)).batch["y"], torch.tensor([0.0, 3.0]))


def test_typed_handle_refuses_another_workers_group(local_env):
    with pytest.raises(TypeError, match=r"ScaleGroup drives ScaleWorker.*lacks \[.*'scale_rows'"):
        ScaleGroup(LocalWorkerGroup(ClassWithInitArgs(EchoWorker)))


def test_call_names_the_methods_a_group_has(local_env):
    group = LocalWorkerGroup(ClassWithInitArgs(EchoWorker))
    assert group.call(EchoWorker.echo, 4) == [4]
    assert group.call("echo", 5) == [5]
    assert group.call("echo", 6) == [6]  # the bound method, for worker classes without a typed handle
    with pytest.raises(AttributeError, match=r"no registered method 'scale_rows'.*\['echo', 'model_passes'"):
        group.call(ScaleWorker.scale_rows, rows(1))
