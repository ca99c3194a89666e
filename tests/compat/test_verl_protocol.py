"""verl's extra DataProto members and protocol functions (compat/verl_protocol.py), by hand-worked
values; the core DataProto's behaviour is tests/test_protocol.py's."""

import numpy as np
import pytest
import torch
from test_protocol import ids_of
from test_protocol import make as make_core
from verl_protocol import (
    DataProto,
    deserialize_single_tensor,
    fold_batch_dim,
    serialize_single_tensor,
    unfold_batch_dim,
    union_numpy_dict,
    union_tensor_dict,
)

from hybridrl.protocol import DataProto as CoreDataProto
from hybridrl.tensor_batch import TensorBatch


def make(rows: int = 4) -> DataProto:
    """tests/test_protocol.py's rows (ids [10i, 10i+1], uid "u{i}") in verl's DataProto."""
    core = make_core(rows)
    return DataProto(batch=core.batch, non_tensor_batch=core.non_tensor_batch, meta_info=core.meta_info)


def test_the_core_operations_keep_the_verl_class():
    data = make(4)
    for result in (data[1:3], data.select(["ids"]), data.repeat(2), data.chunk(2)[0],
                   DataProto.concat([data, data]), data.select_rows([0, 2])):
        assert type(result) is DataProto
    assert isinstance(data, CoreDataProto)
    assert not hasattr(CoreDataProto, "to_tensordict")  # the core has none of verl's extra members


def test_save_and_load_from_disk(tmp_path):
    data = make(3)
    path = tmp_path / "batch.pkl"
    data.save_to_disk(path)
    loaded = DataProto.load_from_disk(path)
    assert ids_of(loaded) == ids_of(data)
    assert list(loaded.non_tensor_batch["uid"]) == ["u0", "u1", "u2"]


def test_fold_and_unfold_rows():
    data = make(4)  # ids rows [0,1], [10,11], [20,21], [30,31]
    folded = fold_batch_dim(data, new_batch_size=2)
    assert folded.batch["ids"].shape == (2, 2, 2) and len(folded) == 2
    assert folded.non_tensor_batch["uid"].tolist() == [["u0", "u1"], ["u2", "u3"]]
    folded.reorder(torch.tensor([1, 0]))
    back = unfold_batch_dim(folded, batch_dims=2)
    assert ids_of(back) == [[20, 21], [30, 31], [0, 1], [10, 11]]
    assert list(back.non_tensor_batch["uid"]) == ["u2", "u3", "u0", "u1"]


def test_sample_level_repeat_and_unfold_column_chunks():
    data = make(3)
    assert list(data.sample_level_repeat([2, 0, 1]).non_tensor_batch["uid"]) == ["u0", "u0", "u2"]
    pairs = DataProto.from_dict({"ids": torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]]), "one": torch.tensor([7, 9])},
                                {"halves": [["a", "b"], ["c", "d"]]})
    out = pairs.unfold_column_chunks(2, split_keys=["ids", "halves"])
    assert out.batch["ids"].tolist() == [[1, 2], [3, 4], [5, 6], [7, 8]]
    assert out.batch["one"].tolist() == [7, 7, 9, 9]  # not split: repeated alongside
    assert out.non_tensor_batch["halves"].tolist() == [["a"], ["b"], ["c"], ["d"]]


def test_make_iterator_yields_mini_batches_per_epoch():
    data = make(4)
    in_order = [list(mb.non_tensor_batch["uid"]) for mb in data.make_iterator(mini_batch_size=2, epochs=2)]
    assert in_order == [["u0", "u1"], ["u2", "u3"]] * 2
    shuffled = [ids_of(mb) for mb in data.make_iterator(2, 1, seed=1, dataloader_kwargs={"shuffle": True})]
    again = [ids_of(mb) for mb in data.make_iterator(2, 1, seed=1, dataloader_kwargs={"shuffle": True})]
    assert shuffled == again and sorted(sum(shuffled, [])) == ids_of(data)
    with pytest.raises(ValueError, match="num_workers"):
        next(data.make_iterator(2, 1, dataloader_kwargs={"num_workers": 2}))


def test_serialize_single_tensor_keeps_dtype_shape_and_bytes():
    tensor = torch.tensor([[1.5, -2.0]], dtype=torch.bfloat16)
    dtype, shape, raw = serialize_single_tensor(tensor)
    assert (dtype, shape, raw.nbytes) == ("bfloat16", (1, 2), 4)  # 2 values x 2 bytes
    assert torch.equal(deserialize_single_tensor((dtype, shape, raw)), tensor)


def test_tensordict_round_trip_when_tensordict_is_installed():
    tensordict = pytest.importorskip("tensordict")  # optional: hybridrl does not depend on it
    data = DataProto.from_dict({"x": torch.tensor([1, 2])}, {"turns": [[], [0.5]]}, {"step": 7})
    td = data.to_tensordict()
    back = DataProto.from_tensordict(td)
    assert back.batch["x"].tolist() == [1, 2] and back.non_tensor_batch["turns"].tolist() == [[], [0.5]]
    assert back.meta_info == {"step": 7}
    assert len(DataProto(batch=tensordict.TensorDict({}, batch_size=[3])).batch.keys()) == 0


def test_union_helpers_compare_values_with_nan_and_nesting():
    nested = np.empty(2, dtype=object)
    nested[:] = [np.array([1.0, np.nan]), {"k": [1, 2]}]
    same = np.empty(2, dtype=object)
    same[:] = [np.array([1.0, np.nan]), {"k": [1, 2]}]
    merged = union_numpy_dict({"a": nested}, {"a": same, "b": np.arange(2)})
    assert set(merged) == {"a", "b"}
    other = np.empty(2, dtype=object)
    other[:] = [np.array([1.0, 2.0]), {"k": [1, 2]}]  # NaN vs 2.0
    with pytest.raises(ValueError, match="`a` in tensor_dict1 and tensor_dict2 are not the same object"):
        union_numpy_dict({"a": nested}, {"a": other})
    batch = TensorBatch({"x": torch.zeros(2)})
    union_tensor_dict(batch, TensorBatch({"x": torch.zeros(2), "y": torch.ones(2)}))
    assert set(batch) == {"x", "y"}
    with pytest.raises(ValueError, match="`x`"):
        union_tensor_dict(batch, TensorBatch({"x": torch.ones(2)}))


def test_from_dict_has_one_batch_dimension_and_no_auto_padding():
    with pytest.raises(ValueError, match="num_batch_dims=2"):
        DataProto.from_dict({"x": torch.zeros(2, 3)}, num_batch_dims=2)
    with pytest.raises(ValueError, match="pad_dataproto_to_divisor"):
        DataProto.from_dict({"x": torch.zeros(2, 3)}, auto_padding=True)
    with pytest.raises(ValueError, match="pad_dataproto_to_divisor"):
        DataProto.from_single_dict({"x": torch.zeros(2, 3)}, auto_padding=True)
    assert type(DataProto.from_single_dict({"x": torch.zeros(2, 3)})) is DataProto


def test_rename_in_place_and_copy_is_deep():
    data = make(2)
    assert data.rename("ids", "input_ids") is data
    assert list(data.batch.keys()) == ["input_ids"]
    with pytest.raises(ValueError, match="1 old keys but 2 new keys"):
        data.rename(["input_ids"], ["a", "b"])
    copied = data.copy()
    copied.batch["input_ids"][0, 0] = -1
    assert type(copied) is DataProto and data.batch["input_ids"][0, 0] == 0
