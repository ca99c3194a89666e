"""Every config key does what it says or refuses a value it cannot run; nothing is accepted and ignored."""

import dataclasses
from pathlib import Path

import pytest
from config_reads import Evidence, SchemaKey, package_sources, scan_sources, schema_keys, unread_keys
from ppo_helpers import ppo_config

import hybridrl
from hybridrl.trainer.config_checks import ConfigError, resolve_config
from hybridrl.trainer.config_rules import NO_EFFECT, SAME_EITHER_WAY, UNSUPPORTED
from hybridrl.trainer.ppo_config import AlgorithmConfig, PPOTrainerConfig
from hybridrl.trainer.sft_config import SFTSchema
from hybridrl.workers.config import ActorConfig, CriticConfig

BASE = ["data.train_files=x.parquet", "actor_rollout_ref.model.path=some/model"]

ROOTS = (PPOTrainerConfig, SFTSchema)


@pytest.fixture(scope="module")
def evidence() -> Evidence:
    return scan_sources(package_sources(Path(hybridrl.__file__).parent), ROOTS)


def all_keys() -> list[SchemaKey]:
    return [key for root in ROOTS for key in schema_keys(root)]


def accounted_for(key: str, tables: set[str]) -> bool:
    """`key` or a section above it is in one of config_rules' tables (NO_EFFECT names whole sections)."""
    parts = key.split(".")
    return any(".".join(parts[:i]) in tables for i in range(1, len(parts) + 1))


def test_every_schema_key_is_read_or_refused(evidence):
    keys = all_keys()
    assert len(keys) > 200  # the walk reaches the nested nodes of both schemas
    accounted = set(UNSUPPORTED) | set(SAME_EITHER_WAY) | set(NO_EFFECT)
    unread = sorted(key for key in unread_keys(keys, evidence) if not accounted_for(key, accounted))
    assert not unread, (
        f"config keys that no code reads: {unread}. Make each one do what it says, refuse its non-default "
        f"values in hybridrl/trainer/config_rules.UNSUPPORTED, or name it in NO_EFFECT's warning (read them under "
        f"their parent's name, e.g. `config.algorithm.kl_ctrl.horizon`, or on a typed config, so the scan in "
        f"config_reads.py sees it)")
    known = {key.dotted for key in keys}
    sections = {key.rsplit(".", i)[0] for key in known for i in range(1, key.count(".") + 1)}
    assert not accounted - known - sections, f"tables name keys the schemas lack: {sorted(accounted - known - sections)}"


def test_the_walk_fails_on_a_key_nobody_reads(evidence):
    # a schema with one more key than the code reads: the walk reports exactly that key
    algorithm = dataclasses.make_dataclass("AlgorithmConfig", [("never_read_anywhere", bool, False)],
                                           bases=(AlgorithmConfig,))
    root = dataclasses.make_dataclass("Root", [("algorithm", algorithm)])
    keys = schema_keys(root)
    unread = unread_keys(keys, scan_sources(package_sources(Path(hybridrl.__file__).parent), [root]))
    assert set(unread) == {"algorithm.never_read_anywhere"} | {k.dotted for k in keys if k.dotted in UNSUPPORTED}


def test_a_read_counts_only_for_the_key_it_names():
    source = '''
def actor_step(config: ActorConfig):
    return config.ppo_epochs

class Critic:
    def __init__(self, config):
        self.config = to_dataclass(CriticConfig, config)

    def plan(self):
        cfg = self.config
        return cfg.shuffle

def reward(config):
    section = config["reward_model"]
    return section.get("overlong_buffer")["log"]
'''
    keys = schema_keys(PPOTrainerConfig)
    unread = set(unread_keys(keys, scan_sources({"snippet.py": source}, [PPOTrainerConfig])))
    # the typed reads name their class; the string chain names its parent
    assert "actor_rollout_ref.actor.ppo_epochs" not in unread and "critic.ppo_epochs" in unread
    assert "critic.shuffle" not in unread and "actor_rollout_ref.actor.shuffle" in unread
    assert "reward_model.overlong_buffer.log" not in unread and "reward_model.overlong_buffer.enable" in unread
    assert {"data.shuffle", "algorithm.use_pf_ppo"} <= unread


def checked(*overrides: str) -> PPOTrainerConfig:
    return resolve_config(ppo_config(*BASE, *overrides))


@pytest.mark.parametrize("override, message", [
    ("actor_rollout_ref.actor.ulysses_sequence_parallel_size=3",  # the default CPU run has 2 ranks
     "actor_rollout_ref.actor.ulysses_sequence_parallel_size=3 must divide the role's 2 ranks"),
    ("actor_rollout_ref.actor.strategy=megatron", "Remove it or set it to one of fsdp, fsdp2"),
    ("trainer.default_hdfs_dir=hdfs://x", "trainer.default_hdfs_dir=hdfs://x is not supported by hybridrl: "
                                          "checkpoints are written to trainer.default_local_dir only"),
    ("actor_rollout_ref.rollout.multi_turn.use_inference_chat_template=true", "Remove it or set it to false"),
    ("actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts=2", "Remove it or set it to null"),
    ("actor_rollout_ref.rollout.agent.agent_loop_config_path=loops.yaml", "custom agent loops are not supported"),
])
def test_a_value_hybridrl_cannot_run_stops_before_ray_naming_the_key(override, message):
    with pytest.raises(ConfigError) as err:
        checked(override)
    assert message in str(err.value)


