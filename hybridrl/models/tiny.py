"""Build a tiny Qwen2 or Llama model and its tokenizer offline, as a normal Hugging Face directory.

    python -m hybridrl.models.tiny --out models/tiny-qwen2-1m --arch qwen2 --size 1m --seed 0

Seeded random weights (byte-identical for the same arguments) in the `SIZES` presets, and a small byte-level
BPE tokenizer.
"""

from __future__ import annotations

import argparse
import json
import string
from dataclasses import dataclass
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

# Qwen2's pre-tokenization regex (it isolates every digit, as the arithmetic tasks need), exactly as
# transformers' Qwen2Tokenizer rebuilds it, or reloading a `qwen2` directory would change the ids.
QWEN2_PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

DEFAULT_VOCAB_SIZE = 512  # upper bound: 256 bytes + 4 special tokens + merges

PAD_TOKEN = "<|endoftext|>"
BOS_TOKEN = "<|begin_of_text|>"
IM_START = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
# Order fixes the ids: pad=0, bos=1, im_start=2, eos=3.
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, IM_START, EOS_TOKEN)

# ChatML; every turn ends with the EOS token, so SFT teaches the model to stop.
CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Text the BPE merges are learned from: the phrasing of hybridrl's tasks, the chat roles and printable
# ASCII (coverage of every character comes from the byte-level alphabet, not from this corpus).
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


def _qwen2_pipeline_tokenizer() -> Tokenizer:
    """An empty BPE tokenizer with the exact normalizer / pre-tokenizer / decoder of Qwen2Tokenizer, which
    transformers 5.x rebuilds a `qwen2` directory's tokenizer with: the ids survive a reload."""
    tokenizer = Tokenizer(models.BPE(unk_token=None, continuing_subword_prefix="", end_of_word_suffix="",
                                     fuse_unk=False, byte_fallback=False))  # byte-level: nothing is unknown
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def build_raw_tokenizer(vocab_size: int = DEFAULT_VOCAB_SIZE) -> Tokenizer:
    """Train the byte-level BPE on the built-in task corpus four times over (so pairs occurring once reach
    `min_frequency`); `vocab_size` is an upper bound, the real size `len(tokenizer)`."""
    minimum = 256 + len(SPECIAL_TOKENS)
    if vocab_size < minimum:
        raise ValueError(f"vocab_size={vocab_size} is too small: the byte alphabet and special tokens need "
                         f"{minimum}")
    tokenizer = _qwen2_pipeline_tokenizer()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(list(_CORPUS_LINES) * 4, trainer=trainer)
    return tokenizer


def build_tiny_tokenizer(vocab_size: int = DEFAULT_VOCAB_SIZE) -> PreTrainedTokenizerFast:
    """The trained tokenizer wrapped for transformers, with special tokens and the ChatML template; encoding
    adds no special tokens (the chat template writes the BOS)."""
    return PreTrainedTokenizerFast(tokenizer_object=build_raw_tokenizer(vocab_size),
                                   bos_token=BOS_TOKEN, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN,
                                   chat_template=CHAT_TEMPLATE, padding_side="right")


