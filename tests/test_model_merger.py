"""The model merger: a 2-rank sharded checkpoint becomes a HF directory with the trained model's outputs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer

from hybridrl.model_merger import main, merge_checkpoint
from hybridrl.models.loading import load_causal_lm, load_tokenizer, load_value_model
from hybridrl.workers.checkpoint import ROLE_MARKER, CheckpointError, CheckpointManager
from hybridrl.workers.config import FSDPConfig, OptimConfig
from hybridrl.workers.fsdp_engine import FSDPEngine

sys.path.insert(0, str(Path(__file__).parent / "workers"))
from spmd import run_on_ranks  # noqa: E402

FIXED_INPUT = torch.arange(1, 17).view(2, 8)  # (batch, seq)
REPO_ROOT = Path(__file__).resolve().parents[1]


def _train_and_save(engine: FSDPEngine, manager: CheckpointManager, path: Path) -> torch.Tensor:
    torch.manual_seed(0)  # the same batch on both ranks is fine: the point is that weights move
    ids = torch.randint(0, 300, (2, 10))  # (batch, seq)
    out = engine.module(input_ids=ids)
    out.logits.float().pow(2).mean().backward()
    engine.clip_and_step()
    manager.save_checkpoint(path, 1)
    with torch.no_grad():
        return engine.module(input_ids=FIXED_INPUT).logits  # (2, 8, vocab) or (2, 8, 1) for the critic


def _save_actor_and_critic(rank, world_size, model_dir, root):
    step_dir = Path(root) / "global_step_1"
    contents = {"save_contents": ["model", "optimizer", "extra"]}  # no hf_model: the merger builds it
    actor = FSDPEngine(load_causal_lm(model_dir), FSDPConfig(), OptimConfig(lr=1e-2))
    actor_logits = _train_and_save(actor, CheckpointManager(actor, load_tokenizer(model_dir), contents),
                                   step_dir / "actor")
    critic = FSDPEngine(load_value_model(model_dir), FSDPConfig(), OptimConfig(lr=1e-2))
    values = _train_and_save(critic, CheckpointManager(critic, None, contents), step_dir / "critic")
    return {"logits": actor_logits, "values": values}


@pytest.fixture(scope="module")
def saved(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("merger_ckpt")
    outputs = run_on_ranks(_save_actor_and_critic, 2, str(tiny_model_dir), str(root))[0]
    return {"step_dir": root / "global_step_1", **outputs}


def _logits(model_dir: Path, auto_cls=AutoModelForCausalLM) -> tuple[torch.nn.Module, torch.Tensor]:
    model = auto_cls.from_pretrained(model_dir, local_files_only=True)
    with torch.no_grad():
        return model, model(input_ids=FIXED_INPUT).logits


@pytest.mark.slow
def test_cli_writes_a_hf_dir_with_the_trained_logits(saved, tiny_model_dir, tmp_path):
    target = tmp_path / "merged"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    subprocess.run([sys.executable, "-m", "hybridrl.model_merger", "--local_dir", str(saved["step_dir"] / "actor"),
                    "--target_dir", str(target)], check=True, cwd=REPO_ROOT, env=env, capture_output=True)
    model, logits = _logits(target)
    torch.testing.assert_close(logits, saved["logits"], rtol=0, atol=1e-6)
    # the base model's logits differ, so the merger really wrote the trained weights
    _, base = _logits(Path(tiny_model_dir))
    assert not torch.allclose(base, saved["logits"], atol=1e-3)
    # tied embeddings: one tensor in the file, one shared parameter after loading
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    with safe_open(target / "model.safetensors", "pt") as f:
        stored = set(f.keys())  # safe_open handles are not containers
    assert "model.embed_tokens.weight" in stored and "lm_head.weight" not in stored
    # tokenizer and generation config come through unchanged
    text = "What is 12 + 34?"
    assert AutoTokenizer.from_pretrained(target)(text)["input_ids"] == \
        AutoTokenizer.from_pretrained(tiny_model_dir)(text)["input_ids"]
    assert json.loads((target / "generation_config.json").read_text()) == \
        json.loads((Path(tiny_model_dir) / "generation_config.json").read_text())


def test_critic_checkpoint_merges_to_its_own_architecture(saved, tmp_path):
    merge_checkpoint(saved["step_dir"] / "critic", tmp_path / "critic")
    config = json.loads((tmp_path / "critic" / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForTokenClassification"]  # not the wrapper's FSDP... name
    _, values = _logits(tmp_path / "critic", AutoModelForTokenClassification)
    torch.testing.assert_close(values, saved["values"], rtol=0, atol=1e-6)


def test_hf_model_path_supplies_a_missing_config_and_tokenizer(saved, tiny_model_dir, tmp_path):
    bare = shutil.copytree(saved["step_dir"] / "actor", tmp_path / "actor")
    shutil.rmtree(bare / "huggingface")
    with pytest.raises(CheckpointError, match="has no config.json.*pass --hf_model_path"):
        merge_checkpoint(bare, tmp_path / "out")
    merge_checkpoint(bare, tmp_path / "out", hf_model_path=tiny_model_dir)
    _, logits = _logits(tmp_path / "out")  # trained weights, not the base model's from hf_model_path
    torch.testing.assert_close(logits, saved["logits"], rtol=0, atol=1e-6)
    assert (tmp_path / "out" / "tokenizer.json").is_file()


def test_missing_and_incomplete_dirs_fail_clearly(saved, tmp_path, capsys):
    with pytest.raises(CheckpointError, match="does not exist"):
        merge_checkpoint(tmp_path / "nope", tmp_path / "out")
    partial = shutil.copytree(saved["step_dir"] / "actor", tmp_path / "actor")
    (partial / ROLE_MARKER).unlink()  # what a save interrupted before its last write looks like
    with pytest.raises(SystemExit) as exit_info:
        main(["--local_dir", str(partial), "--target_dir", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert f"is incomplete: it has no {ROLE_MARKER}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
