"""verl's launch command lines run unchanged through `trainer.dry_run=true`; every verl key they set is wired,
warned about, or refused naming the missing feature (tests/trainer/verl_command_lines.py holds the lines)."""

import json
import logging
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from ppo_helpers import CONFIG_DIR, early_stopping_model, ppo_config, tiny_run_overrides
from verl_command_lines import PASSING, REFUSED

from hybridrl.trainer.command_line import register_config_search_path, verl_overrides
from hybridrl.trainer.config_checks import ConfigError, resolve_config
from hybridrl.trainer.config_rules import no_effect_warnings
from hybridrl.trainer.main_ppo import run_ppo
from hybridrl.trainer.ppo_config import PPOTrainerConfig
from hybridrl.workers.config import RolloutConfig
from hybridrl.workers.rollout.vllm import vllm_engine_args
from hybridrl.workers.update_loop import log_prob_batching

PATHS = {"model": "some/model", "train": "train.parquet", "val": "val.parquet", "out": "/tmp/unused"}
BASE = ["data.train_files=x.parquet", "actor_rollout_ref.model.path=some/model"]


def as_arguments(line: str) -> list[str]:
    """The arguments a shell passes for `line` (quotes removed as bash removes them)."""
    return shlex.split(line.format(**PATHS))


def resolve_line(line: str, config_name: str = "ppo_trainer") -> PPOTrainerConfig:
    register_config_search_path()
    overrides = verl_overrides(as_arguments(line), PPOTrainerConfig)
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return resolve_config(compose(config_name=config_name, overrides=[*overrides, "trainer.dry_run=true"]))


@pytest.mark.parametrize("name", sorted(PASSING))
def test_a_verl_launch_line_passes_the_dry_run(name):
    config = resolve_line(PASSING[name])
    assert config.trainer.dry_run and config.trainer.n_gpus_per_node >= 2


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_feature_hybridrl_lacks_is_refused_naming_the_key(name):
    line, message = REFUSED[name]
    with pytest.raises(ConfigError, match=message):
        resolve_line(line)


def test_verls_megatron_config_name_stops_naming_the_missing_engine():
    with pytest.raises(ConfigError, match="actor_rollout_ref.actor.strategy=megatron is not supported by hybridrl: "
                                          "FSDP2 .* is the only training engine"):
        resolve_line(PASSING["grpo_vllm_async"], config_name="ppo_megatron_trainer")


def test_vllm_keys_reach_the_engine_and_engine_kwargs_replace_them():
    rollout = RolloutConfig(prompt_length=512, response_length=1024, max_num_seqs=64, max_num_batched_tokens=4096,
                            enable_chunked_prefill=False, load_format="dummy", cudagraph_capture_sizes=[1, 8])
    args = vllm_engine_args(rollout)
    assert args == {"max_model_len": 1536, "max_num_seqs": 64, "max_num_batched_tokens": 4096,
                    "enable_chunked_prefill": False, "enable_prefix_caching": True, "load_format": "dummy",
                    "disable_log_stats": True, "compilation_config": {"cudagraph_capture_sizes": [1, 8]}}
    rollout.max_model_len, rollout.engine_kwargs.vllm = 2048, {"max_num_seqs": 8, "swap_space": 4}
    assert vllm_engine_args(rollout) | {} == {**args, "max_model_len": 2048, "max_num_seqs": 8, "swap_space": 4}


