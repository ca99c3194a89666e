"""Bad configs fail before any worker starts, with a message naming the key and the fix."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import MissingMandatoryValue
from ppo_helpers import ppo_config

from hybridrl.trainer.config_checks import ConfigError, batch_plan, validate_config
from hybridrl.trainer.main_ppo import run_ppo

BASE = ["data.train_files=x.parquet", "actor_rollout_ref.model.path=some/model"]


def checked(*overrides: str):
    config = OmegaConf.to_object(ppo_config(*BASE, *overrides))
    validate_config(config)
    return config


def test_defaults_are_valid_and_resolve_the_lengths():
    config = checked()
    rollout = config.actor_rollout_ref.rollout
    assert (rollout.prompt_length, rollout.response_length) == (40, 64)  # interpolated from data.*
    assert config.trainer.device == "cpu"  # auto resolves to cpu on a machine without GPUs
    assert config.critic.model.path == "some/model"


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
         r"ppo_mini_batch_size \(3\) x rollout.n \(1\) must be divisible by the data-parallel size \(2\)"),
        (["trainer.backend=local"], "trainer.n_gpus_per_node=1"),
        (["trainer.device=cuda"], "trainer.device=cpu"),
        (["trainer.resume_mode=resume_path"], "trainer.resume_from_path"),
        (["algorithm.filter_groups.enable=true", "actor_rollout_ref.rollout.n=1",
          "actor_rollout_ref.actor.ppo_mini_batch_size=8", "data.train_batch_size=16"], "rollout.n > 1"),
        (["actor_rollout_ref.rollout.response_length=10"], "data.max_response_length"),
        (["reward_model.enable=true"], "reward_model.model.path"),
        (["ray_init.cpus_per_worker=0"], r"ray_init.cpus_per_worker must be >= 1"),
    ],
)
def test_impossible_settings_fail_naming_the_keys(overrides, message):
    with pytest.raises(ConfigError, match=message):
        checked(*overrides)


@pytest.mark.parametrize("override, registry", [
    ("algorithm.adv_estimator=grpoo", "grpo"),
    ("actor_rollout_ref.actor.policy_loss.loss_mode=vanila", "vanilla"),
    ("actor_rollout_ref.rollout.name=sglang", "hf"),
    ("reward_model.reward_manager=fancy", "naive"),
])
def test_unknown_names_list_the_registered_ones(override, registry):
    with pytest.raises(KeyError, match=registry):
        checked(override)


def test_batch_plan_arithmetic():
    # 16 prompts x 8 samples = 128 rows over 2 ranks; mini-batches of 8 prompts -> 2 optimizer steps,
    # each 8 x 8 / 2 = 32 rows per rank, in micro-batches of 32 -> 1 per mini-batch
    plan = batch_plan(checked())
    assert plan["rows per step (global batch)"] == 128
    assert plan["rows per rank per step"] == 64
    assert plan["optimizer steps per rollout"] == 2
    assert plan["rows per rank per mini-batch"] == 32
    assert plan["micro-batches per rank per mini-batch"] == 1


def test_dry_run_prints_the_plan_and_starts_nothing(capsys):
    assert run_ppo(ppo_config(*BASE, "trainer.dry_run=true")) == []
    out = capsys.readouterr().out
    assert "rows per step (global batch)" in out and "colocated roles: actor_rollout" in out


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
