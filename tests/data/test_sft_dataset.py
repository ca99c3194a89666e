"""SFT dataset: the loss mask covers exactly the assistant tokens, in both of verl's row layouts."""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from hybridrl.data import sft_dataset
from hybridrl.data.rl_dataset import DataError
from hybridrl.data.sft_dataset import SFTDataset, encode_chat

EOS = "<|im_end|>"


def _write(rows: list[dict], path: Path) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _rl_row(index: int, question: str, answer: str) -> dict:
    """A row in the task files' schema (verl's RL layout, with the worked answer in extra_info)."""
    return {
        "data_source": "arithmetic",
        "prompt": [{"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer[-1]},
        "extra_info": {"split": "train", "index": index, "question": question, "answer": answer},
    }


def _pieces(tokenizer, ids) -> list[str]:
    return [tokenizer.decode([i]) for i in ids]


def test_single_turn_mask_by_hand(tiny_tokenizer) -> None:
    ids, mask = encode_chat(
        tiny_tokenizer, [{"role": "user", "content": "1+1"}, {"role": "assistant", "content": "2"}]
    )
    # Rendered: <|begin_of_text|><|im_start|>user\n1+1<|im_end|>\n<|im_start|>assistant\n2<|im_end|>\n
    # The assistant writes "2" and its end-of-turn token; the header before and the newline after are context.
    expected = [
        ("<|begin_of_text|>", 0), ("<|im_start|>", 0), ("user", 0), ("\n", 0), ("1", 0), ("+", 0), ("1", 0),
        (EOS, 0), ("\n", 0), ("<|im_start|>", 0), ("assistant", 0), ("\n", 0),
        ("2", 1), (EOS, 1),
        ("\n", 0),
    ]  # fmt: skip
    assert list(zip(_pieces(tiny_tokenizer, ids), mask, strict=True)) == expected


def test_multi_turn_mask_by_hand(tiny_tokenizer) -> None:
    chat = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "d 7"},
    ]
    ids, mask = encode_chat(tiny_tokenizer, chat)
    expected = [
        ("<|begin_of_text|>", 0),
        ("<|im_start|>", 0), ("system", 0), ("\n", 0), ("S", 0), (EOS, 0), ("\n", 0),
        ("<|im_start|>", 0), ("user", 0), ("\n", 0), ("a", 0), (EOS, 0), ("\n", 0),
        ("<|im_start|>", 0), ("assistant", 0), ("\n", 0), ("b", 1), (EOS, 1), ("\n", 0),
        ("<|im_start|>", 0), ("user", 0), ("\n", 0), ("c", 0), (EOS, 0), ("\n", 0),
        ("<|im_start|>", 0), ("assistant", 0), ("\n", 0), ("d", 1), (" ", 1), ("7", 1), (EOS, 1), ("\n", 0),
    ]  # fmt: skip
    assert list(zip(_pieces(tiny_tokenizer, ids), mask, strict=True)) == expected


def test_item_tensors_padding_and_positions(tiny_tokenizer, tmp_path: Path) -> None:
    path = _write([{"prompt": "1+1", "response": "2"}], tmp_path / "sft.parquet")
    item = SFTDataset(path, tiny_tokenizer, max_length=20)[0]
    # 15 real tokens (the hand-checked single-turn chat above), then 5 pads.
    assert {k: (v.shape, v.dtype) for k, v in item.items()} == {
        k: (torch.Size([20]), torch.long)
        for k in ("input_ids", "attention_mask", "position_ids", "loss_mask")
    }
    assert item["input_ids"][15:].tolist() == [tiny_tokenizer.pad_token_id] * 5
    assert item["attention_mask"].tolist() == [1] * 15 + [0] * 5
    assert item["position_ids"].tolist() == list(range(15)) + [14] * 5
    assert item["loss_mask"].tolist() == [0] * 12 + [1, 1] + [0] * 6