@dataclass(frozen=True)
class TinySpec:
    """Shape of a tiny decoder-only transformer."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int

    def validate(self) -> None:
        for name, value in vars(self).items():  # first: the divisibility checks below divide by them
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size={self.hidden_size} is not divisible by num_heads="
                             f"{self.num_heads}; pass --num-heads so that hidden_size / num_heads is an "
                             "integer head dimension")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} is not divisible by num_kv_heads="
                             f"{self.num_kv_heads}; grouped-query attention shares each kv head among a "
                             "whole number of query heads")


DEFAULT_MAX_POSITIONS = 2048  # in config.json and tokenizer_config.json (RoPE works beyond it, but HF warns)

SIZES: Registry[TinySpec] = Registry("tiny model size")
SIZES.add("1m", TinySpec(hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=448))
SIZES.add("3m", TinySpec(hidden_size=192, num_layers=6, num_heads=6, num_kv_heads=2, intermediate_size=640))
SIZES.add("10m", TinySpec(hidden_size=256, num_layers=10, num_heads=8, num_kv_heads=4, intermediate_size=1024))
SIZES.add("50m", TinySpec(hidden_size=512, num_layers=12, num_heads=8, num_kv_heads=4, intermediate_size=2048))
# Qwen2.5-0.5B's and -1.5B's layer layouts (358M and 1.31B parameters with this vocabulary), for GPU benchmarks.
SIZES.add("400m", TinySpec(hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2, intermediate_size=4864))
SIZES.add("1b", TinySpec(hidden_size=1536, num_layers=28, num_heads=12, num_kv_heads=2, intermediate_size=8960))


@dataclass(frozen=True)
class TinyArch:
    """How to build one architecture: its config and model classes and the tokenizer class to declare."""

    config_cls: type[PretrainedConfig]
    model_cls: type[PreTrainedModel]
    tokenizer_class: str  # written to tokenizer_config.json (qwen2 gets Qwen2Tokenizer whatever it says)


ARCHS: Registry[TinyArch] = Registry("tiny model architecture")
ARCHS.add("qwen2", TinyArch(Qwen2Config, Qwen2ForCausalLM, "Qwen2Tokenizer"))
ARCHS.add("llama", TinyArch(LlamaConfig, LlamaForCausalLM, "PreTrainedTokenizerFast"))


def resolve_spec(size: str = "1m", *, hidden_size: int | None = None, num_layers: int | None = None,
                 num_heads: int | None = None, num_kv_heads: int | None = None,
                 intermediate_size: int | None = None) -> TinySpec:
    """The preset `size` with explicit overrides applied: a new hidden size keeps the preset's head dimension
    and, without an intermediate size, uses ~8/3 x hidden rounded up to a multiple of 32."""
    base = SIZES.get(size)
    hidden = hidden_size if hidden_size is not None else base.hidden_size
    if num_heads is None:
        head_dim = base.hidden_size // base.num_heads
        num_heads = base.num_heads if hidden == base.hidden_size else max(1, hidden // head_dim)
    if num_kv_heads is None:
        num_kv_heads = base.num_kv_heads if num_heads % base.num_kv_heads == 0 else num_heads
    if intermediate_size is None:
        intermediate_size = base.intermediate_size if hidden == base.hidden_size else -(-hidden * 8 // 3 // 32) * 32
    spec = TinySpec(hidden, num_layers if num_layers is not None else base.num_layers, num_heads, num_kv_heads,
                    intermediate_size)
    spec.validate()
    return spec


def tiny_config(arch: str, spec: TinySpec, *, vocab_size: int,
                max_position_embeddings: int = DEFAULT_MAX_POSITIONS, **token_ids: int) -> PretrainedConfig:
    """The config of a tiny `arch` model with tied embeddings; `token_ids` are bos/eos/pad_token_id."""
    return ARCHS.get(arch).config_cls(
        vocab_size=vocab_size, hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads, max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True, **token_ids)


def build_tiny_model(out: str | Path, *, arch: str = "qwen2", size: str = "1m", seed: int = 0,
                     vocab_size: int = DEFAULT_VOCAB_SIZE,
                     max_position_embeddings: int = DEFAULT_MAX_POSITIONS, **overrides: int | None) -> Path:
    """Write a tiny `arch` model with seeded random weights and the tiny tokenizer to `out`; returns it.
    `overrides` are `resolve_spec`'s keywords. The global torch RNG is left as it was."""
    arch_entry = ARCHS.get(arch)
    spec = resolve_spec(size, **overrides)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer(vocab_size)
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
           "pad_token_id": tokenizer.pad_token_id}
    config = tiny_config(arch, spec, vocab_size=len(tokenizer),
                         max_position_embeddings=max_position_embeddings, **ids)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = arch_entry.model_cls(config).to(torch.float32)
    model.generation_config = GenerationConfig(**ids)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    # the fields save_pretrained leaves out or sets for the generic wrapper class
    path = out / "tokenizer_config.json"
    tokenizer_config = json.loads(path.read_text())
    tokenizer_config.update(tokenizer_class=arch_entry.tokenizer_class, model_max_length=max_position_embeddings)
    path.write_text(json.dumps(tokenizer_config, indent=2, sort_keys=True) + "\n")
    return out


def pull_eos_up(model_dir: str | Path, eos_pull: float) -> Path:
    """Make the model in `model_dir` end its responses at random, in place; returns the directory. An
    untrained tiny model almost never samples EOS; adding `eos_pull` x (the mean last hidden state over a
    prompt, scaled to unit dot product) to EOS's output embedding gives it a chance at every position."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = Path(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = tokenizer(["Ann has 3 marbles and finds 4 more. How many marbles does she have?"],
                    return_tensors="pt")["input_ids"]
    with torch.no_grad():
        hidden = model.model(input_ids=ids).last_hidden_state[0].mean(dim=0)  # (hidden,)
        model.get_output_embeddings().weight[tokenizer.eos_token_id] += eos_pull * hidden / hidden.norm() ** 2
    model.save_pretrained(model_dir)
    return model_dir


def count_parameters(model: torch.nn.Module) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())  # parameters() yields a shared one once


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="directory to write the model and tokenizer to")
    parser.add_argument("--arch", default="qwen2", choices=ARCHS.names())
    parser.add_argument("--size", default="1m", choices=SIZES.names(), help="size preset")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    parser.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE,
                        help="upper bound of the BPE vocabulary")
    parser.add_argument("--max-position-embeddings", type=int, default=DEFAULT_MAX_POSITIONS)
    for flag in ("hidden-size", "num-layers", "num-heads", "num-kv-heads", "intermediate-size"):
        parser.add_argument(f"--{flag}", type=int, default=None, help="override the preset")
    args = parser.parse_args(argv)
    out = build_tiny_model(**vars(args))  # the flags are build_tiny_model's keywords
    model = ARCHS.get(args.arch).model_cls.from_pretrained(out)
    print(f"wrote {args.arch} model ({count_parameters(model):,} parameters, vocab "
          f"{model.config.vocab_size}) to {out}")


if __name__ == "__main__":
    main()