def test_keys_of_roles_that_do_not_run_pass():
    checked("actor_rollout_ref.actor.strategy=fsdp2", "actor_rollout_ref.actor.ulysses_sequence_parallel_size=1",
            "algorithm.adv_estimator=grpo", "critic.ulysses_sequence_parallel_size=3")  # GRPO runs no critic
    with pytest.raises(ConfigError, match="critic.ulysses_sequence_parallel_size=3 must divide the role's 2 ranks"):
        checked("algorithm.adv_estimator=gae", "critic.ulysses_sequence_parallel_size=3")


def test_verls_global_micro_batch_sizes_divide_among_sequence_parallel_groups():
    config = checked("trainer.backend=ray", "trainer.n_gpus_per_node=4", "algorithm.adv_estimator=gae",
                     "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                     "critic.ppo_mini_batch_size=8", "actor_rollout_ref.actor.ppo_micro_batch_size=8",
                     "actor_rollout_ref.rollout.log_prob_micro_batch_size=8", "critic.ppo_micro_batch_size=8",
                     "actor_rollout_ref.ref.log_prob_micro_batch_size=8",
                     "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
                     "actor_rollout_ref.ref.ulysses_sequence_parallel_size=4")
    arr = config.actor_rollout_ref
    # 4 ranks: two groups of 2 for the actor (and its log-prob pass), one of 4 for the reference, 4 for the critic
    assert (arr.actor.ppo_micro_batch_size_per_gpu, arr.rollout.log_prob_micro_batch_size_per_gpu) == (4, 4)
    assert (arr.ref.log_prob_micro_batch_size_per_gpu, config.critic.ppo_micro_batch_size_per_gpu) == (8, 2)


def test_a_token_budget_holds_one_sequence_across_a_sequence_parallel_group():
    lengths = ["data.max_prompt_length=512", "data.max_response_length=512", "actor_rollout_ref.actor.use_dynamic_bsz=true",
               "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=512"]
    with pytest.raises(ConfigError, match=r"ppo_max_token_len_per_gpu \(512\) x ulysses_sequence_parallel_size \(1\) "
                                          r"must hold one sequence"):
        checked(*lengths)
    checked(*lengths, "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2")  # two ranks' budgets per pass


def test_critic_rollout_n_follows_rollout_n_in_a_config_built_in_python():
    config = PPOTrainerConfig()
    config.data.train_files, config.actor_rollout_ref.model.path = "x.parquet", "some/model"
    config.actor_rollout_ref.rollout.n = 4
    assert resolve_config(config).critic.rollout_n == 4
    assert checked("actor_rollout_ref.rollout.n=2").critic.rollout_n == 2  # and from YAML
    with pytest.raises(ConfigError, match=r"critic.rollout_n \(3\) disagrees with actor_rollout_ref.rollout.n \(1\)"):
        checked("critic.rollout_n=3")  # verl's default n


def test_data_tokenizer_is_the_tokenizer_every_worker_loads():
    config = checked("data.tokenizer=tok/dir")
    assert config.actor_rollout_ref.model.tokenizer_path == "tok/dir"
    assert config.critic.model.tokenizer_path == "tok/dir"
    assert config.reward_model.model.input_tokenizer == "tok/dir"  # the YAML's ${actor_rollout_ref.model.path}
    assert checked().reward_model.model.input_tokenizer == "some/model"
    with pytest.raises(ConfigError, match="data.tokenizer=tok/dir and actor_rollout_ref.model.tokenizer_path=other"):
        checked("data.tokenizer=tok/dir", "actor_rollout_ref.model.tokenizer_path=other")


def test_background_reward_cannot_filter_groups():
    with pytest.raises(ConfigError, match="reward_model.launch_reward_fn_async=false"):
        checked("reward_model.launch_reward_fn_async=true", "algorithm.filter_groups.enable=true",
                "actor_rollout_ref.rollout.n=8")


def test_mini_batch_sizes_count_prompts_in_every_config_that_carries_them():
    from hybridrl.workers.update_loop import check_critic, update_plan

    config = checked("actor_rollout_ref.actor.ppo_mini_batch_size=4", "critic.ppo_mini_batch_size=4",
                     "actor_rollout_ref.rollout.n=8")
    arr, critic = config.actor_rollout_ref, config.critic
    assert arr.actor.ppo_mini_batch_size == critic.ppo_mini_batch_size == 4  # still prompts once resolved
    # a rank's rows per optimizer step: 4 prompts x 8 samples / 2 ranks
    assert update_plan(arr.actor, arr.rollout.n, 2).mini_batch_rows == 16
    assert update_plan(critic, critic.rollout_n, 2).mini_batch_rows == 16
    with pytest.raises(ValueError, match="critic.rollout_n is unset"):
        check_critic(CriticConfig(), world_size=1)
    assert ActorConfig().ppo_mini_batch_size == CriticConfig().ppo_mini_batch_size


def test_validation_shuffle_reorders_the_validation_prompts_reproducibly():
    from hybridrl.trainer.validation import Validator

    def order(*overrides: str) -> list[int]:
        validator = Validator(checked(*overrides), None, None, None, list(range(20)), collate_fn=list)
        return [row for rows in validator.dataloader for row in rows]

    assert order() == list(range(20))
    shuffled = order("data.validation_shuffle=true")
    assert sorted(shuffled) == list(range(20)) and shuffled != list(range(20))
    assert order("data.validation_shuffle=true") == shuffled  # seeded by data.seed
    assert order("data.validation_shuffle=true", "data.seed=2") != shuffled
