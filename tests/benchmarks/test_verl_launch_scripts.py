"""benchmarks/verl_launch_scripts.py on a made-up checkout: a launch script's command line is captured with
its shell variables at their defaults, its paths are pointed at local files, and the dry run is counted."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import verl_launch_scripts  # noqa: E402

SCRIPT = textwrap.dedent("""\
    set -x
    MODEL=${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}
    hf download $MODEL            # a stand-in: nothing is downloaded
    python3 -m verl.trainer.main_ppo \\
        algorithm.adv_estimator=grpo \\
        data.train_files=$HOME/data/gsm8k/train.parquet \\
        actor_rollout_ref.model.path=$MODEL \\
        actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.mode=async \\
        +actor_rollout_ref.actor.fsdp_config.model_dtype=bfloat16 \\
        actor_rollout_ref.model.lora_rank=8 actor_rollout_ref.model.lora_adapter_path=/path/saved/lora_adapter \\
        trainer.n_gpus_per_node=8 "$@"
    """)


@pytest.fixture
def checkout(tmp_path):
    examples = tmp_path / "verl" / "examples" / "grpo_trainer"
    examples.mkdir(parents=True)
    (examples / "run_qwen.sh").write_text(SCRIPT)
    (examples / "run_megatron.sh").write_text(SCRIPT.replace("vllm", "vllm actor_rollout_ref.actor.strategy=megatron"))
    (examples / "not_a_launch.sh").write_text("echo hello\n")
    recipe = tmp_path / "verl" / "verl" / "experimental" / "one_step_off_policy" / "shell"
    recipe.mkdir(parents=True)
    (recipe / "grpo_2_6.sh").write_text(SCRIPT.replace("verl.trainer.main_ppo", "verl.experimental.one_step_off_policy"
                                                       ".main_ppo actor_rollout_ref.hybrid_engine=False "
                                                       "rollout.n_gpus_per_node=2"))
    return tmp_path / "verl"


def test_capture_records_each_launch_line_with_its_variables_at_their_defaults(checkout, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    captured = verl_launch_scripts.capture(checkout, work)
    assert sorted(captured) == ["examples/grpo_trainer/run_megatron.sh", "examples/grpo_trainer/run_qwen.sh",
                                "verl/experimental/one_step_off_policy/shell/grpo_2_6.sh"]
    recipe = captured["verl/experimental/one_step_off_policy/shell/grpo_2_6.sh"]["argv"]
    assert verl_launch_scripts.kind("grpo_2_6.sh", recipe) == "one_step_off"
    recipe_args = verl_launch_scripts.pointed(recipe, {"model": "/m", "train": "/t", "val": "/v", "out": "/o",
                                                       "adapter": "/a"})
    # the recipe's entry point becomes main_ppo's mode key
    assert "rollout.n_gpus_per_node=2" in recipe_args and recipe_args[-1] == "async_training.mode=one_step_off"
    argv = captured["examples/grpo_trainer/run_qwen.sh"]["argv"]
    assert "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct" in argv
    assert verl_launch_scripts.kind("run_megatron.sh", captured["examples/grpo_trainer/run_megatron.sh"]["argv"]) \
        == "megatron"
    args = verl_launch_scripts.pointed(argv, {"model": "/m", "train": "/t.parquet", "val": "/v", "out": "/o",
                                              "adapter": "/a"})
    assert args[:3] == ["algorithm.adv_estimator=grpo", "data.train_files=/t.parquet", "actor_rollout_ref.model.path=/m"]
    assert "+actor_rollout_ref.actor.fsdp_config.model_dtype=bfloat16" in args
    assert "actor_rollout_ref.model.lora_adapter_path=/a" in args  # a LoRA script starts from a local adapter


def test_the_report_counts_the_scripts_that_pass_the_dry_run(checkout, tmp_path):
    out = tmp_path / "report.md"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "verl_launch_scripts.py"), "--verl",
                             str(checkout), "--kind", "all", "--out", str(out)], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    report = out.read_text()
    assert report.startswith("2 of 3 all scripts pass the dry run (3 captured; fsdp 1/1, megatron 0/1, "
                             "one_step_off 1/1)")
    assert "| `grpo_trainer/run_megatron` | megatron | hybridrl.utils.typed_config.ConfigError: actor_rollout_ref.actor.strategy=" \
           "megatron" in report
