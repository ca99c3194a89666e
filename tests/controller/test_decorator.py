"""@register metadata, custom dispatch modes and method binding rules."""

import pytest

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
from hybridrl.controller.decorator import get_method_spec


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
    assert wg.echo(4) == 41  # dispatched as 40, +1 on the single rank, summed
    assert wg.echo_inline(4) == 42
    assert not hasattr(wg, "dropped")


def test_unknown_mode_fails_at_definition():
    with pytest.raises(KeyError, match="registered: .*DP_COMPUTE_PROTO"):
        register(dispatch_mode="NO_SUCH_MODE")


def test_duplicate_mode_name_raises():
    with pytest.raises(ValueError, match="already registered"):
        register_dispatch_mode("TIMES_TEN_SUM", _times_ten, _sum_outputs)


def test_all_to_all_checks_list_lengths(local_env):
    from workers_for_tests import ScaleWorker

    wg = LocalWorkerGroup(ClassWithInitArgs(ScaleWorker, scale=1.0))
    with pytest.raises(ValueError, match="one entry per rank \\(1\\)"):
        wg.tag_with_rank(["a", "b"])
