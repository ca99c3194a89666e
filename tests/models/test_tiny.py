"""The tiny model factory: sizes, determinism, the command line, and the offline acceptance run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hybridrl.models.loading import load_causal_lm, load_tokenizer
from hybridrl.models.tiny import ARCHS, build_tiny_model, count_parameters, main, resolve_spec, tiny_config


def _count_on_meta(arch: str, size: str) -> int:
    # The meta device allocates no memory, so even the 50M preset is counted instantly.
    config = tiny_config(arch, resolve_spec(size), vocab_size=512)
    with torch.device("meta"):
        model = ARCHS.get(arch).model_cls(config)
    return count_parameters(model)


def test_1m_parameter_count_by_hand() -> None:
    # Qwen2 1m: vocab V=512, hidden H=128, 4 layers, 4 heads of 32, 2 kv heads (kv width 64), MLP 448.
    #   embedding (tied with lm_head):  512*128                      =  65,536
    #   per layer: q 128*128+128 = 16,512; k 128*64+64 = 8,256; v 8,256; o 128*128 = 16,384
    #              mlp 3*128*448 = 172,032; two RMSNorms 2*128 = 256   -> 221,696
    #   4 layers: 886,784; final norm 128                     total = 952,448
    assert _count_on_meta("qwen2", "1m") == 952_448
    # Llama has no q/k/v biases: 952,448 - 4 * (128 + 64 + 64) = 951,424
    assert _count_on_meta("llama", "1m") == 951_424


@pytest.mark.parametrize(
    ("size", "low", "high"),
    [("1m", 0.8e6, 1.2e6), ("3m", 2.5e6, 3.5e6), ("10m", 8e6, 12e6), ("50m", 40e6, 60e6)],
)
def test_presets_span_1m_to_50m(size: str, low: float, high: float) -> None:
    assert low <= _count_on_meta("llama", size) <= high


def test_overrides_derive_heads_and_mlp() -> None:
    spec = resolve_spec("1m", hidden_size=96, num_layers=2)
    # the 1m preset's head dim is 128/4 = 32, so 96 wide -> 3 heads; 3 heads do not split into the
    # preset's 2 kv groups -> 3 kv heads; MLP ceil(96*8/3 / 32)*32 = 256.
    assert (spec.hidden_size, spec.num_layers, spec.num_heads, spec.num_kv_heads, spec.intermediate_size) == (
        96,
        2,
        3,
        3,
        256,
    )
    with pytest.raises(ValueError, match="not divisible by num_heads=3"):
        resolve_spec("1m", hidden_size=100, num_heads=3)
    with pytest.raises(ValueError, match="not divisible by num_kv_heads=3"):
        resolve_spec("1m", num_heads=4, num_kv_heads=3)
    with pytest.raises(ValueError, match="num_heads must be >= 1, got 0"):  # named, not a ZeroDivisionError
        resolve_spec("1m", num_heads=0)
    with pytest.raises(KeyError, match="registered: 10m, 1b, 1m, 3m, 400m, 50m"):
        resolve_spec("7m")
    with pytest.raises(KeyError, match="unknown tiny model architecture 'gpt2'"):
        build_tiny_model("/nonexistent", arch="gpt2")


def _file_bytes(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_same_seed_gives_identical_files_and_rng_is_untouched(tmp_path: Path) -> None:
    torch.manual_seed(123)
    state = torch.get_rng_state()
    kwargs = {"arch": "llama", "size": "1m", "num_layers": 1}
    first = _file_bytes(build_tiny_model(tmp_path / "a", seed=7, **kwargs))
    second = _file_bytes(build_tiny_model(tmp_path / "b", seed=7, **kwargs))
    other = _file_bytes(build_tiny_model(tmp_path / "c", seed=8, **kwargs))
    assert torch.equal(torch.get_rng_state(), state)  # the factory forks the RNG
    assert set(first) >= {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json"}
    assert first == second
    assert other["model.safetensors"] != first["model.safetensors"]
    assert other["tokenizer.json"] == first["tokenizer.json"]  # the tokenizer does not depend on the seed


def test_saved_configs_carry_special_token_ids(tiny_model_dir: Path) -> None:
    config = json.loads((tiny_model_dir / "config.json").read_text())
    generation = json.loads((tiny_model_dir / "generation_config.json").read_text())
    tokenizer_config = json.loads((tiny_model_dir / "tokenizer_config.json").read_text())
    ids = {"bos_token_id": 1, "eos_token_id": 3, "pad_token_id": 0}
    assert {k: config[k] for k in ids} == ids
    assert {k: generation[k] for k in ids} == ids
    assert config["model_type"] == "qwen2" and config["tie_word_embeddings"] is True
    assert tokenizer_config["tokenizer_class"] == "Qwen2Tokenizer"
    assert tokenizer_config["model_max_length"] == config["max_position_embeddings"] == 2048


def test_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["--out", str(tmp_path), "--arch", "llama", "--size", "1m", "--num-layers", "2", "--seed", "3"])
    config = json.loads((tmp_path / "config.json").read_text())
    assert (config["model_type"], config["num_hidden_layers"], config["hidden_size"]) == ("llama", 2, 128)
    # 1m llama with 2 of 4 layers: 951,424 - 2 * 221,440 (a llama layer: 221,696 - 256 biases) = 508,544
    assert "508,544 parameters" in capsys.readouterr().out


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_acceptance_build_offline_reload_chat_and_generate(
    arch: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model_dir = build_tiny_model(tmp_path / arch, arch=arch, size="1m", seed=0)
    tokenizer = load_tokenizer(model_dir, padding_side="left")
    model = load_causal_lm(model_dir).eval()
    chats = [
        [{"role": "user", "content": "Compute 37 + 48 column by column."}],
        [{"role": "user", "content": "Hi"}],
    ]
    prompts = [tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in chats]
    batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    new_tokens = 6
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    prompt_len = batch["input_ids"].shape[1]
    assert out.shape == (2, prompt_len + new_tokens)
    assert torch.equal(out[:, :prompt_len], batch["input_ids"])
    assert tokenizer.decode(out[0, :prompt_len]).endswith("<|im_start|>assistant\n")

    # Independent check of generate(): greedy decoding by hand on the unpadded first prompt.
    ids = tokenizer(prompts[0], return_tensors="pt", add_special_tokens=False)["input_ids"]  # (1, len)
    with torch.no_grad():
        for _ in range(new_tokens):
            logits = model(ids).logits[:, -1, :]  # (1, vocab)
            logits[:, tokenizer.eos_token_id] = -float("inf")  # min_new_tokens suppresses EOS
            ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out[0, prompt_len:], ids[0, -new_tokens:])