def test_engine_settings_of_an_engine_that_is_not_running_are_named_in_one_warning():
    hf = resolve_config(ppo_config(*BASE, "actor_rollout_ref.rollout.max_num_batched_tokens=1024",
                                   "actor_rollout_ref.rollout.enable_chunked_prefill=false",
                                   "actor_rollout_ref.model.use_shm=true"))
    warnings = no_effect_warnings(hf)
    assert len(warnings) == 2  # one per reason: the vLLM settings, the GPU speed-up
    vllm_warning = next(w for w in warnings if "vLLM" in w)
    assert "rollout.max_num_batched_tokens=1024" in vllm_warning and "rollout.enable_chunked_prefill=false" in vllm_warning
    assert "actor_rollout_ref.model.use_shm=true" in next(w for w in warnings if w is not vllm_warning)
    vllm = resolve_config(ppo_config(*BASE, "actor_rollout_ref.rollout.name=vllm",
                                     "actor_rollout_ref.rollout.max_num_batched_tokens=1024"))
    assert no_effect_warnings(vllm) == []  # the vLLM engine reads it
    assert no_effect_warnings(resolve_config(ppo_config(*BASE))) == []  # defaults warn about nothing


def test_an_engine_hybridrl_lacks_generates_with_hf_and_says_so(caplog):
    with caplog.at_level(logging.WARNING):
        config = resolve_config(ppo_config(*BASE, "actor_rollout_ref.rollout.name=sglang",
                                           "actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend=triton"))
    assert config.actor_rollout_ref.rollout.name == "hf"
    assert "rollout.name=sglang: hybridrl has no sglang engine; this run generates with its hf engine" in caplog.text
    assert "engine_kwargs.sglang={attention_backend: triton}" in caplog.text.replace("'", "")


def test_rollout_mode_async_states_what_runs():
    warnings = no_effect_warnings(resolve_config(ppo_config(*BASE, "actor_rollout_ref.rollout.mode=async")))
    assert warnings == ["no effect in this run: actor_rollout_ref.rollout.mode=async (verl's server-style "
                        "asynchronous rollout is not implemented; every batch is generated whole by the engine "
                        "inside the workers (mode=sync))"]


def test_verls_names_set_hybridrls_settings():
    config = resolve_config(ppo_config(*BASE, "trainer.n_gpus_per_node=4", "actor_rollout_ref.actor.optim.clip_grad=0.5",
                                       "critic.optim.clip_grad=2.0",
                                       "actor_rollout_ref.rollout.log_prob_micro_batch_size=32"))
    assert config.actor_rollout_ref.actor.grad_clip == 0.5 and config.critic.grad_clip == 2.0
    assert config.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu == 8  # 32 over 4 ranks
    # the workers take the resolved config, the global size beside the per-rank one, as it is
    assert log_prob_batching(config.actor_rollout_ref.rollout, 4) == (8, None)
    with pytest.raises(ConfigError, match="optim.clip_grad=0.5 and actor_rollout_ref.actor.grad_clip=2.0 disagree"):
        resolve_config(ppo_config(*BASE, "actor_rollout_ref.actor.optim.clip_grad=0.5",
                                  "actor_rollout_ref.actor.grad_clip=2.0"))
    with pytest.raises(ConfigError, match="log_prob_micro_batch_size=32 and .*_per_gpu=4 are both set"):
        resolve_config(ppo_config(*BASE, "actor_rollout_ref.rollout.log_prob_micro_batch_size=32",
                                  "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4"))


def test_the_critics_value_pass_cuts_micro_batches_as_its_update_does_unless_set():
    gae = [*BASE, "algorithm.adv_estimator=gae", "trainer.n_gpus_per_node=2"]
    assert resolve_config(ppo_config(*gae, "critic.ppo_micro_batch_size_per_gpu=4")).critic \
        .forward_micro_batch_size_per_gpu == 4
    assert resolve_config(ppo_config(*gae, "critic.ppo_micro_batch_size=8")).critic.forward_micro_batch_size_per_gpu == 4
    assert resolve_config(ppo_config(*gae, "critic.ppo_micro_batch_size_per_gpu=4",
                                     "critic.forward_micro_batch_size_per_gpu=16")).critic \
        .forward_micro_batch_size_per_gpu == 16


