"""Loading local checkpoints: clear errors, dtype / attention / checkpointing / override options, value heads."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig

from hybridrl.models.loading import (
    ModelDirectoryError,
    apply_override_config,
    load_causal_lm,
    load_model_config,
    load_tokenizer,
    load_value_model,
    resolve_dtype,
)


def _copy(model_dir: Path, dest: Path, skip: tuple[str, ...] = ()) -> Path:
    dest.mkdir()
    for path in model_dir.iterdir():
        if path.name not in skip:
            shutil.copy(path, dest / path.name)
    return dest


def _batch() -> dict[str, torch.Tensor]:
    input_ids = torch.tensor([[1, 2, 40, 41, 42, 3], [0, 0, 1, 2, 50, 3]])  # (2, 6), second row left-padded
    attention_mask = (input_ids != 0).long()
    return {"input_ids": input_ids, "attention_mask": attention_mask}


# ---------------------------------------------------------------------------------------------- errors


def test_missing_path_names_it_and_says_nothing_is_downloaded(tmp_path: Path) -> None:
    missing = tmp_path / "no_such_model"
    with pytest.raises(ModelDirectoryError, match=r"no_such_model.*does not exist.*never downloads"):
        load_causal_lm(missing)
    # A repo-id-looking name not in the local cache fails the same way, without touching the network.
    with pytest.raises(ModelDirectoryError, match="'nobody-here/no-model' does not exist"):
        load_tokenizer("nobody-here/no-model")


def test_file_instead_of_directory(tmp_path: Path) -> None:
    file = tmp_path / "model.bin"
    file.write_bytes(b"")
    with pytest.raises(ModelDirectoryError, match="is a file; expected a Hugging Face model directory"):
        load_causal_lm(file)


@pytest.mark.parametrize(
    ("skip", "edit", "message"),
    [
        (("config.json",), None, "has no config.json"),
        ((), lambda d: (d / "config.json").write_text("{not json"), "config.json is not valid JSON"),
        ((), lambda d: (d / "config.json").write_text('{"hidden_size": 8}'), "has no 'model_type' field"),
        (("model.safetensors",), None, "has no model weights: expected one of model.safetensors"),
    ],
)
def test_malformed_directory_errors_name_what_is_missing(
    tiny_model_dir: Path, tmp_path: Path, skip: tuple[str, ...], edit, message: str
) -> None:
    broken = _copy(tiny_model_dir, tmp_path / "broken", skip)
    if edit is not None:
        edit(broken)
    with pytest.raises(ModelDirectoryError, match=message) as info:
        load_causal_lm(broken)
    assert str(broken) in str(info.value)


def test_missing_shard_is_named(tiny_model_dir: Path, tmp_path: Path) -> None:
    broken = _copy(tiny_model_dir, tmp_path / "sharded", ("model.safetensors",))
    index = {"metadata": {}, "weight_map": {"lm_head.weight": "model-00001-of-00002.safetensors"}}
    (broken / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelDirectoryError, match="weight shards that are missing: model-00001-of-00002"):
        load_causal_lm(broken)


def test_missing_tokenizer_is_named(tiny_model_dir: Path, tmp_path: Path) -> None:
    no_tok = _copy(tiny_model_dir, tmp_path / "no_tok", ("tokenizer.json", "tokenizer_config.json"))
    with pytest.raises(ModelDirectoryError, match="has no tokenizer: expected one of tokenizer.json"):
        load_tokenizer(no_tok)
    assert load_causal_lm(no_tok).config.model_type == "qwen2"  # the model itself needs no tokenizer


def test_repo_id_resolves_from_local_cache_only(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Lay out a Hugging Face cache entry by hand: models--org--name/{refs/main, snapshots/<rev>/...}.
    import huggingface_hub.constants

    repo = tmp_path / "hub" / "models--acme--tiny"
    (repo / "snapshots").mkdir(parents=True)
    _copy(tiny_model_dir, repo / "snapshots" / "abc123")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    tokenizer = load_tokenizer("acme/tiny")
    assert tokenizer.eos_token_id == 3
    assert load_causal_lm("acme/tiny").config.hidden_size == 128


# --------------------------------------------------------------------------------------------- options


def test_dtype_names(tiny_model_dir: Path) -> None:
    assert resolve_dtype("bf16") is torch.bfloat16 and resolve_dtype(torch.float16) is torch.float16
    model = load_causal_lm(tiny_model_dir, dtype="bf16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    with pytest.raises(KeyError, match="unknown dtype 'float8'; registered: bf16, bfloat16"):
        load_causal_lm(tiny_model_dir, dtype="float8")


def test_attention_implementations_agree(tiny_model_dir: Path) -> None:
    eager = load_causal_lm(tiny_model_dir, attn_implementation="eager").eval()
    sdpa = load_causal_lm(tiny_model_dir, attn_implementation="sdpa").eval()
    assert eager.config._attn_implementation == "eager" and sdpa.config._attn_implementation == "sdpa"
    batch = _batch()
    with torch.no_grad():
        a, b = eager(**batch).logits, sdpa(**batch).logits  # (2, 6, vocab)
    mask = batch["attention_mask"].bool()
    torch.testing.assert_close(a[mask], b[mask], atol=1e-5, rtol=1e-4)


def test_gradient_checkpointing_gives_the_same_gradients(tiny_model_dir: Path) -> None:
    plain = load_causal_lm(tiny_model_dir).train()
    ckpt = load_causal_lm(tiny_model_dir, gradient_checkpointing=True).train()
    flag = getattr(ckpt, "is_activation_checkpointing", None)
    assert (flag if flag is not None else ckpt.is_gradient_checkpointing) and ckpt.config.use_cache is False
    batch = _batch()
    for model in (plain, ckpt):
        model(**batch, labels=batch["input_ids"]).loss.backward()
    for (name, p), q in zip(plain.named_parameters(), ckpt.parameters(), strict=True):
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        torch.testing.assert_close(p.grad, q.grad, atol=1e-6, rtol=1e-5, msg=name)


def test_override_config_reaches_the_model(tiny_model_dir: Path) -> None:
    model = load_causal_lm(tiny_model_dir, override_config={"rms_norm_eps": 1e-3, "attention_dropout": 0.25})
    assert model.config.rms_norm_eps == 1e-3 and model.config.attention_dropout == 0.25
    assert load_model_config(tiny_model_dir).rms_norm_eps != 1e-3  # the directory is untouched


def test_override_config_merges_nested_dicts_and_warns_on_new_keys(caplog: pytest.LogCaptureFixture) -> None:
    config = LlamaConfig(hidden_size=8, num_attention_heads=2, num_hidden_layers=1, intermediate_size=16)
    config.extra = {"a": 1, "b": 2}
    with caplog.at_level(logging.WARNING, logger="hybridrl.models.loading"):
        apply_override_config(config, {"extra": {"b": 3}, "hiden_size": 16})
    assert config.extra == {"a": 1, "b": 3}
    assert "override_config sets 'hiden_size'" in caplog.text


# ------------------------------------------------------------------------------------------ value model


def test_value_model_shares_the_body_and_has_a_scalar_head(tiny_model_dir: Path) -> None:
    lm = load_causal_lm(tiny_model_dir).eval()
    critic = load_value_model(tiny_model_dir).eval()
    assert critic.config.num_labels == 1 and critic.config.classifier_dropout == 0.0
    lm_body, critic_body = lm.model.state_dict(), critic.model.state_dict()
    assert lm_body.keys() == critic_body.keys()
    assert all(torch.equal(lm_body[k], critic_body[k]) for k in lm_body)
    batch = _batch()
    with torch.no_grad():
        values = critic(**batch).logits  # (2, 6, 1)
        hidden = lm.model(**batch).last_hidden_state  # (2, 6, hidden)
    assert values.shape == (2, 6, 1)
    # The head is a plain linear map of the body's final hidden states: v = h @ w^T + b.
    expected = hidden @ critic.score.weight.T + critic.score.bias
    torch.testing.assert_close(values, expected, atol=1e-5, rtol=1e-5)


def test_value_model_reloads_a_trained_head(tiny_model_dir: Path, tmp_path: Path) -> None:
    critic = load_value_model(tiny_model_dir)
    with torch.no_grad():
        critic.score.weight.fill_(0.5)
    critic.save_pretrained(tmp_path / "critic")
    reloaded = load_value_model(tmp_path / "critic")
    assert torch.equal(reloaded.score.weight, torch.full_like(reloaded.score.weight, 0.5))


def test_fresh_value_head_is_the_same_in_every_process_and_leaves_the_rng_alone(tiny_model_dir):
    from hybridrl.models.loading import load_value_model

    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    first = load_value_model(tiny_model_dir).score.weight.detach().clone()
    assert torch.equal(torch.rand(1), expected_next)  # the caller's random stream is untouched
    torch.manual_seed(999)
    assert torch.equal(load_value_model(tiny_model_dir).score.weight, first)
    assert not torch.equal(load_value_model(tiny_model_dir, head_init_seed=1).score.weight, first)


def test_override_config_chooses_the_attention_implementation(tiny_model_dir):
    from hybridrl.models.loading import load_causal_lm

    assert load_causal_lm(tiny_model_dir).config._attn_implementation == "sdpa"
    assert load_causal_lm(tiny_model_dir, attn_implementation="eager").config._attn_implementation == "eager"
    # verl's way to pick it: model.override_config.attn_implementation, which wins over the caller's choice
    chosen = load_causal_lm(tiny_model_dir, override_config={"attn_implementation": "eager"})
    assert chosen.config._attn_implementation == "eager"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_value_head_output_owns_its_memory_and_equals_the_biased_linear(tiny_model_dir, dtype):
    # torch's biased linear over (batch, seq, hidden) returns a view, which FSDP2 warns about at the root
    critic = load_value_model(tiny_model_dir, dtype=dtype).eval()
    hidden = torch.randn(2, 5, critic.config.hidden_size, dtype=dtype)
    values = critic.score(hidden)
    assert values._base is None and values.shape == (2, 5, 1)
    reference = torch.nn.functional.linear(hidden, critic.score.weight, critic.score.bias)
    torch.testing.assert_close(values, reference)
    logits = critic(input_ids=torch.tensor([[5, 6, 7]])).logits
    assert logits._base is None
