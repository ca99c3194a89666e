"""DataProto behaviour, with expected values written out by hand."""

import pickle

import numpy as np
import pytest
import torch

from hybridrl.protocol import (
    DataProto,
    DataProtoError,
    DataProtoItem,
    pad_dataproto_to_divisor,
    unpad_dataproto,
)
from hybridrl.tensor_batch import TensorBatch


def make(rows: int = 4) -> DataProto:
    # row i: ids = [10i, 10i+1], uid = "u{i}"
    ids = torch.tensor([[10 * i, 10 * i + 1] for i in range(rows)])
    uid = np.array([f"u{i}" for i in range(rows)], dtype=object)
    return DataProto.from_single_dict({"ids": ids, "uid": uid}, meta_info={"temperature": 1.0})


def ids_of(data: DataProto) -> list[list[int]]:
    return data.batch["ids"].tolist()


def test_from_single_dict_splits_tensors_and_arrays():
    data = make(3)
    assert list(data.batch.keys()) == ["ids"]
    assert list(data.non_tensor_batch) == ["uid"]
    assert data.meta_info == {"temperature": 1.0}
    assert len(data) == 3
    assert data.batch.batch_size == torch.Size([3])


def test_from_single_dict_rejects_other_types_naming_the_key():
    with pytest.raises(TypeError, match="'scores'"):
        DataProto.from_single_dict({"ids": torch.zeros(2, 1), "scores": [1, 2]})


def test_from_dict_mismatched_lengths_names_the_key():
    with pytest.raises(ValueError, match="'responses'"):
        DataProto.from_dict({"input_ids": torch.zeros(4, 3), "responses": torch.zeros(5, 2)})
    with pytest.raises(ValueError, match="non_tensor_batch\\['uid'\\]: 3"):
        DataProto.from_dict({"input_ids": torch.zeros(4, 3)}, {"uid": ["a", "b", "c"]})


def test_from_dict_keeps_lists_as_one_object_per_row():
    data = DataProto.from_dict({"x": torch.zeros(2, 1)}, {"numbers": [[1, 2], [3, 4]]})
    assert data.non_tensor_batch["numbers"].shape == (2,)
    assert data.non_tensor_batch["numbers"][1] == [3, 4]


def test_getitem_int_slice_array_and_mask():
    data = make(4)
    item = data[2]
    assert isinstance(item, DataProtoItem)
    assert item.batch["ids"].tolist() == [20, 21]
    assert item.non_tensor_batch["uid"] == "u2"
    assert data[-1].non_tensor_batch["uid"] == "u3"
    assert ids_of(data[1:3]) == [[10, 11], [20, 21]]
    picked = data[np.array([3, 0])]
    assert ids_of(picked) == [[30, 31], [0, 1]]
    assert list(picked.non_tensor_batch["uid"]) == ["u3", "u0"]
    masked = data[torch.tensor([True, False, True, False])]
    assert list(masked.non_tensor_batch["uid"]) == ["u0", "u2"]
    assert data[[1]].meta_info == {"temperature": 1.0}
    with pytest.raises(IndexError):
        data[4]


def test_select_shares_tensors_unless_deepcopy():
    data = make(2)
    data.batch["mask"] = torch.ones(2, 2)
    shallow = data.select(batch_keys=["ids"], non_tensor_batch_keys=[])
    assert list(shallow.batch.keys()) == ["ids"] and shallow.non_tensor_batch == {}
    shallow.batch["ids"][0, 0] = 99
    assert data.batch["ids"][0, 0] == 99
    deep = data.select(batch_keys=["ids"], deepcopy=True)
    deep.batch["ids"][0, 0] = -1
    assert data.batch["ids"][0, 0] == 99
    with pytest.raises(KeyError, match="'nope'"):
        data.select(batch_keys=["nope"])
    with pytest.raises(KeyError, match="'missing'"):
        data.select(non_tensor_batch_keys=["missing"])


def test_pop_removes_and_returns():
    data = make(3)
    data.batch["mask"] = torch.ones(3, 2)
    popped = data.pop(batch_keys=["mask"], non_tensor_batch_keys=["uid"], meta_info_keys=["temperature"])
    assert list(popped.batch.keys()) == ["mask"]
    assert list(popped.non_tensor_batch["uid"]) == ["u0", "u1", "u2"]
    assert popped.meta_info == {"temperature": 1.0}
    assert list(data.batch.keys()) == ["ids"] and data.non_tensor_batch == {} and data.meta_info == {}
    assert len(popped) == len(data) == 3