def test_plus_sets_a_declared_key_and_blank_arguments_are_dropped(caplog):
    args = ["+actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype=bfloat16", " ",
            "+reward_model.reward_kwargs.max_resp_len=8", "++trainer.nnodes=2", "+wandb.project=x"]
    with caplog.at_level(logging.WARNING):
        kept = verl_overrides(args, PPOTrainerConfig)
    # declared: the + goes; inside an open dict, forced, or undeclared: the override stays as written
    assert kept == ["actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype=bfloat16",
                    "+reward_model.reward_kwargs.max_resp_len=8", "++trainer.nnodes=2", "+wandb.project=x"]
    assert "blank command-line argument" in caplog.text
    with pytest.raises(ConfigError, match="unknown config key wandb"):
        resolve_config(ppo_config(*BASE, "+wandb.project=x"))


def test_the_entry_point_composes_a_user_config_that_extends_ppo_trainer(tmp_path, tiny_model_dir):
    # verl's multi-turn examples: a YAML in the user's folder lists ppo_trainer in its defaults and adds verl's
    # config folder to the search path; hybridrl's ppo_trainer must win over the one found there
    verl_configs = tmp_path / "verl_configs"
    verl_configs.mkdir()
    (verl_configs / "ppo_trainer.yaml").write_text("a_key_only_verl_has: 1\n")
    user = tmp_path / "user_configs"
    user.mkdir()
    (user / "gsm8k_multiturn_grpo.yaml").write_text(textwrap.dedent(f"""\
        hydra:
          searchpath:
            - file://{verl_configs}
        defaults:
          - ppo_trainer
          - _self_
        data:
          max_prompt_length: 36
          return_raw_chat: True
        actor_rollout_ref:
          hybrid_engine: True
          rollout:
            name: sglang
            multi_turn:
              enable: True
              max_assistant_turns: 5
        """))
    result = subprocess.run(
        [sys.executable, "-m", "hybridrl.trainer.main_ppo", "--config-path", str(user),
         "--config-name", "gsm8k_multiturn_grpo", "data.train_files=x.parquet",
         f"actor_rollout_ref.model.path={tiny_model_dir}", " ",
         "+actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype=bfloat16",
         "actor_rollout_ref.rollout.mode=async", "trainer.dry_run=true"],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    printed = result.stdout.split("batch arithmetic:")[0].splitlines()
    resolved = OmegaConf.create("\n".join(line for line in printed if not line.startswith("[")))  # less log lines
    assert "hybridrl has no sglang engine" in result.stdout and "rollout.mode=async" in result.stdout
    assert resolved.data.max_prompt_length == 36 and resolved.actor_rollout_ref.rollout.multi_turn.enable
    assert resolved.actor_rollout_ref.rollout.name == "hf"
    assert resolved.actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype == "bfloat16"
    assert resolved.data.max_response_length == 64  # the rest is hybridrl's ppo_trainer.yaml
    assert "a_key_only_verl_has" not in result.stdout


@pytest.mark.parametrize("role", ["actor", "critic"])
def test_nccl_timeout_is_the_process_groups_timeout(role):
    # a real rank in a process of its own: the role's worker joins a one-rank group with the configured timeout
    build = {
        "actor": "from hybridrl.workers.config import ActorRolloutRefConfig\n"
                 "from hybridrl.workers.fsdp_workers import ActorRolloutRefWorker\n"
                 "config = ActorRolloutRefConfig(nccl_timeout=1234)\n"
                 "config.model.path = 'unused'\n"
                 "ActorRolloutRefWorker(config, role='actor')",
        "critic": "from hybridrl.workers.config import CriticConfig\n"
                  "from hybridrl.workers.fsdp_workers import CriticWorker\n"
                  "config = CriticConfig(nccl_timeout=1234, rollout_n=1)\n"
                  "config.model.path = 'unused'\n"
                  "CriticWorker(config)",
    }[role]
    script = textwrap.dedent("""
        import os, torch
        from torch.distributed import distributed_c10d
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="0")
        from hybridrl.utils.device import DEVICE_ENV
        os.environ[DEVICE_ENV] = "cpu"
        """) + build + textwrap.dedent("""
        group = distributed_c10d._get_default_group()
        print(group._get_backend(torch.device("cpu")).options._timeout.total_seconds())
        """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert float(result.stdout.split()[-1]) == 1234.0


REVERSED_ORDER_SAMPLER = '''
import json

from torch.utils.data import Sampler


class LastFirst(Sampler):
    """verl's sampler interface: prompts in reverse index order; update() logs each trained batch."""

    def __init__(self, data_source, data_config):
        self.size = len(data_source)
        assert data_config.get("shuffle") is True and data_config["train_batch_size"] == 4  # verl's DictConfig

    def __iter__(self):
        yield from reversed(range(self.size))

    def __len__(self):
        return self.size

    def update(self, batch):
        with open(LOG, "a") as f:
            f.write(json.dumps(sorted(set(int(i) for i in batch.non_tensor_batch["index"]))) + "\\n")
'''


def run_with_class_of_your_own(source: str, data, model, tmp_path, steps: int, *overrides: str) -> tuple[Path, list]:
    """A tiny local GRPO run with `source` (whose LOG it logs to) written to tmp_path/own.py; what it logged."""
    log, file = tmp_path / "log.jsonl", tmp_path / "own.py"
    file.write_text(source.replace("LOG", repr(str(log))))
    run_ppo(ppo_config(*tiny_run_overrides(data, model, tmp_path / "run"), "trainer.backend=local",
                       "trainer.n_gpus_per_node=1", f"trainer.total_training_steps={steps}",
                       *(o.format(file=file) for o in overrides)))
    return file, [json.loads(line) for line in log.read_text().splitlines()]


def test_a_sampler_of_your_own_orders_the_training_prompts_and_sees_every_trained_batch(
        arithmetic_data, tiny_model_dir, tmp_path):
    _, updates = run_with_class_of_your_own(REVERSED_ORDER_SAMPLER, arithmetic_data, tiny_model_dir, tmp_path, 2,
                                            "data.sampler.class_path={file}", "data.sampler.class_name=LastFirst")
    size = pq.read_metadata(arithmetic_data / "train.parquet").num_rows
    # two steps of 4 prompts, in the sampler's order: the last 4 rows, then the 4 before them
    assert updates == [list(range(size - 4, size)), list(range(size - 8, size - 4))]


def test_greedy_validation_with_several_samples_runs_as_in_verl_and_says_so(caplog):
    with caplog.at_level(logging.WARNING):
        config = resolve_config(ppo_config(*BASE, "actor_rollout_ref.rollout.val_kwargs.n=4"))
    assert config.actor_rollout_ref.rollout.val_kwargs.n == 4
    assert "val_kwargs.n=4 with greedy decoding" in caplog.text and "4 identical responses" in caplog.text


def test_bf16_master_weights_train_and_are_checkpointed_in_bf16(arithmetic_data, tiny_model_dir, tmp_path):
    import torch
    from torch.distributed.checkpoint import FileSystemReader

    history = run_ppo(ppo_config(*tiny_run_overrides(arithmetic_data, tiny_model_dir, tmp_path / "run"),
                                 "trainer.backend=local", "trainer.n_gpus_per_node=1", "trainer.total_training_steps=1",
                                 "trainer.save_freq=1", "actor_rollout_ref.actor.fsdp_config.model_dtype=bfloat16",
                                 "actor_rollout_ref.ref.fsdp_config.model_dtype=bf16"))
    assert history[-1]["actor/grad_norm"] > 0 and torch.isfinite(torch.tensor(history[-1]["actor/pg_loss"]))
    stored = FileSystemReader(str(tmp_path / "run" / "global_step_1" / "actor")).read_metadata().state_dict_metadata
    weights = {key: meta.properties.dtype for key, meta in stored.items()
               if key.startswith("model.") and hasattr(meta, "properties")}
    moments = {key: meta.properties.dtype for key, meta in stored.items()
               if key.startswith("optimizer.state.") and key.endswith("exp_avg")}
    assert weights and set(weights.values()) == {torch.bfloat16}
    assert moments and set(moments.values()) == {torch.bfloat16}  # AdamW's state follows its parameters
    with pytest.raises(ConfigError, match="model_dtype='fp16': the weights' dtype must be float32"):
        resolve_config(ppo_config(*BASE, "actor_rollout_ref.actor.fsdp_config.model_dtype=fp16"))


EVEN_ROWS_DATASET = '''
import json

from hybridrl.data.rl_dataset import RLHFDataset


class EvenRows(RLHFDataset):
    """A dataset of a user's own on verl's interface: the even rows of the files, each item served logged."""

    def __init__(self, data_files, tokenizer, config, processor=None, **kwargs):
        super().__init__(data_files, tokenizer, config, processor, **kwargs)
        keep = [i for i, row in enumerate(self.rows) if row["extra_info"]["index"] % 2 == 0]
        self.rows, self.origins = [self.rows[i] for i in keep], [self.origins[i] for i in keep]
        self.max_prompt_length = config["max_prompt_length"]  # verl's DictConfig

    def __getitem__(self, item):
        row = super().__getitem__(item)
        with open(LOG, "a") as f:
            f.write(json.dumps(int(self.rows[item]["extra_info"]["index"])) + "\\n")
        return row
'''


def test_a_dataset_class_of_your_own_serves_the_training_prompts(arithmetic_data, tiny_model_dir, tmp_path):
    dataset_file, served = run_with_class_of_your_own(EVEN_ROWS_DATASET, arithmetic_data, tiny_model_dir, tmp_path, 1,
                                                      "data.custom_cls.path={file}", "data.custom_cls.name=EvenRows")
    assert len(served) == 4 and all(index % 2 == 0 for index in served)  # one batch of 4 prompts, even rows only
    with pytest.raises(ConfigError, match="set both"):
        resolve_config(ppo_config(*BASE, f"data.custom_cls.path={dataset_file}"))


TURN_SCORE_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(len(extra_info["turn_scores"]))  # how many times the simulated user replied
'''


def test_a_run_with_an_interaction_gives_the_reward_function_each_replys_score(tmp_path):
    import pyarrow as pa

    rows = [{"data_source": "gsm8k", "prompt": [{"role": "user", "content": f"What is {i} + {i}?"}],
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
             "extra_info": {"index": i, "interaction_kwargs": {"name": "gsm8k", "ground_truth": str(2 * i)}}}
            for i in range(8)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    (tmp_path / "interactions.yaml").write_text(
        "interaction:\n  - name: gsm8k\n    class_name: hybridrl.tools.interaction.Gsm8kInteraction\n")
    (tmp_path / "reward.py").write_text(TURN_SCORE_REWARD)
    model = early_stopping_model(tmp_path / "model")  # short answers, so the user gets to reply
    history = run_ppo(ppo_config(
        f"data.train_files={tmp_path / 'train.parquet'}", f"actor_rollout_ref.model.path={model}",
        "algorithm.adv_estimator=grpo", "data.train_batch_size=4", "data.max_prompt_length=48",
        "data.max_response_length=96", "data.return_raw_chat=true", "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.rollout.multi_turn.enable=true",
        f"actor_rollout_ref.rollout.multi_turn.interaction_config_path={tmp_path / 'interactions.yaml'}",
        "actor_rollout_ref.rollout.multi_turn.max_user_turns=2", f"custom_reward_function.path={tmp_path / 'reward.py'}",
        "trainer.backend=local", "trainer.n_gpus_per_node=1", "trainer.total_training_steps=1",
        "trainer.val_before_train=false", "trainer.test_freq=-1", f"trainer.default_local_dir={tmp_path / 'run'}",
        "trainer.device=cpu"))
    step = history[-1]
    assert step["critic/score/max"] >= 1.0  # a reply's score reached the reward function
    assert step["agent/num_turns/max"] >= 4  # prompt, answer, the user's reply, another answer
    assert step["agent/finish/max_user_turns"] + step["agent/finish/length"] + step["agent/finish/interaction"] == 1.0
