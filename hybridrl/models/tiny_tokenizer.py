"""A small byte-level BPE tokenizer, trained locally, for hybridrl's tiny models.

Design (why it looks like Qwen's tokenizer):

* transformers 5.x ignores the pipeline stored in a `qwen2` directory's `tokenizer.json`: `AutoTokenizer`
  rebuilds a `Qwen2Tokenizer` from the vocab and merges alone, with Qwen's NFC normalizer, Qwen's
  pre-tokenization regex and a byte-level mapping (`qwen2` is in transformers'
  `MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS`). A tokenizer trained with any other pipeline would silently
  get different ids after reloading. So we train with exactly that pipeline; reloading through the
  `qwen2` path or verbatim from `tokenizer.json` (the `llama` path) then gives identical ids.
* Qwen's regex isolates every digit (`\\p{N}` matches one character), so no merge can ever join two digits:
  each digit is its own token, which the arithmetic tasks need (a tiny model learns digit-by-digit
  procedures, not memorised multi-digit chunks).
* The byte-level alphabet holds all 256 bytes, so any text (accents, emoji, control characters) encodes
  without an unknown token and decodes back unchanged.

Special tokens and the chat template follow ChatML (the format of Qwen2.5-Instruct), with a BOS token
in front: ``<|begin_of_text|><|im_start|>user\\n...<|im_end|>\\n<|im_start|>assistant\\n``. The EOS token
is ``<|im_end|>`` so generation stops at the end of the assistant's turn; ``<|endoftext|>`` pads.
"""

from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

# Qwen2's pre-tokenization regex, as transformers' Qwen2Tokenizer rebuilds it. It must match that
# class character for character, or reloading a `qwen2` directory changes the ids (see module doc).
QWEN2_PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

# Upper bound of the learned vocabulary: 256 bytes + 4 special tokens + ~250 merges of common words.
DEFAULT_VOCAB_SIZE = 512

PAD_TOKEN = "<|endoftext|>"
BOS_TOKEN = "<|begin_of_text|>"
IM_START = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
# Order fixes the ids: pad=0, bos=1, im_start=2, eos=3.
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, IM_START, EOS_TOKEN)

# Jinja chat template (ChatML). `add_generation_prompt=True` appends the assistant header so a model
# continues with the answer; every turn ends with the EOS token, so SFT teaches the model to stop.
CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Text the BPE merges are learned from: the phrasing of hybridrl's tasks (arithmetic, countdown,
# GSM8K/MATH style), the chat roles, and every printable ASCII character. Merges only shorten
# sequences; coverage of every character comes from the byte-level alphabet, not from this corpus.
_CORPUS_LINES = (
    "Compute 37 + 48 column by column; put the result in <answer></answer>.",
    "7+8+0=5 c1\n3+4+1=8 c0\n<answer>85</answer>",
    "38<52 so 38-52=-(52-38)\n2-8-0=4 b1\n7*6+0=2 c4\n2+0+0=2 c0\n<answer>-14</answer>",
    "What is 37 + 48? Add the numbers digit by digit, starting from the ones digit.",
    "What is 52 - 19? Subtract digit by digit and borrow when needed.",
    "What is 23 * 4? Multiply each digit and carry the tens.",
    "ones: 7 + 8 = 15, write 5 carry 1. tens: 3 + 4 + 1 = 8, write 8. The answer is 85.",
    "Compute the sum, the difference and the product. Answer with the final number only.",
    "Using the numbers [19, 36, 55, 7], create an equation that equals 65.",
    "You can use basic arithmetic operations (+, -, *, /) and each number can only be used once.",
    "Show your work in <think> </think> tags. And return the final answer in <answer> </answer> tags,",
    "for example <answer> (1 + 2) / 3 </answer>.",
    "<think> 55 + 36 - 19 - 7 = 65 </think> <answer> 55 + 36 - 19 - 7 </answer>",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
    "How many clips did Natalia sold altogether in April and May?",
    'Let\'s think step by step and output the final answer after "####".',
    "In May she sold 48 / 2 = 24 clips. Altogether she sold 48 + 24 = 72 clips. #### 72",
    "Let's think step by step and output the final answer within \\boxed{}.",
    "The total is $1,234 and the ratio is \\frac{3}{4}, so the answer is \\boxed{\\frac{3}{4}}.",
    # The chat template writes these role names in every turn, so they deserve their own tokens.
    "system\nuser\nassistant\n" * 8,
    "You are a helpful assistant. Question: Answer: Solution: Therefore,",
    "the a an of to in is are was were and or not if then each every how many much more less than",
    string.printable,
)


def tiny_corpus(repeats: int = 4) -> list[str]:
    """The built-in training text, repeated so that pairs occurring once still reach `min_frequency`."""
    return list(_CORPUS_LINES) * repeats


def _qwen2_pipeline_tokenizer() -> Tokenizer:
    """An empty BPE tokenizer with the exact normalizer / pre-tokenizer / decoder of Qwen2Tokenizer."""
    tokenizer = Tokenizer(
        models.BPE(
            unk_token=None,  # byte-level: every byte is in the alphabet, nothing is unknown
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def build_raw_tokenizer(vocab_size: int = DEFAULT_VOCAB_SIZE, corpus: list[str] | None = None) -> Tokenizer:
    """Train the byte-level BPE on `corpus` (default: the built-in task corpus).

    `vocab_size` is an upper bound: training stops early when no pair reaches frequency 2, so the real
    size is `len(tokenizer)`. It must leave room for the 256 byte symbols and the 4 special tokens.
    """
    minimum = 256 + len(SPECIAL_TOKENS)
    if vocab_size < minimum:
        raise ValueError(
            f"vocab_size={vocab_size} is too small: the byte alphabet and special tokens need {minimum}"
        )
    tokenizer = _qwen2_pipeline_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus if corpus is not None else tiny_corpus(), trainer=trainer)
    return tokenizer


def build_tiny_tokenizer(
    vocab_size: int = DEFAULT_VOCAB_SIZE, corpus: list[str] | None = None
) -> PreTrainedTokenizerFast:
    """The trained tokenizer wrapped for transformers, with special tokens and the chat template set.

    Encoding adds no special tokens by itself (like Qwen); the chat template writes the BOS token.
    """
    return PreTrainedTokenizerFast(
        tokenizer_object=build_raw_tokenizer(vocab_size, corpus),
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        chat_template=CHAT_TEMPLATE,
        padding_side="right",
    )
