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


SFT_SCRIPT = textwrap.dedent("""\
    if [ "$#" -lt 2 ]; then echo "Usage: run.sh <nproc_per_node> <save_path>"; exit 1; fi
    nproc_per_node=$1
    save_path=$2
    shift 2
    torchrun --standalone --nnodes=1 --nproc_per_node=$nproc_per_node -m verl.trainer.fsdp_sft_trainer \\
        data.train_files=$HOME/data/gsm8k/train.parquet model.partial_pretrain=Qwen/Qwen2.5-0.5B-Instruct \\
        trainer.default_local_dir=$save_path model.lora_rank=32 $@
    """)
GENERATION_SCRIPT = textwrap.dedent("""\
    python3 -m verl.trainer.main_generation trainer.n_gpus_per_node=8 data.path=$HOME/data/gsm8k/test.parquet \\
        model.path=Qwen/Qwen2.5-0.5B-Instruct +model.trust_remote_code=True data.output_path=$HOME/gen.parquet
    """)


def test_sft_scripts_under_torchrun_and_generation_scripts_are_captured_and_pointed(tmp_path):
    verl = tmp_path / "verl"
    (verl / "examples" / "sft").mkdir(parents=True)
    (verl / "examples" / "sft" / "run_peft.sh").write_text(SFT_SCRIPT)  # needs its two arguments
    (verl / "tests" / "special_e2e" / "generation").mkdir(parents=True)
    (verl / "tests" / "special_e2e" / "generation" / "run_gen.sh").write_text(GENERATION_SCRIPT)
    work = tmp_path / "work"
    work.mkdir()
    captured = verl_launch_scripts.capture(verl, work)
    assert sorted(captured) == ["examples/sft/run_peft.sh", "tests/special_e2e/generation/run_gen.sh"]
    paths = {"model": "/m", "train": "/t", "val": "/v", "out": "/o", "adapter": "/a", "generated": "/g"}
    sft = captured["examples/sft/run_peft.sh"]["argv"]
    assert verl_launch_scripts.kind("run_peft.sh", sft) == "sft" and "--nproc_per_node=2" in sft
    assert verl_launch_scripts.pointed(sft, paths) == [
        "data.train_files=/t", "model.partial_pretrain=/m", "trainer.default_local_dir=/o", "model.lora_rank=32"]
    generation = captured["tests/special_e2e/generation/run_gen.sh"]["argv"]
    assert verl_launch_scripts.kind("run_gen.sh", generation) == "generation"
    assert verl_launch_scripts.pointed(generation, paths) == [
        "trainer.n_gpus_per_node=8", "data.path=/v", "model.path=/m", "+model.trust_remote_code=True",
        "data.output_path=/g"]


def test_the_task_rows_get_a_chat_column_for_multi_turn_sft(tmp_path):
    import pyarrow.parquet as pq

    from hybridrl.data.tasks.arithmetic import main as write_task

    write_task(["--out", str(tmp_path), "--train-size", "3", "--test-size", "2"])
    verl_launch_scripts.add_chats(tmp_path)
    table = pq.read_table(tmp_path / "train.parquet")
    info, chat = table.column("extra_info").to_pylist()[0], table.column("messages").to_pylist()[0]
    assert chat == [{"role": "user", "content": info["question"]}, {"role": "assistant", "content": info["answer"]}]
    assert pq.read_table(tmp_path / "test.parquet").num_rows == 2
