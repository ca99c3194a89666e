"""The quickstart's stages reuse earlier outputs only when they were made with the same settings."""

from __future__ import annotations

import json

from hybridrl import quickstart
from hybridrl.data.sft_dataset import read_parquet_rows


def test_the_task_is_addition_and_subtraction_with_the_teachers_sign_slip(tmp_path):
    data = quickstart.prepare_data(tmp_path, seed=0)
    train = read_parquet_rows(data / "train.parquet")
    assert {r["extra_info"]["operation"] for r in train} == {"+", "-"}
    negative = [r for r in train if int(r["reward_model"]["ground_truth"]) < 0]
    slipped = [r for r in negative if r["extra_info"]["answer"].endswith(f"<answer>{r['reward_model']['ground_truth'][1:]}</answer>")]
    # the teacher drops the sign of each negative result with probability 0.7: 0.7 +- 3 standard errors
    share = len(slipped) / len(negative)
    assert abs(share - 0.7) < 3 * (0.7 * 0.3 / len(negative)) ** 0.5


def test_another_seed_rewrites_the_data_and_drops_the_stale_sft_model(tmp_path):
    data = quickstart.prepare_data(tmp_path, seed=0)
    first = (data / "train.parquet").read_bytes()
    stale = tmp_path / "sft" / "global_step_1"
    stale.mkdir(parents=True)
    assert quickstart.prepare_data(tmp_path, seed=0) == data and stale.exists()  # same settings: reused
    quickstart.prepare_data(tmp_path, seed=1)
    assert (data / "train.parquet").read_bytes() != first
    assert json.loads((data / "task_args.json").read_text())["seed"] == 1
    assert not stale.exists()


def test_another_seed_rebuilds_the_base_model(tmp_path):
    base = quickstart.prepare_base_model(tmp_path, seed=0)
    weights = (base / "model.safetensors").read_bytes()
    assert quickstart.prepare_base_model(tmp_path, seed=0) == base
    assert (base / "model.safetensors").read_bytes() == weights
    quickstart.prepare_base_model(tmp_path, seed=1)
    assert (base / "model.safetensors").read_bytes() != weights


def test_grpo_computes_in_bf16_where_the_cpu_has_it_and_the_command_line_wins():
    import hybridrl.trainer.ppo_config  # noqa: F401 - registers the schema with Hydra's ConfigStore
    from hybridrl.utils.device import native_bf16

    expected = "bfloat16" if native_bf16("cpu") else "auto"  # auto: fp32 on a CPU
    default = quickstart._compose("ppo_trainer", quickstart.grpo_run_overrides(None, ["trainer.device=cpu"]))
    assert default.actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype == expected
    assert default.actor_rollout_ref.rollout.dtype == expected
    gpu = quickstart._compose("ppo_trainer", quickstart.grpo_run_overrides(None, ["trainer.device=cuda"]))
    assert gpu.actor_rollout_ref.rollout.dtype == "auto"  # bf16 where the GPU has it
    fp32 = quickstart._compose("ppo_trainer", quickstart.grpo_run_overrides(None, [
        "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=float32",
        "actor_rollout_ref.rollout.dtype=float32"]))
    assert fp32.actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype == "float32"
    assert fp32.actor_rollout_ref.rollout.dtype == "float32"


def test_a_gpu_run_trains_sft_there_too_and_the_local_backend_gets_one_rank():
    import hybridrl.trainer.ppo_config  # noqa: F401 - the schemas, registered with Hydra's ConfigStore
    import hybridrl.trainer.sft_config  # noqa: F401

    cli = ["trainer.backend=local", "trainer.device=cuda"]
    grpo = quickstart._compose("ppo_trainer", quickstart.grpo_run_overrides(None, cli))
    assert (grpo.trainer.backend, grpo.trainer.n_gpus_per_node, grpo.trainer.device) == ("local", 1, "cuda")
    sft = quickstart._compose("sft_trainer", quickstart.sft_run_overrides(cli))
    assert sft.trainer.device == "cuda" and sft.trainer.total_training_steps == 1200
    # the CPU recipe is unchanged (its cached SFT model stays valid), and a count named on the command line wins
    assert quickstart.sft_run_overrides([]) == quickstart.SFT_OVERRIDES
    assert quickstart._compose("ppo_trainer", quickstart.grpo_run_overrides(None, [])).trainer.n_gpus_per_node == 2
    two = quickstart.grpo_run_overrides(None, [*cli, "trainer.n_gpus_per_node=2"])
    assert "trainer.n_gpus_per_node=1" not in two


def test_threads_given_to_main_apply_inside_and_the_callers_count_comes_back_even_on_error():
    import pytest
    import torch

    caller = torch.get_num_threads()
    wanted = 1 if caller != 1 else 2
    with quickstart.torch_threads(wanted):
        assert torch.get_num_threads() == wanted
    assert torch.get_num_threads() == caller
    with pytest.raises(RuntimeError, match="stage failed"), quickstart.torch_threads(wanted):
        raise RuntimeError("stage failed")
    assert torch.get_num_threads() == caller
    with quickstart.torch_threads(None):  # no --threads: this process keeps its own count
        assert torch.get_num_threads() == caller
