"""@register metadata, custom dispatch modes and method binding rules."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from hybridrl.controller import (
    ClassWithInitArgs,
    Dispatch,
    Execute,
    LocalWorkerGroup,
    Worker,
    register,
    register_dispatch_mode,
    registered_methods,
)
from hybridrl.controller.decorator import ProtoShard, get_method_spec, on_device, to_cpu
from hybridrl.protocol import DataProto


def _times_ten(wg, value):
    return ([value * 10] * wg.world_size,), {}


def _sum_outputs(wg, outputs):
    return sum(outputs)


register_dispatch_mode("TIMES_TEN_SUM", _times_ten, _sum_outputs)


class Base(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def kept(self) -> str:
        return "base"

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def dropped(self) -> str:
        return "base"


class Child(Base):
    def dropped(self) -> str:  # overridden without @register: no longer remote-callable
        return "child"

    @register(dispatch_mode="TIMES_TEN_SUM")
    def echo(self, value: int) -> int:
        return value + 1

    @register(dispatch_mode={"dispatch_fn": _times_ten, "collect_fn": _sum_outputs})
    def echo_inline(self, value: int) -> int:
        return value + 2


def test_spec_is_a_typed_attribute():
    spec = get_method_spec(Base.kept)
    assert spec.dispatch_mode is Dispatch.ONE_TO_ALL and spec.execute_mode is Execute.ALL and spec.blocking
    assert get_method_spec(Child.dropped) is None


def test_registered_methods_follow_overrides():
    names = set(registered_methods(Child))
    assert {"kept", "echo", "echo_inline", "process_info"} <= names
    assert "dropped" not in names


def test_custom_dispatch_modes(local_env):
    wg = LocalWorkerGroup(ClassWithInitArgs(Child))
    assert wg.call("echo", 4) == 41  # dispatched as 40, +1 on the single rank, summed
    assert wg.call("echo_inline", 4) == 42
    assert not hasattr(wg, "dropped")


def test_unknown_mode_fails_at_definition():
    with pytest.raises(KeyError, match="registered: .*DP_COMPUTE_PROTO"):
        register(dispatch_mode="NO_SUCH_MODE")


def test_a_split_batch_run_on_rank_zero_only_fails_at_definition():
    # rank 0 alone would drop the other ranks' shares of the batch
    with pytest.raises(ValueError, match="other ranks' shares would be lost"):
        register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, execute_mode=Execute.RANK_ZERO)
    register(dispatch_mode=Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO)  # every rank's input is whole


def test_duplicate_mode_name_raises():
    with pytest.raises(ValueError, match="already registered"):
        register_dispatch_mode("TIMES_TEN_SUM", _times_ten, _sum_outputs)


def test_all_to_all_checks_list_lengths(local_env):
    from workers_for_tests import ScaleWorker

    wg = LocalWorkerGroup(ClassWithInitArgs(ScaleWorker, scale=1.0))
    with pytest.raises(ValueError, match="one entry per rank \\(1\\)"):
        wg.call("tag_with_rank", ["a", "b"])


# ----- device placement: DataProto arguments to the worker's device, results to the CPU -------------------
# No GPU here, so the worker's device is one that still says where a tensor went: `meta` (shapes without
# data; mixing it with CPU tensors raises), or a CUDA device under FakeTensorMode, whose tensors carry a
# device and shapes but no data, and which refuses to mix devices as CUDA does.
class OnMeta:
    """A worker stand-in whose device is `meta` (the wrapper reads only `device`)."""

    device = torch.device("meta")

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def devices_seen(self, data: DataProto, extra: DataProto | None = None) -> dict[str, str]:
        protos = {"data": data, **({"extra": extra} if extra is not None else {})}
        return {f"{name}.{key}": str(value.device) for name, proto in protos.items()
                for key, value in proto.batch.items()}


class OnFakeCuda:
    device = torch.device("cuda", 0)

    def __init__(self) -> None:
        self.seen: list[torch.device] = []

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def double(self, data: DataProto) -> DataProto:
        self.seen.append(data.batch["x"].device)
        return DataProto.from_dict({"twice": data.batch["x"] * 2})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def tensors(self, data: DataProto) -> tuple[torch.Tensor, dict[str, torch.Tensor], float]:
        return data.batch["x"].sum(0), {"scaled": data.batch["x"] * 3}, 1.5


def test_dataproto_arguments_reach_the_method_on_the_workers_device_and_the_callers_stay_put():
    data = DataProto.from_dict({"x": torch.ones(4, 3), "y": torch.zeros(4, dtype=torch.long)},
                               meta_info={"temperature": 0.7})
    extra = DataProto.from_dict({"z": torch.ones(4)})
    shard = ProtoShard(data=data, real_rows=len(data))
    assert OnMeta().devices_seen(shard, extra=extra) == {"data.x": "meta", "data.y": "meta", "extra.z": "meta"}
    # the caller's own DataProto (the driver's, on the local backend) still holds its CPU tensors
    assert {v.device.type for v in (*data.batch.values(), *extra.batch.values())} == {"cpu"}


def test_the_move_shares_everything_but_the_tensors():
    data = DataProto.from_dict({"x": torch.ones(2, 3)}, {"uid": ["a", "b"]}, meta_info={"seed": 1})
    moved = on_device(data, torch.device("meta"))
    assert moved is not data and moved.batch["x"].device.type == "meta"
    assert moved.meta_info is data.meta_info and moved.non_tensor_batch is data.non_tensor_batch


def test_on_the_cpu_nothing_moves_and_nothing_is_copied():
    data = DataProto.from_dict({"x": torch.ones(2, 3)}, meta_info={"seed": 1})
    assert on_device(data, torch.device("cpu")) is data
    result = {"metrics": [1.0, 2.0], "x": data.batch["x"]}
    assert to_cpu(result) is result and to_cpu(data) is data


def test_results_come_back_on_the_cpu_from_a_cuda_worker():
    worker = OnFakeCuda()
    with FakeTensorMode(allow_non_fake_inputs=True):
        data = DataProto.from_dict({"x": torch.ones(4, 3)})
        # (no padding rows to trim: fake CUDA tensors refuse views without a CUDA build)
        out = worker.double(ProtoShard(data=data, real_rows=4))
        total, scaled, number = worker.tensors(data)
    assert worker.seen == [torch.device("cuda", 0)]
    assert len(out) == 4 and out.batch["twice"].device == torch.device("cpu")
    assert total.device.type == "cpu" and scaled["scaled"].device.type == "cpu" and number == 1.5


def test_cuda_refuses_a_cpu_tensor_under_fake_tensors_too():
    # what the test above relies on: FakeTensorMode propagates devices as CUDA does, and refuses to mix them
    with FakeTensorMode(allow_non_fake_inputs=True), pytest.raises(Exception, match="device"):
        torch.ones(3, device="cuda") + torch.ones(3)