def test_union_merges_and_detects_conflicts():
    data = make(2)
    other = DataProto.from_dict({"scores": torch.tensor([0.5, 1.0])}, {"uid": ["u0", "u1"]}, {"step": 3})
    data.union(other)
    assert set(data.batch.keys()) == {"ids", "scores"}
    assert data.meta_info == {"temperature": 1.0, "step": 3}
    # Same values under the same key are fine (re-union is idempotent).
    data.union(DataProto.from_dict({"ids": torch.tensor([[0, 1], [10, 11]])}))
    with pytest.raises(ValueError, match="'ids'"):
        data.union(DataProto.from_dict({"ids": torch.tensor([[0, 1], [10, 12]])}))
    with pytest.raises(ValueError, match="'uid'"):
        data.union(DataProto.from_dict(non_tensors={"uid": ["u0", "DIFFERENT"]}))
    with pytest.raises(ValueError, match="'temperature'"):
        data.union(DataProto(batch={"fresh": torch.zeros(2)}, meta_info={"temperature": 0.7}))
    assert "fresh" not in data.batch  # a failed union changes nothing
    with pytest.raises(ValueError, match="the other has 3"):
        data.union(make(3))


def test_union_gathers_metrics_like_concat():
    # a rollout's output and a log-prob pass's, each with its two ranks' worker times
    generated = DataProto(batch={"x": torch.zeros(2)}, meta_info={"metrics": {"worker_seconds": [1.0, 2.0]}})
    ref = DataProto(batch={"y": torch.zeros(2)}, meta_info={"metrics": {"worker_seconds": [3.0, 4.0]},
                                                             "temperature": 1.0})
    generated.union(ref)
    assert generated.meta_info == {"metrics": {"worker_seconds": [1.0, 2.0, 3.0, 4.0]}, "temperature": 1.0}
    assert ref.meta_info["metrics"] == {"worker_seconds": [3.0, 4.0]}  # the other side is not changed


def test_chunk_requires_divisibility():
    data = make(6)
    parts = data.chunk(3)
    assert [ids_of(p) for p in parts] == [[[0, 1], [10, 11]], [[20, 21], [30, 31]], [[40, 41], [50, 51]]]
    assert all(p.meta_info == {"temperature": 1.0} for p in parts)
    with pytest.raises(ValueError, match="pad_dataproto_to_divisor"):
        make(7).chunk(2)


@pytest.mark.parametrize("rows,divisor,expected_pad", [(7, 2, 1), (7, 4, 1), (5, 4, 3), (8, 4, 0), (1, 3, 2)])
def test_pad_and_unpad_with_uneven_sizes(rows, divisor, expected_pad):
    data = make(rows)
    padded, pad = pad_dataproto_to_divisor(data, divisor)
    assert pad == expected_pad
    assert len(padded) % divisor == 0
    # Padding repeats rows from the start: the k-th padding row is row k % rows.
    expected_uids = [f"u{i}" for i in range(rows)] + [f"u{k % rows}" for k in range(pad)]
    assert list(padded.non_tensor_batch["uid"]) == expected_uids
    restored = unpad_dataproto(padded, pad)
    assert ids_of(restored) == ids_of(data)
    assert list(restored.non_tensor_batch["uid"]) == list(data.non_tensor_batch["uid"])
    padded.chunk(divisor)  # now divisible


def test_split_leaves_a_short_tail():
    parts = make(5).split(2)
    assert [len(p) for p in parts] == [2, 2, 1]
    assert ids_of(parts[2]) == [[40, 41]]


def test_concat_and_key_mismatch():
    a, b = make(2), make(3)[1:]
    joined = DataProto.concat([a, b])
    assert ids_of(joined) == [[0, 1], [10, 11], [10, 11], [20, 21]]
    assert list(joined.non_tensor_batch["uid"]) == ["u0", "u1", "u1", "u2"]
    b.batch["extra"] = torch.zeros(2)
    with pytest.raises(ValueError, match="keys"):
        DataProto.concat([a, b])


def test_repeat_interleaved_vs_blocked():
    data = make(2)
    inter = data.repeat(repeat_times=3, interleave=True)
    assert list(inter.non_tensor_batch["uid"]) == ["u0", "u0", "u0", "u1", "u1", "u1"]
    assert ids_of(inter) == [[0, 1]] * 3 + [[10, 11]] * 3
    blocked = data.repeat(repeat_times=3, interleave=False)
    assert list(blocked.non_tensor_batch["uid"]) == ["u0", "u1", "u0", "u1", "u0", "u1"]


def test_reorder_in_place():
    data = make(3)
    data.reorder(torch.tensor([2, 0, 1]))
    assert ids_of(data) == [[20, 21], [0, 1], [10, 11]]
    assert list(data.non_tensor_batch["uid"]) == ["u2", "u0", "u1"]


