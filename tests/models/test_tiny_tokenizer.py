"""The tiny tokenizer: digits stay single tokens, any text round-trips, and reloading keeps the ids."""

from __future__ import annotations

import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from hybridrl.models.loading import load_tokenizer, padding_side
from hybridrl.models.tiny import (
    BOS_TOKEN,
    EOS_TOKEN,
    PAD_TOKEN,
    build_raw_tokenizer,
    build_tiny_tokenizer,
)

# Text that stresses the pre-tokenizer: runs of spaces, tabs, newlines (single, double, \r\n), digits
# glued to letters and operators, punctuation runs, contractions, non-ASCII letters, emoji, control chars.
VARIED_TEXTS = [
    "What is 37 + 48?",
    "Compute 12345 * 6789 column by column; put the result in <answer></answer>.",
    "7+8+0=5 c1\n3+4+1=8 c0\n<answer>85</answer>",
    "  leading and trailing spaces  ",
    "tabs\tand\t\tmore\ttabs",
    "line one\n\nline three\r\nwindows line\n\n\n",
    "It's, they're, we'll; I'd've... !!! ??? ((x)) [1, 2] {a: b} #### 72 \\boxed{\\frac{1}{2}}",
    "Ünïcödé café naïve 中文 日本語 😀🎉",
    "control\x00chars\x07here\x1b[0m",
    "x" * 50 + " " + "9" * 30,
]


def _reference_ids(raw: Tokenizer, text: str) -> list[int]:
    return raw.encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize("arch_dir", ["tiny_model_dir", "tiny_llama_dir"])
def test_autotokenizer_ids_equal_raw_tokenizer_ids(arch_dir: str, request: pytest.FixtureRequest) -> None:
    # transformers 5.x rebuilds a qwen2 directory's tokenizer as Qwen2Tokenizer from vocab + merges alone;
    # the llama directory loads tokenizer.json verbatim. Both must give the trained tokenizer's ids.
    model_dir: Path = request.getfixturevalue(arch_dir)
    raw = build_raw_tokenizer()
    from_file = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    auto = AutoTokenizer.from_pretrained(model_dir)
    if arch_dir == "tiny_model_dir":
        assert type(auto).__name__ == "Qwen2Tokenizer"  # the rebuild path is really exercised
    for text in VARIED_TEXTS:
        expected = _reference_ids(raw, text)
        assert _reference_ids(from_file, text) == expected, text
        assert auto(text)["input_ids"] == expected, text
        assert auto.encode(text, add_special_tokens=False) == expected, text


@pytest.mark.parametrize("arch_dir", ["tiny_model_dir", "tiny_llama_dir"])
def test_chat_template_ids_survive_reload(arch_dir: str, request: pytest.FixtureRequest) -> None:
    model_dir: Path = request.getfixturevalue(arch_dir)
    raw = build_raw_tokenizer()
    auto = AutoTokenizer.from_pretrained(model_dir)
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": "2+3+0=5 c0\n<answer>5</answer>"},
        {"role": "user", "content": "And 10 * 10?"},
    ]
    text = auto.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|begin_of_text|><|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n"
        "<|im_start|>assistant\n2+3+0=5 c0\n<answer>5</answer><|im_end|>\n"
        "<|im_start|>user\nAnd 10 * 10?<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = auto.apply_chat_template(chat, tokenize=True, add_generation_prompt=True, return_dict=False)
    assert list(ids) == _reference_ids(raw, text)
    # Special tokens are single ids, not spelled out character by character.
    assert ids[0] == auto.convert_tokens_to_ids(BOS_TOKEN)
    assert ids.count(auto.convert_tokens_to_ids(EOS_TOKEN)) == 4  # one per finished turn (3) + system (1)


def test_every_digit_is_its_own_token() -> None:
    tokenizer = build_tiny_tokenizer()
    # Invariant of the vocabulary: a token containing a digit is exactly one digit.
    for token in tokenizer.get_vocab():
        if any(ch.isdigit() for ch in token):
            assert len(token) == 1, token
    ids = tokenizer("1234567890 + 99", add_special_tokens=False)["input_ids"]
    pieces = [tokenizer.decode([i]) for i in ids]
    assert [p for p in pieces if p.strip().isdigit()] == list("123456789099")


@pytest.mark.parametrize("text", VARIED_TEXTS)
def test_any_text_round_trips(text: str) -> None:
    # Byte-level alphabet: no unknown token, decode(encode(x)) == x (after the NFC normalizer).
    tokenizer = build_tiny_tokenizer()
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == unicodedata.normalize("NFC", text)


def test_special_tokens_and_no_implicit_bos(tiny_tokenizer) -> None:
    assert (tiny_tokenizer.pad_token, tiny_tokenizer.bos_token, tiny_tokenizer.eos_token) == (
        PAD_TOKEN,
        BOS_TOKEN,
        EOS_TOKEN,
    )
    assert (tiny_tokenizer.pad_token_id, tiny_tokenizer.bos_token_id, tiny_tokenizer.eos_token_id) == (
        0,
        1,
        3,
    )
    # Like Qwen, plain encoding adds nothing; the chat template writes BOS.
    assert tiny_tokenizer("ab")["input_ids"] == tiny_tokenizer("ab", add_special_tokens=False)["input_ids"]


def test_vocab_size_too_small_is_rejected() -> None:
    with pytest.raises(ValueError, match="vocab_size=100 is too small"):
        build_raw_tokenizer(vocab_size=100)


def test_padding_side_on_load_and_temporarily(tiny_model_dir: Path, tiny_tokenizer) -> None:
    left = load_tokenizer(tiny_model_dir, padding_side="left")
    batch = left(["1", "1 2 3"], padding=True)["input_ids"]
    assert batch[0][:-1] == [0] * (len(batch[0]) - 1)  # pad id 0 in front of the short row
    assert tiny_tokenizer.padding_side == "right"
    with padding_side(tiny_tokenizer, "left"):
        assert tiny_tokenizer(["1", "1 2 3"], padding=True)["input_ids"] == batch
    assert tiny_tokenizer.padding_side == "right"  # restored
    with pytest.raises(ValueError, match="padding_side must be 'left' or 'right'"):
        load_tokenizer(tiny_model_dir, padding_side="middle")


def test_training_is_deterministic_across_processes() -> None:
    # The BPE trainer is Rust code with hash maps seeded per process; a fresh interpreter must still
    # learn the same merges, or "same seed -> same files" would hold only within one process.
    code = "from hybridrl.models.tiny import build_raw_tokenizer; print(build_raw_tokenizer().to_str())"
    fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert fresh.strip() == build_raw_tokenizer().to_str()
