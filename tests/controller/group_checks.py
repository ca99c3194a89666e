"""Behaviour every backend's worker group must show; each backend's tests call these."""

from workers_for_tests import add_one, rows

from hybridrl.protocol import DataProto


def check_dp_compute_proto_keeps_order(wg, scale: float) -> None:
    out = wg.call("scale_rows", rows(7))
    assert isinstance(out, DataProto)
    assert len(out) == 7  # padding rows never reach the caller
    assert out.batch["y"].tolist() == [scale * i for i in range(7)]
    assert list(out.non_tensor_batch["tag"]) == [f"r{i}" for i in range(7)]
    # Contiguous chunks: with world size w, rows are split as evenly as padding allows.
    per_rank = -(-7 // wg.world_size)
    assert out.batch["rank"].tolist() == [i // per_rank for i in range(7)]


def check_k_outputs_per_row_with_padding(wg) -> None:
    out = wg.call("sample", rows(7), n=3)
    assert len(out) == 21
    assert list(out.non_tensor_batch["tag"]) == [f"r{i}" for i in range(7) for _ in range(3)]


def check_other_dispatch_modes(wg) -> None:
    n = wg.world_size
    metrics = wg.call("count_rows", rows(5))
    assert [m["rank"] for m in metrics] == list(range(n))
    assert sum(m["rows"] for m in metrics) >= 5  # padding rows count here: metrics see the real chunks
    assert wg.call("tag_with_rank", [f"v{i}" for i in range(n)]) == [f"v{i}@{i}" for i in range(n)]
    assert wg.call("rank_zero_only") == 0
    assert wg.call("execute_on_rank_zero", 10) == 10
    assert wg.call("apply", add_one, rows(3)).batch["x"].tolist() == [1.0, 2.0, 3.0]


def check_futures_chain(wg, scale: float, monkeypatch) -> None:
    future = wg.call("scale_rows_async", rows(5))

    def fail_if_driver_fetches(self):
        raise AssertionError("the driver materialised a future that should have gone straight to the workers")

    with monkeypatch.context() as patch:
        patch.setattr(type(future), "get", fail_if_driver_fetches)
        out = wg.call("scale_rows", future)
    assert out.batch["y"].tolist() == [scale * scale * i for i in range(5)]
    assert future.get().batch["x"].tolist() == [scale * i for i in range(5)]