def test_to_device_and_iteration():
    data = make(2).to("cpu")
    assert [item.non_tensor_batch["uid"] for item in data] == ["u0", "u1"]


def test_pickle_round_trip_of_a_large_batch_and_bfloat16():
    ids = torch.randint(0, 50_000, (10_000, 512), dtype=torch.int64)
    data = DataProto.from_dict(
        {"input_ids": ids, "logp": torch.randn(10_000, 4).to(torch.bfloat16)},
        {"uid": [str(i) for i in range(10_000)]},
        {"step": 1},
    )
    blob = pickle.dumps(data, protocol=5)
    # The int64 payload alone is 10_000 * 512 * 8 bytes; nothing should be stored twice.
    assert len(blob) < 10_000 * 512 * 8 * 1.1
    back = pickle.loads(blob)
    assert torch.equal(back.batch["input_ids"], ids)
    assert back.batch["logp"].dtype == torch.bfloat16
    assert torch.equal(back.batch["logp"], data.batch["logp"])
    assert back.non_tensor_batch["uid"][9_999] == "9999"
    back.batch["input_ids"][0, 0] = -5  # tensors come back writable
    assert back.meta_info == {"step": 1}


def test_tensor_batch_rejects_bad_shapes():
    batch = TensorBatch({"a": torch.zeros(3, 2)})
    with pytest.raises(ValueError, match="'b'\\] has 2 rows"):
        batch["b"] = torch.zeros(2, 2)
    with pytest.raises(ValueError, match="scalar"):
        batch["c"] = torch.tensor(1.0)
    with pytest.raises(KeyError, match="'zzz'"):
        batch["zzz"]


def test_non_tensor_only_dataproto():
    data = DataProto.from_dict(non_tensors={"text": ["a", "b", "c"]})
    assert len(data) == 3
    assert list(data.repeat(2).non_tensor_batch["text"]) == ["a", "a", "b", "b", "c", "c"]
    assert len(data.chunk(3)[0]) == 1


# ----- verl compatibility: merging, reshaping, conversions -----------------------------------------------


def test_concat_gathers_worker_metrics_and_merges_other_meta_info():
    a = DataProto.from_dict({"x": torch.tensor([1])}, meta_info={"metrics": {"loss": [0.5, 0.7]}, "step": 3})
    b = DataProto.from_dict({"x": torch.tensor([2])}, meta_info={"metrics": [{"loss": 0.6}], "extra": "b"})
    c = DataProto.from_dict({"x": torch.tensor([3])}, meta_info={"step": 3})
    joined = DataProto.concat([a, b, c])
    # a's own list is extended, b's list of dicts appended: one flat list per metric, in rank order
    assert joined.meta_info == {"metrics": {"loss": [0.5, 0.7, 0.6]}, "step": 3, "extra": "b"}
    with pytest.raises(ValueError, match="Conflicting values for meta_info key 'step'"):
        DataProto.concat([a, DataProto.from_dict({"x": torch.tensor([4])}, meta_info={"step": 4})])


def test_conflicts_raise_an_error_that_is_both_value_and_assertion_error():
    # hybridrl code catches ValueError; code written for verl catches the AssertionError verl raises
    with pytest.raises(AssertionError, match="pad_dataproto_to_divisor"):
        make(7).chunk(2)
    assert issubclass(DataProtoError, ValueError)


def test_union_compares_values_with_nan_and_nesting():
    def nested(second: float) -> np.ndarray:
        column = np.empty(2, dtype=object)
        column[:] = [np.array([1.0, second]), {"k": [1, 2]}]
        return column

    data = DataProto(non_tensor_batch={"a": nested(np.nan)})
    data.union(DataProto(non_tensor_batch={"a": nested(np.nan), "b": np.arange(2)}))  # NaN equals NaN
    assert set(data.non_tensor_batch) == {"a", "b"}
    with pytest.raises(ValueError, match="non_tensor_batch key 'a' exists in both with different values"):
        data.union(DataProto(non_tensor_batch={"a": nested(2.0)}))


def test_from_dict_keeps_numpy_columns_n_dimensional():
    grid = DataProto.from_dict(non_tensors={"g": np.array([[1, 2], [3, 4]])})  # numpy arrays stay N-d
    assert grid.non_tensor_batch["g"].shape == (2, 2) and len(grid) == 2


def test_getstate_round_trip_and_pickles_from_before_getstate():
    data = make(2)
    restored = DataProto()
    restored.__setstate__(data.__getstate__())
    assert ids_of(restored) == ids_of(data) and restored.meta_info == {"temperature": 1.0}
    old_style = DataProto()
    old_style.__setstate__(dict(data.__dict__))  # what pickle stored before __getstate__ existed
    assert ids_of(old_style) == ids_of(data)


