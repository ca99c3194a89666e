"""RLHFDataset on real parquet files and the tiny model's real tokenizer (from tests/conftest.py)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from omegaconf import OmegaConf

from hybridrl.data.rl_dataset import DataError, RLDatasetConfig, RLHFDataset, collate_fn, truncate
from hybridrl.data.tasks import arithmetic, countdown
from hybridrl.data.tasks.sources import make_row
from hybridrl.protocol import DataProto


def rows(questions, data_source="arithmetic"):
    return [
        make_row(data_source=data_source, question=q, ground_truth=str(i), answer=f"<answer>{i}</answer>",
                 split="train", index=100 + i)
        for i, q in enumerate(questions)
    ]  # fmt: skip


def write(path, table_rows):
    pq.write_table(pa.Table.from_pylist(table_rows), path)
    return path


def template_ids(tok, question):
    """The expected token ids, computed the documented way: chat template text, then tokenise."""
    text = tok.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
    )
    return tok(text, add_special_tokens=False)["input_ids"], text


def test_truncate_by_hand():
    ids = list(range(1, 11))
    assert truncate(ids, 4, "left", "x") == [7, 8, 9, 10]
    assert truncate(ids, 4, "right", "x") == [1, 2, 3, 4]
    assert truncate(ids, 4, "middle", "x") == [1, 2, 9, 10]  # 4 // 2 = 2 from the start, 2 from the end
    assert truncate(ids, 5, "middle", "x") == [1, 2, 8, 9, 10]  # 5 // 2 = 2 from the start, 3 from the end
    assert truncate(ids, 10, "error", "x") == ids
    with pytest.raises(ValueError, match="file.parquet row 3: the prompt has 10 tokens.*data.truncation"):
        truncate(ids, 9, "error", "file.parquet row 3")


def test_left_padding_and_position_ids(tmp_path, tiny_tokenizer):
    tok = tiny_tokenizer
    path = write(tmp_path / "a.parquet", rows(["Compute 1 + 2."]))
    expected, _ = template_ids(tok, "Compute 1 + 2.")
    length = len(expected) + 3
    ds = RLHFDataset(str(path), tok, {"max_prompt_length": length})
    item = ds[0]
    assert item["input_ids"].shape == item["attention_mask"].shape == item["position_ids"].shape == (length,)
    # three pads on the left, then the prompt
    assert item["input_ids"].tolist() == [tok.pad_token_id] * 3 + expected
    assert item["attention_mask"].tolist() == [0, 0, 0] + [1] * len(expected)
    # real tokens numbered 0..n-1 as in an unpadded prompt; pads clipped to 0
    assert item["position_ids"].tolist() == [0, 0, 0] + list(range(len(expected)))
    assert item["raw_prompt_ids"] == expected


@pytest.mark.parametrize("mode", ["left", "right", "middle"])
def test_truncation_modes(tmp_path, tiny_tokenizer, mode):
    question = "Compute 12345 + 67890 column by column; put the result in <answer></answer>."
    path = write(tmp_path / "a.parquet", rows([question]))
    full, _ = template_ids(tiny_tokenizer, question)
    m = 11
    assert len(full) > m
    item = RLHFDataset(path, tiny_tokenizer, {"max_prompt_length": m, "truncation": mode})[0]
    expected = {"left": full[-m:], "right": full[:m], "middle": full[:5] + full[-6:]}[mode]
    assert item["input_ids"].tolist() == expected and item["raw_prompt_ids"] == expected
    assert item["attention_mask"].tolist() == [1] * m
    assert item["position_ids"].tolist() == list(range(m))


def test_truncation_error_names_file_row_column_and_fix_at_load(tmp_path, tiny_tokenizer):
    path = write(tmp_path / "a.parquet", rows(["short", "a much longer prompt " * 5]))
    long_ids, _ = template_ids(tiny_tokenizer, "a much longer prompt " * 5)
    # the dataset refuses the file when it is built, not when a step reaches row 1
    with pytest.raises(DataError, match=rf"(?s)1 of 2 data rows.*a\.parquet row 1, column 'prompt': the prompt has "
                                        rf"{len(long_ids)} tokens, more than data.max_prompt_length=20"
                                        rf".*Fix: set data\.truncation=left\|right\|middle.*filter_overlong"):
        RLHFDataset(path, tiny_tokenizer, {"max_prompt_length": 20})
    assert len(RLHFDataset(path, tiny_tokenizer, {"max_prompt_length": 20, "truncation": "left"})) == 2


def test_every_bad_row_is_counted_and_the_first_ones_listed(tmp_path, tiny_tokenizer):
    long = "a much longer prompt " * 5
    path = write(tmp_path / "a.parquet", rows(["1+1", *[long] * 8, "2+2"]))
    with pytest.raises(DataError) as err:
        RLHFDataset(path, tiny_tokenizer, {"max_prompt_length": 20})
    message = str(err.value)
    assert message.startswith("8 of 10 data rows cannot be used")
    assert [f"row {i}," in message for i in range(1, 9)] == [True] * 5 + [False] * 3  # rows 1-5 listed
    assert "... and 3 more" in message


def bad_row(column, value):
    row = rows(["Compute 1 + 2."])[0]
    row[column] = value
    return row


@pytest.mark.parametrize("column, value, problem", [
    ("prompt", [], "the prompt is an empty list of chat messages"),
    ("prompt", [{"role": "user", "content": "  "}], "every message of the prompt has empty content"),
    ("prompt", [{"role": "user", "content": None}], "message 0's 'content' must be a string, got None"),
    ("reward_model", {"style": "rule", "ground_truth": None}, "reward_model.ground_truth is missing or null"),
])
def test_bad_rows_fail_at_load_naming_file_row_and_column(tmp_path, tiny_tokenizer, column, value, problem):
    good = rows(["Compute 1 + 2.", "Compute 3 + 4."])
    path = write(tmp_path / "a.parquet", [*good, bad_row(column, value), *good])
    with pytest.raises(DataError, match=re.escape(f"a.parquet row 2, column '{column}': {problem}")):
        RLHFDataset(path, tiny_tokenizer, {"max_prompt_length": 32}, require_ground_truth=True)


def test_ground_truth_is_checked_only_when_required(tmp_path, tiny_tokenizer):
    table = pa.table({"prompt": ["1 + 1 =", "2 + 2 ="], "reward_model": ['{"ground_truth": "2"}', "4"]})
    path = tmp_path / "strings.parquet"
    pq.write_table(table, path)
    assert len(RLHFDataset(path, tiny_tokenizer, {"max_prompt_length": 16})) == 2  # e.g. for generation
    with pytest.raises(DataError, match=r"(?s)2 of 2 data rows.*strings\.parquet row 0, column 'reward_model': "
                                        r"must be a dict with a 'ground_truth' entry, got str.*Fix: store"):
        RLHFDataset(path, tiny_tokenizer, {"max_prompt_length": 16}, require_ground_truth=True)
    no_column = write(tmp_path / "no_rm.parquet", [{"prompt": "1 + 1 ="}])
    with pytest.raises(KeyError, match=r"no_rm\.parquet has no column 'reward_model'"):
        RLHFDataset(no_column, tiny_tokenizer, {"max_prompt_length": 16}, require_ground_truth=True)


def test_batched_prompt_lengths_match_each_item(tmp_path, tiny_tokenizer):
    chats = write(tmp_path / "chats.parquet", rows(["1+1", "Compute 37 + 48 column by column."]))
    strings = write(tmp_path / "strings.parquet", [{"prompt": "1 + 1 ="}, {"prompt": "a longer plain prompt"}])
    ds = RLHFDataset([chats, strings], tiny_tokenizer, {"max_prompt_length": 64, "truncation": "left"})
    # strings get the tokenizer's special tokens and chats only their template's: both ways agree per row
    assert ds.prompt_lengths() == [len(ds[i]["raw_prompt_ids"]) for i in range(4)]
    assert max(ds.prompt_lengths()) < 64  # no item was truncated
    assert ds.prompt_lengths()[0] == len(template_ids(tiny_tokenizer, "1+1")[0])


def test_filter_overlong_prompts_counts_and_logs(tmp_path, tiny_tokenizer, caplog):
    questions = ["1+1", "a much longer prompt " * 5, "2+2", "another very long prompt " * 5, "3+3"]
    path = write(tmp_path / "a.parquet", rows(questions))
    with caplog.at_level(logging.INFO, logger="hybridrl.data.rl_dataset"):
        ds = RLHFDataset(path, tiny_tokenizer, {"max_prompt_length": 24, "filter_overlong_prompts": True})
    assert (len(ds), ds.num_filtered) == (3, 2)
    assert "filtered 2 of 5 prompts longer than max_prompt_length=24" in caplog.text
    assert [ds[i]["extra_info"]["question"] for i in range(3)] == ["1+1", "2+2", "3+3"]
    with pytest.raises(ValueError, match="every prompt"):
        RLHFDataset(path, tiny_tokenizer, {"max_prompt_length": 2, "filter_overlong_prompts": True})


def test_non_tensor_pass_through(tmp_path, tiny_tokenizer):
    table = rows(["Compute 1 + 2."])
    path = write(tmp_path / "a.parquet", table)
    plain = RLHFDataset(path, tiny_tokenizer, {"max_prompt_length": 32})[0]
    assert plain["data_source"] == "arithmetic" and plain["ability"] == "math"
    assert plain["reward_model"] == {"style": "rule", "ground_truth": "0"}
    assert plain["extra_info"] == table[0]["extra_info"]
    assert plain["index"] == 100  # from extra_info, as verl
    assert "prompt" not in plain and "raw_prompt" not in plain and "full_prompts" not in plain
    cfg = {"max_prompt_length": 32, "return_raw_chat": True, "return_full_prompt": True}
    item = RLHFDataset(path, tiny_tokenizer, cfg)[0]
    assert item["raw_prompt"] == [{"role": "user", "content": "Compute 1 + 2."}]
    assert item["full_prompts"] == template_ids(tiny_tokenizer, "Compute 1 + 2.")[1]


def test_raw_string_prompt_and_custom_prompt_key(tmp_path, tiny_tokenizer):
    path = write(tmp_path / "a.parquet", [{"question": "1 + 1 =", "data_source": "x"}])
    item = RLHFDataset(path, tiny_tokenizer, {"max_prompt_length": 16, "prompt_key": "question"})[0]
    expected = tiny_tokenizer("1 + 1 =", add_special_tokens=True)["input_ids"]
    assert item["raw_prompt_ids"] == expected
    assert item["index"] == 0  # no extra_info


def test_many_files_concatenate_in_order(tmp_path, tiny_tokenizer):
    a = write(tmp_path / "a.parquet", rows(["a0", "a1"]))
    b = write(tmp_path / "b.parquet", rows(["b0", "b1", "b2"], data_source="other"))
    ds = RLHFDataset([a, str(b)], tiny_tokenizer, {"max_prompt_length": 32})
    assert len(ds) == 5
    assert [ds[i]["extra_info"]["question"] for i in range(5)] == ["a0", "a1", "b0", "b1", "b2"]
    assert ds[4]["data_source"] == "other"


def test_clear_errors(tmp_path, tiny_tokenizer):
    with pytest.raises(FileNotFoundError, match="missing.parquet"):
        RLHFDataset(tmp_path / "missing.parquet", tiny_tokenizer)
    bad = write(tmp_path / "bad.parquet", [{"question": "q"}])
    with pytest.raises(KeyError, match=r"bad\.parquet has no column 'prompt' \(data.prompt_key\).*question"):
        RLHFDataset(bad, tiny_tokenizer)
    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"prompt": pa.array([], type=pa.string())}), empty)
    with pytest.raises(ValueError, match=r"empty\.parquet has no rows"):
        RLHFDataset(empty, tiny_tokenizer)
    with pytest.raises(ValueError, match="data.truncation must be one of"):
        RLDatasetConfig(truncation="cut")
    numeric = write(tmp_path / "num.parquet", [{"prompt": 5}])
    with pytest.raises(DataError, match=r"num\.parquet row 0, column 'prompt': must hold a list of chat messages"):
        RLHFDataset(numeric, tiny_tokenizer)


def test_chat_prompt_without_template_is_refused(tmp_path, tiny_model_dir):
    from hybridrl.models.loading import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)  # a private copy: the shared fixture must not be mutated
    tok.chat_template = None
    path = write(tmp_path / "a.parquet", rows(["q"]))
    with pytest.raises(ValueError, match=r"a\.parquet row 0: .*no chat_template"):
        RLHFDataset(path, tok, {"truncation": "left"})  # refused at load even when no length is measured


def test_config_from_a_data_section_with_other_keys(tiny_tokenizer, tmp_path):
    section = OmegaConf.create({"train_batch_size": 8, "max_prompt_length": 40, "truncation": "left",
                                "apply_chat_template_kwargs": {}, "train_files": "x"})  # fmt: skip
    cfg = RLDatasetConfig.from_mapping(section)
    assert (cfg.max_prompt_length, cfg.truncation, cfg.prompt_key) == (40, "left", "prompt")


def test_collate_gives_dataproto_input(tmp_path, tiny_tokenizer):
    path = write(tmp_path / "a.parquet", rows(["1+1", "22+22", "333+333"]))
    ds = RLHFDataset(path, tiny_tokenizer, {"max_prompt_length": 32, "truncation": "left"})
    batch = collate_fn([ds[i] for i in range(3)])
    assert batch["input_ids"].shape == (3, 32) and batch["input_ids"].dtype == torch.long
    for key in ("data_source", "reward_model", "extra_info", "raw_prompt_ids", "index"):
        assert isinstance(batch[key], np.ndarray) and batch[key].dtype == object and batch[key].shape == (3,)
    assert batch["raw_prompt_ids"][2] == ds[2]["raw_prompt_ids"]
    data = DataProto.from_single_dict(batch)
    assert len(data) == 3
    assert set(data.batch.keys()) == {"input_ids", "attention_mask", "position_ids"}
    assert list(data.non_tensor_batch["index"]) == [100, 101, 102]
    # equal-length lists stay one list per row rather than becoming a 2-D array
    same = collate_fn([{"ids": [1, 2]}, {"ids": [3, 4]}])["ids"]
    assert same.shape == (2,) and same[1] == [3, 4]


@pytest.mark.parametrize("task", [arithmetic, countdown])
def test_task_files_load(tmp_path, tiny_tokenizer, task):
    task.main(["--out", str(tmp_path), "--train-size", "12", "--test-size", "4"])
    ds = RLHFDataset(
        [tmp_path / "train.parquet"], tiny_tokenizer, {"max_prompt_length": 256, "return_raw_chat": True}
    )
    assert len(ds) == 12
    item = ds[3]
    real = item["input_ids"][item["attention_mask"].bool()]
    text = tiny_tokenizer.decode(real.tolist())
    assert item["raw_prompt"][0]["content"] in text
    assert item["data_source"] == task.DATA_SOURCE


def test_tool_schemas_reach_the_chat_template(tmp_path, tiny_model_dir):
    """With multi-turn tools configured, a template that describes tools in the prompt shows them."""
    from hybridrl.models.loading import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)  # a private copy: the shared fixture must not be mutated
    tok.chat_template = (
        "{%- if tools %}{{- '<|im_start|>system\\nTools:' }}{%- for tool in tools %}"
        "{{- ' ' + tool['function']['name'] + '(' + (tool['function']['parameters']['required'] | join(',')) + ')' }}"
        "{%- endfor %}{{- '<|im_end|>\\n' }}{%- endif %}"
        "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
        "'<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
    path = write(tmp_path / "a.parquet", rows(["1+1"]))
    tool_yaml = Path(__file__).parents[2] / "examples" / "calculator_tool.yaml"
    settings = {"max_prompt_length": 64, "return_full_prompt": True}
    with_tools = RLHFDataset(path, tok, {**settings, "tool_config_path": str(tool_yaml)})[0]
    without = RLHFDataset(path, tok, settings)[0]
    assert with_tools["full_prompts"].startswith("<|im_start|>system\nTools: calculator(expression)<|im_end|>\n")
    assert with_tools["full_prompts"].endswith(without["full_prompts"])
    assert len(with_tools["raw_prompt_ids"]) > len(without["raw_prompt_ids"])  # lengths count the tools


def test_the_ppo_config_points_the_data_tools_at_the_rollout_ones():
    import hybridrl.trainer.main_ppo  # noqa: F401  (registers the config schema)
    from hybridrl.quickstart import _compose

    cfg = _compose("ppo_trainer", ["data.train_files=x", "actor_rollout_ref.rollout.multi_turn.tool_config_path=t.yaml"])
    assert cfg.data.tool_config_path == "t.yaml" and cfg.data.function_tool_path is None