@pytest.mark.parametrize("layout", ["extra_info", "prompt_column", "messages"])
def test_task_schema_layouts_train_on_exactly_the_answer(layout: str, tiny_tokenizer, tmp_path: Path) -> None:
    qa = [("Compute 37 + 48 column by column.", "7+8+0=5 c1\n3+4+1=8 c0\n<answer>85</answer>"),
          ("Compute 5 - 9 column by column.", "5<9 so 5-9=-(9-5)\n9-5-0=4 b0\n<answer>-4</answer>")]  # fmt: skip
    rows = [_rl_row(i, q, a) for i, (q, a) in enumerate(qa)]
    if layout == "messages":
        rows = [
            {"messages": [*r["prompt"], {"role": "assistant", "content": a}]}
            for r, (_, a) in zip(rows, qa, strict=True)
        ]
    path = _write(rows, tmp_path / "train.parquet")
    kwargs = {
        "extra_info": {"prompt_key": "extra_info", "prompt_dict_keys": ["question"]},
        "prompt_column": {"prompt_key": "prompt"},
        "messages": {"messages_key": "messages"},
    }[layout]
    if layout != "messages":
        kwargs |= {"response_key": "extra_info", "response_dict_keys": ["answer"]}
    dataset = SFTDataset(path, tiny_tokenizer, max_length=128, **kwargs)
    assert len(dataset) == 2
    for item, (question, answer) in zip(dataset, qa, strict=True):
        trained = item["input_ids"][item["loss_mask"].bool()]
        assert tiny_tokenizer.decode(trained) == answer + EOS
        context = tiny_tokenizer.decode(item["input_ids"][item["attention_mask"].bool()])
        assert context.startswith(
            f"<|begin_of_text|><|im_start|>user\n{question}{EOS}\n<|im_start|>assistant\n"
        )


def test_reads_the_arithmetic_task_files(tiny_tokenizer, tmp_path: Path) -> None:
    # The contract with hybridrl.data.tasks: extra_info.answer is the full worked target response.
    from hybridrl.data.tasks.arithmetic import main as make_arithmetic

    make_arithmetic(["--out", str(tmp_path), "--train-size", "6", "--test-size", "2", "--seed", "1"])
    rows = pq.read_table(tmp_path / "train.parquet").to_pylist()
    dataset = SFTDataset(
        tmp_path / "train.parquet", tiny_tokenizer, prompt_key="prompt",
        response_key="extra_info", response_dict_keys=["answer"], max_length=256,
    )  # fmt: skip
    for item, row in zip(dataset, rows, strict=True):
        assert (
            tiny_tokenizer.decode(item["input_ids"][item["loss_mask"].bool()])
            == row["extra_info"]["answer"] + EOS
        )


def test_many_files_concatenate_in_order(tiny_tokenizer, tmp_path: Path) -> None:
    a = _write([{"prompt": "q1", "response": "r1"}], tmp_path / "a.parquet")
    b = _write(
        [{"prompt": "q2", "response": "r2"}, {"prompt": "q3", "response": "r3"}], tmp_path / "b.parquet"
    )
    dataset = SFTDataset([a, b], tiny_tokenizer, max_length=32)
    answers = [tiny_tokenizer.decode(item["input_ids"][item["loss_mask"].bool()]) for item in dataset]
    assert answers == ["r1" + EOS, "r2" + EOS, "r3" + EOS]


def test_truncation_modes(tiny_tokenizer, tmp_path: Path) -> None:
    path = _write(
        [{"prompt": "1+1", "response": "2"}, {"prompt": "1+1", "response": "2 3 4"}], tmp_path / "t.parquet"
    )
    full_ids, full_mask = encode_chat(
        tiny_tokenizer, [{"role": "user", "content": "1+1"}, {"role": "assistant", "content": "2 3 4"}]
    )
    assert len(full_ids) == 19  # 15 tokens of the single-turn chat + " ", "3", " ", "4"
    # truncation="error" refuses the file when it is built, naming the row, not when a step reaches it
    with pytest.raises(DataError, match=r"(?s)1 of 2 data rows.*t\.parquet row 1, column 'prompt' \+ 'response': "
                                        r"the chat has 19 tokens, more than max_length=16.*data\.truncation=left"):
        SFTDataset(path, tiny_tokenizer, max_length=16)
    assert SFTDataset(path, tiny_tokenizer, max_length=19)[1]["attention_mask"].sum() == 19  # it fits exactly
    left = SFTDataset(path, tiny_tokenizer, max_length=16, truncation="left")[1]
    assert left["input_ids"].tolist() == full_ids[-16:] and left["loss_mask"].tolist() == full_mask[-16:]
    assert left["position_ids"].tolist() == list(range(16))
    right = SFTDataset(path, tiny_tokenizer, max_length=16, truncation="right")[1]
    assert right["input_ids"].tolist() == full_ids[:16] and right["loss_mask"].tolist() == full_mask[:16]


