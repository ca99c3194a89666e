"""Build a tiny Qwen2 or Llama model and its tokenizer offline, as a normal Hugging Face directory.

    python -m hybridrl.models.tiny --out models/tiny-qwen2-1m --arch qwen2 --size 1m --seed 0

The directory holds `config.json`, `model.safetensors`, `generation_config.json`, `tokenizer.json`,
`tokenizer_config.json` (with the chat template) and reloads with `from_pretrained` or
`hybridrl.models.load_causal_lm`. The weights are random (seeded): the model is meant to be trained from
scratch by SFT and RL on hybridrl's tasks. Same arguments and seed give byte-identical files.

Size presets (parameter counts with the default ~512-token vocabulary and tied embeddings):

    name   hidden  layers  heads  kv_heads  intermediate   parameters
    1m     128     4       4      2         448            ~0.95M
    3m     192     6       6      2         640            ~2.9M
    10m    256     10      8      4         1024           ~10M
    50m    512     12      8      4         2048           ~47M

Any of hidden size, layers, heads, kv heads and intermediate size can be overridden.

The tokenizer is a small byte-level BPE trained here with Qwen2's own pipeline (`build_tiny_tokenizer`).
"""

from __future__ import annotations

import argparse
import json
import string
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import (
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from hybridrl.utils.registry import Registry

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


# A small byte-level BPE tokenizer, trained locally, for hybridrl's tiny models.
#
# Design (why it looks like Qwen's tokenizer):
#
# * transformers 5.x ignores the pipeline stored in a `qwen2` directory's `tokenizer.json`: `AutoTokenizer`
#   rebuilds a `Qwen2Tokenizer` from the vocab and merges alone, with Qwen's NFC normalizer, Qwen's
#   pre-tokenization regex and a byte-level mapping (`qwen2` is in transformers'
#   `MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS`). A tokenizer trained with any other pipeline would silently
#   get different ids after reloading. So we train with exactly that pipeline; reloading through the
#   `qwen2` path or verbatim from `tokenizer.json` (the `llama` path) then gives identical ids.
# * Qwen's regex isolates every digit (`\p{N}` matches one character), so no merge can ever join two digits:
#   each digit is its own token, which the arithmetic tasks need (a tiny model learns digit-by-digit
#   procedures, not memorised multi-digit chunks).
# * The byte-level alphabet holds all 256 bytes, so any text (accents, emoji, control characters) encodes
#   without an unknown token and decodes back unchanged.
#
# Special tokens and the chat template follow ChatML (the format of Qwen2.5-Instruct), with a BOS token
# in front: ``<|begin_of_text|><|im_start|>user\n...<|im_end|>\n<|im_start|>assistant\n``. The EOS token
# is ``<|im_end|>`` so generation stops at the end of the assistant's turn; ``<|endoftext|>`` pads.
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


@dataclass(frozen=True)
class TinySpec:
    """Shape of a tiny decoder-only transformer."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int

    def validate(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} is not divisible by num_heads={self.num_heads}; "
                "pass --num-heads so that hidden_size / num_heads is an integer head dimension"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} is not divisible by num_kv_heads={self.num_kv_heads}; "
                "grouped-query attention shares each kv head among a whole number of query heads"
            )
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


# Context length written to config.json and tokenizer_config.json (RoPE works beyond it, but HF warns).
DEFAULT_MAX_POSITIONS = 2048

SIZES: Registry[TinySpec] = Registry("tiny model size")
SIZES.add("1m", TinySpec(hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=448))
SIZES.add("3m", TinySpec(hidden_size=192, num_layers=6, num_heads=6, num_kv_heads=2, intermediate_size=640))
SIZES.add(
    "10m", TinySpec(hidden_size=256, num_layers=10, num_heads=8, num_kv_heads=4, intermediate_size=1024)
)
SIZES.add(
    "50m", TinySpec(hidden_size=512, num_layers=12, num_heads=8, num_kv_heads=4, intermediate_size=2048)
)
# Qwen2.5-0.5B's and Qwen2.5-1.5B's layer layouts (with the small tokenizer's vocabulary: 358M and 1.31B
# parameters), for GPU benchmarks; random weights, as every preset.
SIZES.add(
    "400m", TinySpec(hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2, intermediate_size=4864)
)
SIZES.add(
    "1b", TinySpec(hidden_size=1536, num_layers=28, num_heads=12, num_kv_heads=2, intermediate_size=8960)
)


@dataclass(frozen=True)
class TinyArch:
    """How to build one architecture: its config and model classes and the tokenizer class to declare."""

    config_cls: type[PretrainedConfig]
    model_cls: type[PreTrainedModel]
    # Written to tokenizer_config.json. For qwen2 transformers uses Qwen2Tokenizer whatever we write;
    # declaring it keeps the directory honest. "PreTrainedTokenizerFast" loads tokenizer.json verbatim in
    # transformers 4.x and 5.x alike.
    tokenizer_class: str


ARCHS: Registry[TinyArch] = Registry("tiny model architecture")
ARCHS.add("qwen2", TinyArch(Qwen2Config, Qwen2ForCausalLM, "Qwen2Tokenizer"))
ARCHS.add("llama", TinyArch(LlamaConfig, LlamaForCausalLM, "PreTrainedTokenizerFast"))


def resolve_spec(
    size: str = "1m",
    *,
    hidden_size: int | None = None,
    num_layers: int | None = None,
    num_heads: int | None = None,
    num_kv_heads: int | None = None,
    intermediate_size: int | None = None,
) -> TinySpec:
    """The preset `size` with explicit overrides applied.

    A new hidden size without new head counts keeps the preset's head dimension; a new hidden size
    without a new intermediate size uses ~8/3 x hidden (Llama's ratio) rounded up to a multiple of 32.
    """
    base = SIZES.get(size)
    hidden = hidden_size if hidden_size is not None else base.hidden_size
    if num_heads is None:
        head_dim = base.hidden_size // base.num_heads
        num_heads = base.num_heads if hidden == base.hidden_size else max(1, hidden // head_dim)
    if num_kv_heads is None:
        num_kv_heads = base.num_kv_heads if num_heads % base.num_kv_heads == 0 else num_heads
    if intermediate_size is None:
        intermediate_size = (
            base.intermediate_size if hidden == base.hidden_size else -(-hidden * 8 // 3 // 32) * 32
        )
    spec = replace(
        base,
        hidden_size=hidden,
        num_layers=num_layers if num_layers is not None else base.num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size,
    )
    spec.validate()
    return spec


def tiny_config(
    arch: str,
    spec: TinySpec,
    *,
    vocab_size: int,
    max_position_embeddings: int = DEFAULT_MAX_POSITIONS,
    **token_ids: int,
) -> PretrainedConfig:
    """The transformers config of a tiny `arch` model; `token_ids` are bos/eos/pad_token_id."""
    return ARCHS.get(arch).config_cls(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        # Tied input/output embeddings: at this scale the embedding is a large share of the parameters.
        tie_word_embeddings=True,
        **token_ids,
    )


def _finish_tokenizer_config(out: Path, tokenizer_class: str, model_max_length: int) -> None:
    """Write the fields save_pretrained leaves out or sets for the generic wrapper class."""
    path = out / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["tokenizer_class"] = tokenizer_class
    config["model_max_length"] = model_max_length
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def build_tiny_model(
    out: str | Path,
    *,
    arch: str = "qwen2",
    size: str = "1m",
    seed: int = 0,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    max_position_embeddings: int = DEFAULT_MAX_POSITIONS,
    **overrides: int | None,
) -> Path:
    """Write a tiny `arch` model with random weights (seeded) and the tiny tokenizer to `out`.

    `overrides` are `resolve_spec`'s keywords (hidden_size, num_layers, num_heads, num_kv_heads,
    intermediate_size). The global torch RNG is left as it was. Returns `out` as a Path.
    """
    arch_entry = ARCHS.get(arch)
    spec = resolve_spec(size, **overrides)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = build_tiny_tokenizer(vocab_size)
    ids = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    config = tiny_config(
        arch, spec, vocab_size=len(tokenizer), max_position_embeddings=max_position_embeddings, **ids
    )
    # fork_rng: seeding must not change the caller's random stream (tests, training loops).
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = arch_entry.model_cls(config).to(torch.float32)
    model.generation_config = GenerationConfig(**ids)

    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    _finish_tokenizer_config(out, arch_entry.tokenizer_class, max_position_embeddings)
    return out


def count_parameters(model: torch.nn.Module) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="directory to write the model and tokenizer to")
    parser.add_argument("--arch", default="qwen2", choices=ARCHS.names())
    parser.add_argument("--size", default="1m", choices=SIZES.names(), help="size preset")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    parser.add_argument(
        "--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE, help="upper bound of the BPE vocabulary"
    )
    parser.add_argument("--max-position-embeddings", type=int, default=DEFAULT_MAX_POSITIONS)
    for flag in ("hidden-size", "num-layers", "num-heads", "num-kv-heads", "intermediate-size"):
        parser.add_argument(f"--{flag}", type=int, default=None, help="override the preset")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    out = build_tiny_model(
        args.out,
        arch=args.arch,
        size=args.size,
        seed=args.seed,
        vocab_size=args.vocab_size,
        max_position_embeddings=args.max_position_embeddings,
        hidden_size=args.hidden_size,
        num_layers=args.num_layers,
        num_heads=args.num_heads,
        num_kv_heads=args.num_kv_heads,
        intermediate_size=args.intermediate_size,
    )
    model = ARCHS.get(args.arch).model_cls.from_pretrained(out)
    print(
        f"wrote {args.arch} model ({count_parameters(model):,} parameters, vocab {model.config.vocab_size}) to {out}"
    )


if __name__ == "__main__":
    main()
