"""SFT trainer end to end on the 1M tiny model: loss definition, learning, checkpoints, resume, backends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf.errors import ReadonlyConfigError

import hybridrl.trainer
from hybridrl.data.sampler import ResumableSampler
from hybridrl.data.tasks.arithmetic import generate, to_rows
from hybridrl.data.tasks.sources import write_splits
from hybridrl.models.loading import load_causal_lm, load_tokenizer
from hybridrl.trainer.main_sft import from_torchrun, run_sft
from hybridrl.trainer.sft_trainer import build_dataset, validate_config
from hybridrl.utils.typed_config import ConfigError

CONFIG_DIR = str(Path(hybridrl.trainer.__file__).parent / "config")
BATCH = 8


@pytest.fixture(scope="module")
def sft_data(tmp_path_factory) -> Path:
    train, test = generate(64, 16, seed=0)
    out = tmp_path_factory.mktemp("arith")
    write_splits(out, to_rows(train, "train"), to_rows(test, "test"))
    return out


def sft_config(data: Path, model: Path, out: Path, *overrides: str):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose("sft_trainer", overrides=[
            f"data.train_files={data / 'train.parquet'}", f"data.val_files={data / 'test.parquet'}",
            f"model.partial_pretrain={model}", f"trainer.default_local_dir={out}",
            f"data.train_batch_size={BATCH}", "data.micro_batch_size_per_gpu=4", "trainer.backend=local",
            "trainer.total_training_steps=4", "trainer.test_freq=2", "optim.lr_warmup_steps_ratio=0",
            # CPU on any machine (sft_trainer.yaml's auto takes a GPU); the gpu-marked test names cuda after these
            "trainer.device=cpu", *overrides,
        ])


def read_metrics(out: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row for row in rows}


def token_mean_nll(model, rows: list[dict]) -> float:
    """The SFT loss by definition: -log p(next token) averaged over the assistant tokens of all rows."""
    total, count = 0.0, 0
    with torch.no_grad():
        for row in rows:
            ids = row["input_ids"][None]  # (1, len)
            logp = torch.log_softmax(model(input_ids=ids, attention_mask=row["attention_mask"][None]).logits, -1)
            picked = logp[0, :-1].gather(-1, ids[0, 1:, None])[:, 0]  # log p(x[t+1] | x[<=t])
            mask = row["loss_mask"][1:].bool()  # token t+1 is written by the assistant
            total -= float(picked[mask].sum())
            count += int(mask.sum())
    return total / count


@pytest.fixture(scope="module")
def local_run(sft_data, tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("sft_local")
    run_sft(sft_config(sft_data, tiny_model_dir, out, "trainer.save_freq=2", "trainer.max_ckpt_to_keep=null"))
    return out


def test_first_step_loss_is_the_token_mean_over_assistant_tokens(local_run, sft_data, tiny_model_dir,
                                                                 tiny_tokenizer):
    config = validate_config(sft_config(sft_data, tiny_model_dir, local_run))
    train = build_dataset(config, config.data.train_files, tiny_tokenizer)
    first = ResumableSampler(len(train), shuffle=True, seed=config.trainer.seed).order(0)[:BATCH]
    expected = token_mean_nll(load_causal_lm(tiny_model_dir), [train[i] for i in first])
    assert read_metrics(local_run)[1]["train/loss"] == pytest.approx(expected, abs=1e-5)


def test_loss_decreases_and_the_saved_model_is_the_trained_one(local_run, sft_data, tiny_tokenizer):
    metrics = read_metrics(local_run)
    assert sorted(metrics) == [1, 2, 3, 4]
    assert metrics[4]["train/loss"] < metrics[1]["train/loss"]
    assert metrics[4]["val/loss"] < metrics[2]["val/loss"]
    assert (local_run / "latest_checkpointed_iteration.txt").read_text() == "4"
    hf_dir = local_run / "global_step_4" / "actor" / "huggingface"
    assert (hf_dir / "model.safetensors").is_file()
    assert not (local_run / "global_step_2" / "actor" / "huggingface" / "model.safetensors").exists()
    # reloaded with plain transformers, the model reproduces the trainer's validation loss after step 4
    config = validate_config(sft_config(sft_data, hf_dir, local_run))
    val = build_dataset(config, config.data.val_files, load_tokenizer(hf_dir))
    reloaded = token_mean_nll(load_causal_lm(hf_dir), [val[i] for i in range(len(val))])
    assert reloaded == pytest.approx(metrics[4]["val/loss"], abs=1e-5)


def test_resume_from_step_2_repeats_steps_3_and_4(local_run, sft_data, tiny_model_dir, tmp_path):
    run_sft(sft_config(sft_data, tiny_model_dir, tmp_path, "trainer.resume_mode=resume_path",
                       f"trainer.resume_from_path={local_run / 'global_step_2'}"))
    resumed, full = read_metrics(tmp_path), read_metrics(local_run)
    assert sorted(resumed) == [3, 4]  # steps 1-2 came from the checkpoint
    for step in (3, 4):
        for key in ("train/loss", "train/grad_norm", "train/lr"):
            assert resumed[step][key] == pytest.approx(full[step][key], abs=1e-6), (step, key)


def test_a_local_run_leaves_no_process_group_or_rank_variables(local_run):
    import torch.distributed as dist

    from hybridrl.controller.worker_group import DIST_ENV_KEYS

    assert not dist.is_initialized()
    assert not [key for key in DIST_ENV_KEYS if key in os.environ]  # none were set before the run


def test_micro_batch_size_does_not_change_the_update(local_run, sft_data, tiny_model_dir, tmp_path):
    # 8 rows in one micro-batch instead of two of 4: same global token mean, so the same step 2
    run_sft(sft_config(sft_data, tiny_model_dir, tmp_path, "data.micro_batch_size_per_gpu=8",
                       "trainer.total_training_steps=2"))
    assert read_metrics(tmp_path)[2]["train/loss"] == pytest.approx(read_metrics(local_run)[2]["train/loss"],
                                                                    abs=1e-5)


def test_token_budget_micro_batches_do_not_change_the_update(local_run, sft_data, tiny_model_dir, tmp_path):
    # a budget of 2 x max_length tokens cuts the 8 rows into passes by their lengths, where the local run
    # has 2 passes of 4; the loss is the same global token mean, so step 2 (after one update) matches
    max_length = validate_config(sft_config(sft_data, tiny_model_dir, tmp_path)).data.max_length
    run_sft(sft_config(sft_data, tiny_model_dir, tmp_path, "data.use_dynamic_bsz=true",
                       f"data.max_token_len_per_gpu={2 * max_length}", "trainer.total_training_steps=2"))
    assert read_metrics(tmp_path)[2]["train/loss"] == pytest.approx(read_metrics(local_run)[2]["train/loss"],
                                                                    abs=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("lora", [[], ["model.lora_rank=8", "optim.lr=1e-2"]], ids=["full", "lora"])
def test_a_local_run_on_the_gpu_starts_from_the_cpu_runs_loss_and_learns(local_run, sft_data, tiny_model_dir,
                                                                         tmp_path, lora):
    run_sft(sft_config(sft_data, tiny_model_dir, tmp_path, "trainer.device=cuda", *lora))
    gpu, cpu = read_metrics(tmp_path), read_metrics(local_run)
    # step 1's loss is the starting model's on the same rows: fp32 on either device
    assert gpu[1]["train/loss"] == pytest.approx(cpu[1]["train/loss"], rel=1e-4)
    assert gpu[4]["train/loss"] < gpu[1]["train/loss"] and gpu[4]["val/loss"] < gpu[2]["val/loss"]


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.parametrize("sequence_parallel", [1, 2])  # 2: both ranks split each sequence (verl's sp2 scripts)
def test_two_ray_ranks_match_one_local_rank(ray_cluster, local_run, sft_data, tiny_model_dir, tmp_path,
                                            sequence_parallel):
    run_sft(sft_config(sft_data, tiny_model_dir, tmp_path, "trainer.backend=ray", "trainer.n_gpus_per_node=2",
                       "trainer.total_training_steps=2", "ray_init.num_cpus=2",
                       f"ulysses_sequence_parallel_size={sequence_parallel}"))
    two, one = read_metrics(tmp_path), read_metrics(local_run)
    for step in (1, 2):  # step 2's loss is computed after an update, so it checks the update too
        assert two[step]["train/loss"] == pytest.approx(one[step]["train/loss"], abs=1e-5)
        assert two[step]["train/num_tokens"] == one[step]["train/num_tokens"]


@pytest.mark.parametrize("override, message", [
    ("+data.batch_size=4", "batch_size"),
    ("trainer.backend=slurm", "trainer.backend"),
    ("data.train_batch_size=9", "data.train_batch_size (9) must be a positive multiple of the number of ranks (2"),
    ("data.max_token_len_per_gpu=64", "data.max_token_len_per_gpu (64) x ulysses_sequence_parallel_size (1) must be at "
                                      "least data.max_length (1024)"),
    ("ulysses_sequence_parallel_size=3", "ulysses_sequence_parallel_size=3 must divide the number of ranks (2"),
])
def test_bad_settings_name_the_key(sft_data, tiny_model_dir, tmp_path, override, message):
    config = sft_config(sft_data, tiny_model_dir, tmp_path, "trainer.backend=ray", "trainer.n_gpus_per_node=2",
                        "data.use_dynamic_bsz=true", override)
    with pytest.raises(Exception, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate_config(config)


def test_the_device_is_checked_and_auto_resolved(sft_data, tiny_model_dir, tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a machine without a GPU
    with pytest.raises(ValueError, match="trainer.device=cuda but torch sees no GPU; set trainer.device=cpu"):
        validate_config(sft_config(sft_data, tiny_model_dir, tmp_path, "trainer.device=cuda"))
    with pytest.raises(ValueError, match="trainer.device must be 'cpu', 'cuda' or 'auto', got 'gpu'"):
        validate_config(sft_config(sft_data, tiny_model_dir, tmp_path, "trainer.device=gpu"))
    config = validate_config(sft_config(sft_data, tiny_model_dir, tmp_path, "trainer.device=auto"))
    assert config.trainer.device == "cpu"
    with pytest.raises(ReadonlyConfigError, match="full_key: trainer.device"):  # the run only reads it
        config.trainer.device = "cuda"


def test_local_backend_refuses_two_ranks(sft_data, tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="trainer.n_gpus_per_node=1 or use trainer.backend=ray"):
        validate_config(sft_config(sft_data, tiny_model_dir, tmp_path, "trainer.n_gpus_per_node=2"))


def test_the_entry_point_reads_the_command_line_as_verl_does(local_run, sft_data, tiny_model_dir, tmp_path):
    # a blank argument (a script's `\ ` line end) is dropped with a warning; `+` on a declared key sets it
    out = tmp_path / "cli"
    result = subprocess.run([
        sys.executable, "-m", "hybridrl.trainer.main_sft", f"data.train_files={sft_data / 'train.parquet'}",
        f"data.val_files={sft_data / 'test.parquet'}", f"model.partial_pretrain={tiny_model_dir}",
        f"trainer.default_local_dir={out}", f"data.train_batch_size={BATCH}", "data.micro_batch_size_per_gpu=4",
        "trainer.backend=local", " ", "+trainer.total_training_steps=2", "trainer.test_freq=2",
        "optim.lr_warmup_steps_ratio=0", "trainer.logger=[file]"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "blank command-line argument" in result.stderr
    ran, reference = read_metrics(out), read_metrics(local_run)
    assert sorted(ran) == [1, 2] and ran[2]["train/loss"] == pytest.approx(reference[2]["train/loss"], rel=0, abs=1e-6)


def test_lora_trains_adapters_on_a_frozen_base_and_saves_the_merged_model(local_run, sft_data, tiny_model_dir,
                                                                         tmp_path):
    # verl's run_qwen_05_peft.sh keys
    run_sft(sft_config(sft_data, tiny_model_dir, tmp_path, "model.lora_rank=8", "model.lora_alpha=16",
                       "model.target_modules=all-linear", "optim.lr=1e-2", "trainer.total_training_steps=2"))
    lora, full = read_metrics(tmp_path), read_metrics(local_run)
    # lora_B starts at zero: the first step's loss is the base model's, as in full fine-tuning
    assert lora[1]["train/loss"] == pytest.approx(full[1]["train/loss"], abs=1e-6)
    assert lora[2]["train/loss"] < lora[1]["train/loss"]
    actor = tmp_path / "global_step_2" / "actor"
    adapter = json.loads((actor / "lora_adapter" / "adapter_config.json").read_text())
    assert adapter["r"] == 8 and adapter["lora_alpha"] == 16
    # the saved model is the base with the adapters merged: the trainer's validation loss, and the weights
    # LoRA does not touch (embeddings, norms) are the base's
    merged, base = load_causal_lm(actor / "huggingface"), load_causal_lm(tiny_model_dir)
    config = validate_config(sft_config(sft_data, tiny_model_dir, tmp_path))
    val = build_dataset(config, config.data.val_files, load_tokenizer(tiny_model_dir))
    assert token_mean_nll(merged, [val[i] for i in range(len(val))]) == pytest.approx(lora[2]["val/loss"], abs=1e-5)
    merged_weights, base_weights = merged.state_dict(), base.state_dict()
    untouched = [name for name in base_weights if "norm" in name or "embed" in name]
    assert untouched and all(torch.equal(merged_weights[n], base_weights[n]) for n in untouched)
    assert not torch.equal(merged_weights["model.layers.0.mlp.up_proj.weight"],
                           base_weights["model.layers.0.mlp.up_proj.weight"])


def test_max_samples_take_the_first_rows(sft_data, tiny_model_dir, tmp_path, tiny_tokenizer):
    from hybridrl.trainer.sft_trainer import load_data

    full, _ = load_data(validate_config(sft_config(sft_data, tiny_model_dir, tmp_path)))
    train, val = load_data(validate_config(sft_config(sft_data, tiny_model_dir, tmp_path, "data.train_max_samples=16",
                                                      "data.val_max_samples=4")))
    assert len(train) == 16 and len(val) == 4
    assert all(torch.equal(train[i]["input_ids"], full[i]["input_ids"]) for i in range(16))


@pytest.mark.parametrize("override, message", [
    ("model.strategy=megatron", "model.strategy=megatron is not supported by hybridrl: FSDP2 .* Set it to fsdp2"),
    ("trainer.default_hdfs_dir=hdfs://x", "trainer.default_hdfs_dir=hdfs://x is not supported .* Set it to null"),
    ("model.lora_rank=-1", "model.lora_rank=-1 must be >= 0"),
])
def test_verls_sft_keys_that_cannot_run_name_the_key(sft_data, tiny_model_dir, tmp_path, override, message):
    with pytest.raises(Exception, match=message):
        validate_config(sft_config(sft_data, tiny_model_dir, tmp_path, override))


def test_verls_sft_switches_that_change_nothing_are_warned_about(sft_data, tiny_model_dir, tmp_path, caplog):
    # the keys of verl's sp2_liger example; its `trainer.logger=console` is one backend's name
    with caplog.at_level("WARNING", logger="hybridrl.trainer.sft_trainer"):
        config = validate_config(sft_config(sft_data, tiny_model_dir, tmp_path, "model.strategy=fsdp",
                                            "model.use_liger=true", "use_remove_padding=true",
                                            "data.micro_batch_size=4", "trainer.logger=console"))
    assert [r.getMessage() for r in caplog.records] == [
        "no effect in this run: model.use_liger=true (verl's GPU and file-copy switches that change no result)",
        "no effect in this run: data.micro_batch_size=4 (verl's deprecated key, unread by verl's SFT trainer too); "
        "data.micro_batch_size_per_gpu=4 sets the micro-batch"]
    assert list(config.trainer.logger) == ["console"]


def test_under_torchrun_rank_0_drives_a_pool_of_torchruns_size_and_the_others_exit(monkeypatch):
    assert from_torchrun(["data.max_length=64"]) == ["data.max_length=64"]  # not under torchrun: as given
    # what torchrun --nproc_per_node=4 gives its second process
    for name, value in {"TORCHELASTIC_RUN_ID": "none", "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "4",
                        "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exited:
        from_torchrun([])
    assert exited.value.code == 0
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ConfigError, match="trainer.n_gpus_per_node=2 differs from torchrun's --nproc_per_node=4"):
        from_torchrun(["trainer.n_gpus_per_node=2"])
    assert from_torchrun(["trainer.n_gpus_per_node=4"]) == ["trainer.n_gpus_per_node=4"]
    # the driver's Ray workers must not see torchrun's rendezvous
    assert not {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"} & set(os.environ)
    for name, value in {"TORCHELASTIC_RUN_ID": "none", "RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"}.items():
        monkeypatch.setenv(name, value)
    assert from_torchrun(["optim.lr=1e-4"]) == ["optim.lr=1e-4", "trainer.n_gpus_per_node=4"]
    for name, value in {"TORCHELASTIC_RUN_ID": "none", "RANK": "0", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match="torchrun over 2 nodes: .* trainer.nnodes=2 trainer.n_gpus_per_node=4"):
        from_torchrun([])


@pytest.mark.slow
@pytest.mark.ray
def test_verls_torchrun_launch_runs_one_driver_over_torchruns_ranks(ray_cluster, local_run, sft_data, tiny_model_dir,
                                                                    tmp_path):
    # verl's SFT scripts: `torchrun --standalone --nnodes=1 --nproc_per_node=N -m <trainer> ...`; rank 0 joins the
    # test's Ray cluster instead of starting one
    import ray

    out = tmp_path / "torchrun"
    result = subprocess.run([
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc_per_node=2",
        "-m", "hybridrl.trainer.main_sft", f"data.train_files={sft_data / 'train.parquet'}",
        f"data.val_files={sft_data / 'test.parquet'}", f"model.partial_pretrain={tiny_model_dir}",
        f"trainer.default_local_dir={out}", f"data.train_batch_size={BATCH}", "data.micro_batch_size_per_gpu=4",
        "trainer.total_training_steps=2", "trainer.test_freq=2", "optim.lr_warmup_steps_ratio=0",
        "trainer.logger=[file]", "trainer.device=cpu", "ray_init.num_cpus=2",
        # the rest of verl's run_sft.sh keys at their values there
        "model.strategy=fsdp", "model.lora_rank=0", "model.lora_alpha=16", "model.target_modules=all-linear",
        "model.use_liger=False", "use_remove_padding=True", "trainer.max_ckpt_to_keep=1",
        "data.multiturn.enable=False", "trainer.checkpoint.save_contents=[model,optimizer,extra,hf_model]"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rank 1 exits" in result.stderr  # torchrun's second process left the run to rank 0's pool
    config = json.loads((out / "global_step_2" / "actor" / "hybridrl_checkpoint.json").read_text())
    assert config["world_size"] == 2
    ran, reference = read_metrics(out), read_metrics(local_run)  # two ranks train as one does
    for step in (1, 2):
        assert ran[step]["train/loss"] == pytest.approx(reference[step]["train/loss"], abs=1e-5)
