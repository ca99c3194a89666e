"""The trainer's typed handles cannot drift from the workers they drive.

Each handle method must exist on its worker class as a `@register`-ed method with the same parameters,
return what that method's dispatch mode collects, and hand the call to that very method (not a
neighbour's: a copy-pasted `compute_log_prob` calling `compute_ref_log_prob` would otherwise pass).
Every registered method of the worker has a handle method, so nothing the trainer may call is untyped.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap

import pytest

from hybridrl.controller import Dispatch, Execute, TypedWorkerGroup, registered_methods
from hybridrl.controller.decorator import MethodSpec
from hybridrl.trainer.worker_groups import ActorRolloutRefGroup, CriticGroup, RewardModelGroup, SFTGroup

HANDLES = [ActorRolloutRefGroup, CriticGroup, RewardModelGroup, SFTGroup]
# modes whose result is one entry per rank; DP_COMPUTE_PROTO concatenates the ranks' DataProtos
PER_RANK = {Dispatch.ONE_TO_ALL, Dispatch.ALL_TO_ALL, Dispatch.DP_COMPUTE, Dispatch.DP_COMPUTE_METRIC}


def handle_methods(handle: type[TypedWorkerGroup]) -> dict[str, object]:
    """The public methods of a handle, its own and those every handle inherits."""
    return {name: fn for klass in handle.__mro__ if issubclass(klass, TypedWorkerGroup)
            for name, fn in vars(klass).items() if inspect.isfunction(fn) and not name.startswith("_")}


def expected_return(spec: MethodSpec, worker_return: str) -> set[str]:
    """What the group hands back for a worker method returning `worker_return` (an annotation string)."""
    worker_return = unqualified(worker_return)
    if spec.execute_mode is Execute.RANK_ZERO or Dispatch(spec.dispatch_mode) not in PER_RANK:
        return {worker_return}
    return {f"list[{worker_return}]"} | ({"None"} if worker_return == "None" else set())


def unqualified(annotation: str) -> str:
    """`memory.ProcessMemory` -> `ProcessMemory`: modules import a type under different spellings."""
    return re.sub(r"\b\w+\.", "", annotation)


def call_target(fn) -> tuple[str, str]:
    """(class name, method name) of the worker method that `self._call(...)` in `fn` names."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Attribute) and node.func.attr == "_call"]
    assert len(calls) == 1, f"{fn.__qualname__} should make exactly one group call"
    target = calls[0].args[0]
    assert isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name), ast.dump(target)
    return target.value.id, target.attr


@pytest.mark.parametrize("handle", HANDLES, ids=lambda h: h.__name__)
def test_every_registered_method_has_a_handle_method(handle):
    assert set(handle_methods(handle)) == set(registered_methods(handle.worker_cls))


def handle_parameters(spec: MethodSpec, worker: inspect.Signature) -> list[inspect.Parameter]:
    """The parameters a handle method takes for a worker method: the worker's own, or (ALL_TO_ALL) a list of
    each, one entry per rank."""
    parameters = user_parameters(worker)
    if Dispatch(spec.dispatch_mode) is not Dispatch.ALL_TO_ALL:
        return parameters
    return [p.replace(annotation=f"list[{p.annotation}]") for p in parameters]


def user_parameters(signature: inspect.Signature) -> list[inspect.Parameter]:
    """The parameters after `self`, without `_ray_trace_ctx`: once a class has been made a Ray actor in
    this process (any earlier Ray test), Ray adds that keyword to its methods' signatures in place."""
    return [p for p in list(signature.parameters.values())[1:] if p.name != "_ray_trace_ctx"]


@pytest.mark.parametrize("handle", HANDLES, ids=lambda h: h.__name__)
def test_handle_methods_match_their_worker_methods(handle):
    worker_cls = handle.worker_cls
    specs = registered_methods(worker_cls)
    for name, fn in handle_methods(handle).items():
        assert name in specs, f"{handle.__name__}.{name}: {worker_cls.__name__} registers no such method"
        ours, theirs = inspect.signature(fn), inspect.signature(getattr(worker_cls, name))
        assert user_parameters(ours) == handle_parameters(specs[name], theirs), (
            f"{handle.__name__}.{name}{ours} differs from {worker_cls.__name__}.{name}{theirs}")
        assert unqualified(ours.return_annotation) in expected_return(specs[name], theirs.return_annotation), (
            f"{handle.__name__}.{name} returns {ours.return_annotation}, the group collects "
            f"{expected_return(specs[name], theirs.return_annotation)}")
        owner, method = call_target(fn)
        assert method == name, f"{handle.__name__}.{name} calls {owner}.{method}"
        # the handle's own worker class, or Worker for the methods every worker has
        assert owner in {c.__name__ for c in worker_cls.__mro__}, f"{handle.__name__}.{name} calls {owner}"


def test_expected_return_follows_the_dispatch_mode():
    proto = MethodSpec(Dispatch.DP_COMPUTE_PROTO, Execute.ALL, True)
    broadcast = MethodSpec(Dispatch.ONE_TO_ALL, Execute.ALL, True)
    rank_zero = MethodSpec(Dispatch.ONE_TO_ALL, Execute.RANK_ZERO, True)
    assert expected_return(proto, "DataProto") == {"DataProto"}
    assert expected_return(broadcast, "dict") == {"list[dict]"}
    assert expected_return(broadcast, "None") == {"list[None]", "None"}
    assert expected_return(rank_zero, "int") == {"int"}
    assert expected_return(broadcast, "memory.ProcessMemory") == {"list[ProcessMemory]"}
