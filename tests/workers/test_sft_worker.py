"""The SFT worker through a local worker group: what it makes follows its inputs' device.

There is no GPU here. Under `torch.device("meta")` every tensor made without naming a device lands on
meta and fails the first time it meets an input or its values are read, as a CPU tensor beside CUDA ones
does; a worker that makes its sums, masks and indices on its inputs' device gives the same results with
that default as without it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from spmd import run_on_ranks

import hybridrl.trainer
import hybridrl.trainer.sft_config  # noqa: F401 - registers the schema sft_trainer.yaml composes
from hybridrl.controller import ClassWithInitArgs, LocalWorkerGroup
from hybridrl.protocol import DataProto
from hybridrl.workers.sft_worker import SFTWorker

CONFIG_DIR = str(Path(hybridrl.trainer.__file__).parent / "config")


def sft_batch(rows: int = 6, width: int = 20, seed: int = 0) -> DataProto:
    """Right-padded rows of 8..width tokens; the loss counts the tokens after the first four."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(8, width + 1, (rows,), generator=g)
    columns = torch.arange(width)
    attention_mask = (columns[None, :] < lengths[:, None]).long()  # (rows, width)
    return DataProto.from_dict({
        "input_ids": torch.randint(4, 300, (rows, width), generator=g) * attention_mask,
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        "loss_mask": attention_mask * (columns[None, :] >= 4).long(),
    })


def _eval_and_train(rank: int, world_size: int, config) -> list:
    """eval_batch then train_batch on a fresh worker, with a CPU default device and with a meta one."""
    data = sft_batch()
    results = []
    for default_device in ("cpu", "meta"):
        group = LocalWorkerGroup(ClassWithInitArgs(SFTWorker, config))
        try:
            group.call("init_model", total_training_steps=2)
            with torch.device(default_device):
                evaluated = group.call("eval_batch", data)
                metrics = group.call("train_batch", data)
        finally:
            group.shutdown()
        results.append((evaluated.batch["loss_sum"], evaluated.batch["num_tokens"], metrics))
    return results


def test_eval_and_train_batches_make_their_tensors_on_the_inputs_device(tiny_model_dir):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        config = compose("sft_trainer", overrides=[f"model.partial_pretrain={tiny_model_dir}",
                                                   "data.train_files=unused.parquet",
                                                   "data.micro_batch_size_per_gpu=4"])
    [(plain, on_meta_default)] = run_on_ranks(_eval_and_train, 1, config)
    for expected, got in zip(plain[:2], on_meta_default[:2], strict=True):
        assert got.device.type == "cpu"
        assert torch.equal(got, expected)
    assert on_meta_default[2] == plain[2]  # the training step's metrics
    assert plain[1].sum() == sft_batch().batch["loss_mask"][:, 1:].sum()  # every counted token, once


def _sequence_parallel_sft(rank: int, world_size: int, config, sp: int) -> tuple:
    """eval_batch, then two train_batch steps, on this rank's rows of one batch (8 rows: 4 per rank)."""
    from omegaconf import OmegaConf

    config = OmegaConf.merge(config, {"ulysses_sequence_parallel_size": sp})
    worker = SFTWorker(config)
    worker.init_model(total_training_steps=2)
    mine = sft_batch(rows=8, width=23).chunk(world_size)[rank]
    evaluated = worker.eval_batch(mine)
    metrics = [worker.train_batch(mine) for _ in range(2)]
    state = worker.engine.full_model_state_dict()
    return evaluated.batch["loss_sum"], evaluated.batch["num_tokens"], metrics, state


def test_a_sequence_parallel_group_fine_tunes_as_one_rank(tiny_model_dir):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        config = compose("sft_trainer", overrides=[f"model.partial_pretrain={tiny_model_dir}",
                                                   "data.train_files=unused.parquet",
                                                   "data.micro_batch_size_per_gpu=3"])
    [(one_sums, one_counts, one_metrics, one_state)] = run_on_ranks(_sequence_parallel_sft, 1, config, 1)
    ranks = run_on_ranks(_sequence_parallel_sft, 2, config, 2)
    for rank, (sums, counts, metrics, _) in enumerate(ranks):
        torch.testing.assert_close(sums, one_sums[rank * 4:(rank + 1) * 4], rtol=1e-5, atol=1e-5)
        assert torch.equal(counts, one_counts[rank * 4:(rank + 1) * 4])
        for step, one_step in zip(metrics, one_metrics, strict=True):
            assert step["num_tokens"] == one_step["num_tokens"]
            assert step["loss"] == pytest.approx(one_step["loss"], rel=1e-5)
            assert step["grad_norm"] == pytest.approx(one_step["grad_norm"], rel=1e-4)
    # after two AdamW steps of up to lr = 3e-3 per weight, the same weights (Adam's normalisation lifts float
    # noise in a near-zero gradient to ~1e-5)
    for key, value in one_state.items():
        torch.testing.assert_close(ranks[0][3][key], value, rtol=0, atol=1e-4)
