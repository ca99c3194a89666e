"""Bad configs fail before any worker starts, with a message naming the key and the fix."""

import dataclasses
import logging
import typing

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import MissingMandatoryValue
from ppo_helpers import ppo_config

from hybridrl.trainer.config_checks import ConfigError, batch_plan, flatten, resolve_config
from hybridrl.trainer.config_rules import RANGES, UNCHECKED
from hybridrl.trainer.main_ppo import run_ppo
from hybridrl.trainer.ppo_config import PPOTrainerConfig

BASE = ["data.train_files=x.parquet", "actor_rollout_ref.model.path=some/model"]


@pytest.fixture
def no_gpu(monkeypatch):
    """torch sees no GPU, also on a machine that has one: what `auto` resolves to and what `cuda` is refused
    with are the CPU machine's."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def checked(*overrides: str):
    return resolve_config(ppo_config(*BASE, *overrides))


def test_defaults_are_valid_and_resolve_the_lengths(no_gpu):
    config = checked()
    rollout = config.actor_rollout_ref.rollout
    assert (rollout.prompt_length, rollout.response_length) == (40, 64)  # interpolated from data.*
    assert config.trainer.device == "cpu"  # auto resolves to cpu on a machine without GPUs
    assert config.critic.model.path == "some/model"


def test_the_yaml_departs_from_verl_s_defaults_only_where_it_sizes_the_built_in_task():
    """A verl script that leaves a key out gets verl's default (the schema's), except the keys
    ppo_trainer.yaml sets for the built-in task on a 2-core CPU, the list in docs/coming-from-verl.md."""
    composed = flatten(OmegaConf.to_container(ppo_config(*BASE), resolve=True))
    schema = flatten(OmegaConf.to_container(OmegaConf.structured(PPOTrainerConfig), resolve=False))
    changed = {key for key, value in composed.items() if value != schema[key]}
    assert changed - {"data.train_files", "actor_rollout_ref.model.path"} == {
        "data.max_prompt_length", "data.max_response_length", "data.train_batch_size",
        "actor_rollout_ref.actor.ppo_mini_batch_size", "actor_rollout_ref.actor.optim.lr",
        "trainer.n_gpus_per_node", "trainer.logger", "trainer.project_name", "trainer.experiment_name",
        # followed from the keys above or the model path, as verl's YAML interpolates them
        "actor_rollout_ref.rollout.prompt_length", "actor_rollout_ref.rollout.response_length",
        "critic.ppo_mini_batch_size", "critic.model.path", "reward_model.model.input_tokenizer",
        "trainer.default_local_dir",
    }


def test_bf16_compute_keys_on_a_cpu_that_emulates_bf16_are_warned_about_once_each(no_gpu, caplog):
    from hybridrl.utils.device import native_bf16

    rollout_key = "actor_rollout_ref.rollout.dtype"
    with caplog.at_level("WARNING", logger="hybridrl.trainer.config_checks"):
        checked("trainer.device=cpu", f"{rollout_key}=bfloat16",
                "actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype=bfloat16")  # not a compute dtype
    warned = [r.getMessage() for r in caplog.records if "without native bf16" in r.getMessage()]
    assert len(warned) == (0 if native_bf16("cpu") else 1) and all(w.startswith(rollout_key) for w in warned)


def test_a_misspelt_key_names_the_key():
    with pytest.raises(ConfigCompositionException) as err:
        ppo_config(*BASE, "trainer.n_gpus_per_nod=2")
    assert "n_gpus_per_nod" in str(err.value.__cause__ or err.value)


def test_a_wrong_type_names_the_key():
    with pytest.raises(ConfigCompositionException) as err:
        ppo_config(*BASE, "data.train_batch_size=many")
    assert "train_batch_size" in str(err.value.__cause__ or err.value)


def test_the_model_path_is_required():
    with pytest.raises(MissingMandatoryValue, match="actor_rollout_ref.model.path"):
        OmegaConf.to_object(ppo_config("data.train_files=x.parquet"))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["data.train_batch_size=10", "actor_rollout_ref.actor.ppo_mini_batch_size=4"],
         r"data.train_batch_size \(10\) must be a multiple of actor_rollout_ref.actor.ppo_mini_batch_size \(4\)"),
        (["data.train_batch_size=9", "actor_rollout_ref.actor.ppo_mini_batch_size=3", "actor_rollout_ref.rollout.n=1"],
         r"actor_rollout_ref.actor.ppo_mini_batch_size \(3\) x actor_rollout_ref.rollout.n \(1\) must be divisible by "
         r"the data-parallel size \(2\): change either, or trainer.n_gpus_per_node"),
        (["trainer.backend=local"], "trainer.n_gpus_per_node=1"),
        (["trainer.device=cuda"], "trainer.device=cpu"),
        (["trainer.resume_mode=resume_path"], "trainer.resume_from_path"),
        (["algorithm.filter_groups.enable=true", "actor_rollout_ref.rollout.n=1",
          "actor_rollout_ref.actor.ppo_mini_batch_size=8", "data.train_batch_size=16"], "rollout.n > 1"),
        (["actor_rollout_ref.rollout.response_length=10"], "data.max_response_length"),
        (["reward_model.enable=true"], "reward_model.model.path"),
        (["ray_init.cpus_per_worker=0"], r"ray_init.cpus_per_worker must be >= 1"),
        (["actor_rollout_ref.ref.fsdp_config.fsdp_size=0"],
         r"actor_rollout_ref.ref.fsdp_config.fsdp_size=0 must divide the world size \(2\) for hybrid sharding"),
        (["actor_rollout_ref.rollout.dtype=fp8"], r"actor_rollout_ref.rollout.dtype='fp8' is not a dtype: use one "
                                                  r"of bf16, bfloat16, float16, float32, fp16, fp32, or auto"),
        (["critic.model.fsdp_config.mixed_precision.param_dtype=half-ish"],
         r"critic.model.fsdp_config.mixed_precision.param_dtype='half-ish' is not a dtype"),
        # a GDPO key with an estimator that never reads it would be silently ignored
        (["algorithm.adv_estimator=grpo", "algorithm.gdpo_reward_keys=[format_reward]"],
         r"algorithm.gdpo_reward_keys is set but algorithm.adv_estimator=grpo does not read it"),
        (["actor_rollout_ref.actor.tau_neg=0"], r"actor_rollout_ref.actor.tau_neg"),
        (["algorithm.adv_estimator=grpo", "algorithm.use_pf_ppo=true"],
         r"algorithm.use_pf_ppo=true resamples the batch after GAE's advantages only"),
        (["algorithm.pf_ppo.weight_pow=3"], r"algorithm.pf_ppo.\* acts only with algorithm.use_pf_ppo=true"),
        (["algorithm.pf_ppo.reweight_method=median"], r"algorithm.pf_ppo.reweight_method must be one of"),
        (["algorithm.adv_estimator=optimal_token_baseline"],
         r"needs sum_pi_squared from the old log-prob pass: set actor_rollout_ref.actor.calculate_sum_pi_squared"),
        (["algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.calculate_sum_pi_squared=true"],
         r"computes a column algorithm.adv_estimator=grpo does not read"),
    ],
)
def test_impossible_settings_fail_naming_the_keys(overrides, message, no_gpu):
    with pytest.raises(ConfigError, match=message):
        checked(*overrides)


@pytest.mark.parametrize("override, registry", [
    ("algorithm.adv_estimator=grpoo", "grpo"),
    ("actor_rollout_ref.actor.policy_loss.loss_mode=vanila", "vanilla"),
    ("actor_rollout_ref.rollout.name=lmdeploy", "hf"),
    ("reward_model.reward_manager=fancy", "naive"),
])
def test_unknown_names_list_the_registered_ones(override, registry):
    with pytest.raises(KeyError, match=registry):
        checked(override)


def test_batch_plan_arithmetic():
    # 16 prompts x 8 samples = 128 rows over 2 ranks; mini-batches of 8 prompts -> 2 optimizer steps,
    # each 8 x 8 / 2 = 32 rows per rank, in micro-batches of 32 -> 1 per mini-batch
    plan = batch_plan(checked("actor_rollout_ref.rollout.n=8"))
    assert plan["rows per step (global batch)"] == 128
    assert plan["rows per rank per step"] == 64
    assert plan["optimizer steps per rollout"] == 2
    assert plan["rows per rank per mini-batch"] == 32
    assert plan["micro-batches per rank per mini-batch"] == 1
    # groups of 2 ranks split each sequence: one group holds both ranks' rows, in micro-batches of 16
    plan = batch_plan(checked("actor_rollout_ref.rollout.n=8", "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
                              "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16"))
    assert plan["ranks per sequence-parallel group (actor)"] == 2
    assert plan["rows per sequence-parallel group per step"] == 128
    assert plan["rows per sequence-parallel group per mini-batch"] == 64
    assert plan["micro-batches per sequence-parallel group per mini-batch"] == 4


def test_dry_run_prints_the_plan_and_starts_nothing(capsys):
    assert run_ppo(ppo_config(*BASE, "trainer.dry_run=true")) == []
    out = capsys.readouterr().out
    assert "rows per step (global batch)" in out and "colocated" in out
    assert "global_pool  1 node(s) x 2 process(es) = 2; roles: actor_rollout" in out


def test_bad_data_fails_before_workers_start(tmp_path, tiny_model_dir):
    missing = tmp_path / "no_prompt.parquet"
    pq.write_table(pa.table({"data_source": ["arithmetic"], "question": ["1+1"]}), missing)
    with pytest.raises(Exception, match="prompt"):
        run_ppo(ppo_config(f"data.train_files={missing}", f"actor_rollout_ref.model.path={tiny_model_dir}"))
    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"data_source": pa.array([], pa.string()),
                             "prompt": pa.array([], pa.list_(pa.struct([("role", pa.string()),
                                                                        ("content", pa.string())])))}), empty)
    with pytest.raises(Exception, match="empty|no rows|0 rows"):
        run_ppo(ppo_config(f"data.train_files={empty}", f"actor_rollout_ref.model.path={tiny_model_dir}"))


def numeric_keys(cls: type, prefix: str = "") -> list[str]:
    """Every int / float / list-of-float key of a config dataclass tree, as dotted paths."""
    keys = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):
            keys += numeric_keys(kind, f"{prefix}{f.name}.")
        elif {int, float, list[float]} & ({kind} | set(typing.get_args(kind))):
            keys.append(f"{prefix}{f.name}")
    return keys


def test_every_numeric_setting_has_a_range_or_a_reason_not_to():
    keys = set(numeric_keys(PPOTrainerConfig))
    assert "actor_rollout_ref.actor.optim.lr" in keys and "algorithm.gamma" in keys  # the walk finds them
    missing = keys - set(RANGES) - set(UNCHECKED)
    assert not missing, f"give these keys a rule in config_rules.RANGES, or a reason in UNCHECKED: {missing}"
    assert not set(RANGES) & set(UNCHECKED)
    assert not (set(RANGES) | set(UNCHECKED)) - keys  # no rule for a key the schema does not have


@pytest.mark.parametrize("override, message", [
    ("actor_rollout_ref.actor.optim.lr=-1e-3",
     "actor_rollout_ref.actor.optim.lr=-0.001 is out of range: it must be >= 0. "
     "Fix: e.g. actor_rollout_ref.actor.optim.lr=1e-06 (the schema's default)"),
    ("actor_rollout_ref.actor.optim.betas=[0.9]",
     "it must be a list of two numbers in [0, 1) (AdamW's beta1, beta2). "
     "Fix: e.g. actor_rollout_ref.actor.optim.betas=[0.9,0.999]"),
    ("actor_rollout_ref.actor.clip_ratio=1.0", "actor_rollout_ref.actor.clip_ratio=1.0 is out of range: "
                                               "it must be in [0, 1)"),
    ("actor_rollout_ref.rollout.gpu_memory_utilization=0", "it must be in (0, 1]"),
    ("trainer.total_training_steps=0", "trainer.total_training_steps=0 is out of range: it must be null or >= 1. "
                                       "Fix: e.g. trainer.total_training_steps=null"),
    ("algorithm.lam=-0.1", "algorithm.lam=-0.1 is out of range: it must be in [0, 1]"),
])
def test_out_of_range_settings_name_the_key_the_range_and_a_valid_value(override, message):
    with pytest.raises(ConfigError) as err:
        checked(override)
    assert message in str(err.value)


def test_settings_of_a_role_that_does_not_run_are_not_range_checked():
    # GRPO runs no critic and, with reward_model.enable=false, no reward model worker
    checked("algorithm.adv_estimator=grpo", "critic.optim.lr=-1", "reward_model.micro_batch_size_per_gpu=0")
    with pytest.raises(ConfigError, match=r"critic.optim.lr=-1.0 is out of range"):
        checked("algorithm.adv_estimator=gae", "critic.optim.lr=-1")


@pytest.mark.parametrize("override, message", [
    ("+actor_rollout_ref.actor.optim.lrr=1e-3",
     "unknown config key actor_rollout_ref.actor.optim.lrr, which a `+key=value` override added but nothing "
     "reads; did you mean actor_rollout_ref.actor.optim.lr? Fix the name, and drop the `+`"),
    ("++critic.ppo_epoch=2", "did you mean critic.ppo_epochs?"),
    ("+trainer.zzz=1", "trainer has: balance_batch, total_epochs, "),  # nothing close: the node's keys
    ("+wandb.project=x", "unknown config key wandb, which"),  # a whole new section at the top
])
def test_plus_added_keys_beyond_the_schema_are_refused(override, message):
    with pytest.raises(ConfigError) as err:
        checked(override)
    assert message in str(err.value)


def test_open_dicts_take_plus_added_keys():
    config = checked(
        "+actor_rollout_ref.model.override_config.attn_implementation=eager",
        "+custom_reward_function.reward_kwargs.scale=2",
        "+reward_model.reward_kwargs.format_score=0.1",
        "+reward_model.model.override_config.num_labels=1",
        "+data.apply_chat_template_kwargs.enable_thinking=false",
    )
    assert config.actor_rollout_ref.model.override_config == {"attn_implementation": "eager"}
    assert config.custom_reward_function.reward_kwargs == {"scale": 2}
    assert config.reward_model.reward_kwargs == {"format_score": 0.1}
    assert config.reward_model.model.override_config == {"num_labels": 1}
    assert config.data.apply_chat_template_kwargs == {"enable_thinking": False}


def test_dtype_keys_default_to_auto_which_a_cpu_run_resolves_to_float32(no_gpu):
    cfg = ppo_config()
    for node in (cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.ref, cfg.critic.model):
        assert node.fsdp_config.mixed_precision.param_dtype == "auto"  # bf16 on a bf16 GPU, fp32 on a CPU
    assert cfg.actor_rollout_ref.rollout.dtype == "auto"
    config = checked("trainer.device=cpu", "actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype=bfloat16")
    arr = config.actor_rollout_ref
    assert (arr.actor.fsdp_config.mixed_precision.param_dtype, arr.rollout.dtype) == ("float32", "float32")
    assert arr.ref.fsdp_config.mixed_precision.param_dtype == "bfloat16"  # a named dtype stays as named


def test_null_is_not_a_dtype_and_the_error_names_auto(no_gpu):
    config = OmegaConf.to_object(ppo_config(*BASE))
    config.actor_rollout_ref.rollout.dtype = None  # a config built in Python; Hydra refuses null for a str key
    with pytest.raises(ConfigError, match=r"actor_rollout_ref.rollout.dtype=null is not a dtype; the automatic one is "
                                          r"auto .*set actor_rollout_ref.rollout.dtype=auto"):
        resolve_config(config)


def test_bounds_that_the_command_line_turns_into_one_number_are_named():
    from hybridrl.trainer.config_checks import bounds_read_as_numbers

    key = "algorithm.rollout_correction.rollout_is_threshold"
    problems = bounds_read_as_numbers([f"{key}=1_5", f"{key}=0.5_5", "algorithm.rollout_correction.rollout_rs_threshold=1_5.0"])
    assert [p.split(" reached")[0] for p in problems] == [f"{key}=1_5", f"{key}=0.5_5",
                                                          "algorithm.rollout_correction.rollout_rs_threshold=1_5.0"]
    assert "as the number 15:" in problems[0] and "as the number 0.55:" in problems[1] and "number 15.0:" in problems[2]
    assert f"({key}='0.5_5')" in problems[1]  # the fix: quote it
    # kept as written: quoted, a lower bound with a decimal point, one plain number, other keys' separators
    fine = [f"{key}='0.5_5'", f"{key}=0.5_5.0", f"{key}=2.0", "data.train_batch_size=1_024"]
    assert bounds_read_as_numbers(fine) == []


@pytest.mark.slow  # a new process per case, importing the whole stack
@pytest.mark.parametrize(("value", "misread"), [("0.5_5", True), ("'0.5_5'", False)])
def test_the_entry_point_stops_before_training_on_bounds_read_as_a_number(value, misread):
    import subprocess
    import sys

    key = "algorithm.rollout_correction.rollout_is_threshold"
    result = subprocess.run([sys.executable, "-m", "hybridrl.trainer.main_ppo", *BASE, f"{key}={value}",
                             "algorithm.rollout_correction.rollout_is=token", "trainer.dry_run=true"],
                            capture_output=True, text=True, timeout=120)
    if misread:
        assert result.returncode != 0 and f"{key}=0.5_5 reached the config as the number 0.55" in result.stderr
    else:
        assert result.returncode == 0, result.stderr[-2000:]
        assert "rollout_is_threshold: '0.5_5'" in result.stdout  # the dry run prints the checked config, a string


def test_a_loss_with_its_own_aggregation_says_loss_agg_mode_does_not_apply(no_gpu, caplog):
    with caplog.at_level(logging.WARNING, logger="hybridrl.trainer.config_checks"):
        checked("actor_rollout_ref.actor.policy_loss.loss_mode=sapo")
    assert "loss_agg_mode=token-mean does not apply to policy_loss.loss_mode=sapo" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hybridrl.trainer.config_checks"):
        checked("actor_rollout_ref.actor.policy_loss.loss_mode=sapo",
                "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean")
    assert "does not apply" not in caplog.text


def test_the_resolved_config_is_frozen_and_an_assignment_names_the_key(no_gpu):
    import pickle

    from hybridrl.workers.config import ActorConfig

    composed = OmegaConf.to_object(ppo_config(*BASE))
    config = resolve_config(composed)
    with pytest.raises(dataclasses.FrozenInstanceError, match=r"^actor_rollout_ref.actor.optim.lr is read-only"):
        config.actor_rollout_ref.actor.optim.lr = 1.0
    with pytest.raises(dataclasses.FrozenInstanceError, match=r"^trainer is read-only"):
        config.trainer = None
    with pytest.raises(dataclasses.FrozenInstanceError, match=r"^critic.rollout_n is read-only"):
        pickle.loads(pickle.dumps(config)).critic.rollout_n = 3  # as a worker receives it
    composed.trainer.device = "cuda"  # the input stays as built, writable
    assert composed.critic.rollout_n is None
    changed = dataclasses.replace(config.actor_rollout_ref.rollout, seed=1)  # a per-rank copy is the worker's own
    changed.seed = 2
    direct = ActorConfig()  # verl's tests and scripts build the dataclasses and change them
    direct.ppo_epochs = 2
    assert direct.ppo_epochs == 2 and config.actor_rollout_ref.rollout.seed == 0


def test_step_counts_follow_the_data_size_unless_set(no_gpu):
    base = [*BASE, "data.train_batch_size=16", "trainer.total_epochs=3"]
    # 50 prompts make 3 whole batches of 16; 3 epochs of them
    config = resolve_config(ppo_config(*base, "trainer.total_training_steps=null"), lambda checked: 50)
    assert config.trainer.total_training_steps == 9
    assert config.actor_rollout_ref.actor.optim.total_training_steps == config.critic.optim.total_training_steps == 9
    config = resolve_config(ppo_config(*base, "trainer.total_training_steps=4"), lambda checked: 50)
    assert config.actor_rollout_ref.actor.optim.total_training_steps == 4
    with pytest.raises(ConfigError, match="the training set has 10 prompts, fewer than data.train_batch_size=16"):
        resolve_config(ppo_config(*base), lambda checked: 10)
    with pytest.raises(ConfigError, match=r"critic.optim.total_training_steps=7 disagrees with the run's 9 steps"):
        resolve_config(ppo_config(*base, "critic.optim.total_training_steps=7"), lambda checked: 50)


def test_micro_batch_sizes_become_rows_per_rank_where_only_the_global_key_is_set(no_gpu):
    unset = ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null",
             "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=null", "critic.forward_micro_batch_size_per_gpu=null"]
    config = checked(*unset, "actor_rollout_ref.actor.ppo_micro_batch_size=8",
                     "actor_rollout_ref.ref.log_prob_micro_batch_size=6", "algorithm.adv_estimator=gae",
                     "critic.forward_micro_batch_size=4")
    arr = config.actor_rollout_ref
    assert arr.actor.ppo_micro_batch_size_per_gpu == 4 and arr.ref.log_prob_micro_batch_size_per_gpu == 3  # 2 ranks
    assert config.critic.forward_micro_batch_size_per_gpu == 2
    assert arr.actor.ppo_micro_batch_size == 8  # the key as set stays
    with pytest.raises(ConfigError, match=r"actor_rollout_ref.ref.log_prob_micro_batch_size \(5\) must be divisible"):
        checked(*unset, "actor_rollout_ref.ref.log_prob_micro_batch_size=5")