def test_bad_input_errors_name_the_field(tiny_tokenizer, tmp_path: Path) -> None:
    rl = _write([_rl_row(0, "q", "a")], tmp_path / "rl.parquet")
    with pytest.raises(
        KeyError, match=r"column 'response' not found; columns are \['ability', 'data_source'"
    ):
        SFTDataset(rl, tiny_tokenizer)
    with pytest.raises(KeyError, match=r"rl\.parquet row 0: extra_info\['solution'\] is missing or null"):
        SFTDataset(rl, tiny_tokenizer, response_key="extra_info", response_dict_keys=["solution"])
    with pytest.raises(ValueError, match=r"row 0: the response \(extra_info\) must be a string, got dict"):
        SFTDataset(rl, tiny_tokenizer, response_key="extra_info")
    with pytest.raises(ValueError, match="truncation must be one of"):
        SFTDataset(rl, tiny_tokenizer, truncation="middle")
    with pytest.raises(FileNotFoundError, match="nothing.parquet"):
        SFTDataset(tmp_path / "nothing.parquet", tiny_tokenizer)
    chats = _write(
        [
            {"messages": [{"role": "user", "content": "q"}]},
            {"messages": [{"role": "assistant", "content": "a"}]},
        ],
        tmp_path / "m.parquet",
    )
    with pytest.raises(ValueError, match=r"m\.parquet row 0 has no assistant message"):
        SFTDataset(chats, tiny_tokenizer, messages_key="messages")
    with pytest.raises(ValueError, match="must not start with an assistant turn"):
        encode_chat(tiny_tokenizer, [{"role": "assistant", "content": "a"}, {"role": "user", "content": "q"}])


def test_other_chat_templates_and_the_missing_eos_warning(
    tiny_tokenizer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A plain "role: content" template whose assistant turns do not end with EOS.
    template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    path = _write([{"prompt": "1+1", "response": "2 3"}], tmp_path / "plain.parquet")
    with caplog.at_level(logging.WARNING, logger="hybridrl.data.sft_dataset"):
        dataset = SFTDataset(
            path, tiny_tokenizer, max_length=32, apply_chat_template_kwargs={"chat_template": template}
        )
        assert "without the EOS token '<|im_end|>'" in caplog.text
        caplog.clear()
        SFTDataset(path, tiny_tokenizer, max_length=32)  # the ChatML template closes turns with EOS
        assert "EOS" not in caplog.text
    item = dataset[0]
    # Rendered "user: 1+1\nassistant: 2 3\n"; the assistant span is "2 3" (the trailing newline is not).
    assert tiny_tokenizer.decode(item["input_ids"][item["loss_mask"].bool()]) == "2 3"
    assert (
        tiny_tokenizer.decode(item["input_ids"][item["attention_mask"].bool()])
        == "user: 1+1\nassistant: 2 3\n"
    )


def _padded_by_hand(tokenizer, chat: list[dict], max_length: int) -> dict[str, list[int]]:
    ids, mask = encode_chat(tokenizer, chat)
    pad = max_length - len(ids)
    return {"input_ids": ids + [tokenizer.pad_token_id] * pad, "attention_mask": [1] * len(ids) + [0] * pad,
            "position_ids": list(range(len(ids))) + [len(ids) - 1] * pad, "loss_mask": mask + [0] * pad}


def _count_encodings(monkeypatch) -> list[int]:
    """A list that grows by one at every `encode_chat` call the dataset makes."""
    calls: list[int] = []
    real = sft_dataset.encode_chat
    monkeypatch.setattr(sft_dataset, "encode_chat", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def test_a_row_is_encoded_once_and_every_read_gives_the_same_fresh_item(tiny_tokenizer, tmp_path, monkeypatch):
    rows = [{"prompt": f"{i}+{i}", "response": str(2 * i)} for i in range(3)]
    dataset = SFTDataset(_write(rows, tmp_path / "sft.parquet"), tiny_tokenizer, max_length=24)
    calls = _count_encodings(monkeypatch)
    for _epoch in range(3):
        for index, row in enumerate(rows):
            item = dataset[index]
            chat = [{"role": "user", "content": row["prompt"]}, {"role": "assistant", "content": row["response"]}]
            assert {k: v.tolist() for k, v in item.items()} == _padded_by_hand(tiny_tokenizer, chat, 24)
            assert all(v.dtype == torch.long for v in item.values())
            item["input_ids"][:] = -1  # a consumer writing into an item must not change the next read
    assert len(calls) == len(rows)  # the first epoch encoded each row; later reads reused it


def test_rows_past_the_token_budget_are_encoded_at_every_read(tiny_tokenizer, tmp_path, monkeypatch):
    rows = [{"prompt": f"{i}+{i}", "response": str(2 * i)} for i in range(3)]
    dataset = SFTDataset(_write(rows, tmp_path / "sft.parquet"), tiny_tokenizer, max_length=24)
    first_length = int(dataset[0]["attention_mask"].sum())
    monkeypatch.setattr(sft_dataset, "ENCODED_CACHE_TOKENS", first_length)  # room for row 0 only
    calls = _count_encodings(monkeypatch)
    reads = [[dataset[i]["input_ids"].tolist() for i in range(3)] for _ in range(2)]
    assert reads[0] == reads[1]
    assert len(calls) == 4  # rows 1 and 2, twice each; row 0 was kept by its first read
