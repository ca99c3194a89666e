"""The trainer's rollout-correction stages on hand-built batches, the config keys, and two real GRPO steps.

(Named apart from tests/algos/test_rollout_correction.py, which tests the tensor functions: pytest
imports both test directories as top-level modules.)
"""

import logging
import math

import pytest
import torch
from ppo_helpers import ppo_config, tiny_run_overrides

from hybridrl.protocol import DataProto
from hybridrl.trainer import dataflow
from hybridrl.trainer.config_checks import ConfigError, resolve_config
from hybridrl.trainer.dataflow import old_log_prob_blockers
from hybridrl.trainer.metrics import StageCosts
from hybridrl.trainer.ppo_config import PPOTrainerConfig, RolloutCorrectionConfig
from hybridrl.trainer.ppo_trainer import PPOTrainer

KEY = "algorithm.rollout_correction"

# x = old - rollout = [[0.5, 0, -1.5], [0.1, 2.0, pad]]
OLD = [[-1.0, -0.5, -2.0], [-0.2, -1.0, 0.0]]
ROLLOUT = [[-1.5, -0.5, -0.5], [-0.3, -3.0, 0.0]]
MASK = [[1, 1, 1], [1, 1, 0]]


def hand_batch(with_rollout: bool = True, with_old: bool = True) -> DataProto:
    tensors = {"response_mask": torch.tensor(MASK),
               "attention_mask": torch.cat([torch.ones(2, 2, dtype=torch.long), torch.tensor(MASK)], dim=1)}
    if with_old:
        tensors["old_log_probs"] = torch.tensor(OLD)
    if with_rollout:
        tensors["rollout_log_probs"] = torch.tensor(ROLLOUT)
    return DataProto.from_dict(tensors)


def trainer_with(correction: RolloutCorrectionConfig, actor_rollout=None) -> PPOTrainer:
    """A trainer holding only what the stages under test read: the config, the worker groups, the costs."""
    trainer = PPOTrainer.__new__(PPOTrainer)
    trainer.config = PPOTrainerConfig()
    trainer.config.algorithm.rollout_correction = correction
    trainer.groups = type("Groups", (), {"actor_rollout": actor_rollout, "uses_reference": False, "critic": None})()
    trainer.costs = StageCosts({})
    trainer.fuse_old_log_prob = not old_log_prob_blockers(trainer.config)
    return trainer


class CountingActor:
    """The actor group's compute_log_prob, counted: constant log-probs -0.25 and entropy 1.0."""

    def __init__(self) -> None:
        self.calls = 0

    def compute_log_prob(self, batch: DataProto) -> DataProto:
        self.calls += 1
        shape = batch.batch["response_mask"].shape
        return DataProto.from_dict({"old_log_probs": torch.full(shape, -0.25), "entropys": torch.ones(shape)})


def test_decoupled_stage_adds_truncated_weights_and_the_rejection_mask():
    batch, metrics = hand_batch(), {}
    correction = RolloutCorrectionConfig(rollout_is="token", rollout_is_threshold=2.0, rollout_rs="token_k1",
                                         rollout_rs_threshold=2.0)
    trainer_with(correction)._correct_rollout(batch, metrics)
    # w = exp(x) truncated at 2: e^0.5 = 1.6487, e^0 = 1, e^-1.5 = 0.2231, e^0.1 = 1.1052, e^2 = 7.39 -> 2; pad 0
    expected = torch.tensor([[math.exp(0.5), 1.0, math.exp(-1.5)], [math.exp(0.1), 2.0, 0.0]])
    torch.testing.assert_close(batch.batch["rollout_is_weights"], expected)
    # token_k1 at 2.0 keeps -x in [log 0.5, log 2] = [-0.693, 0.693]: -x = 1.5 and -x = -2.0 are rejected
    assert batch.batch["response_mask"].tolist() == [[1, 1, 0], [1, 0, 0]]
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(2 / 5)
    assert metrics["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(1 / 5)  # only e^2
    assert metrics["rollout_corr/kl"] == pytest.approx((-0.5 - 0.0 + 1.5 - 0.1 - 2.0) / 5)  # mean of -x
    assert {"rollout_corr/rollout_is_mean", "rollout_corr/rollout_is_eff_sample_size",
            "rollout_corr/rollout_rs_token_k1_mean", "rollout_corr/training_ppl"} <= set(metrics)


def test_sequence_weights_and_icepop_and_no_correction():
    batch, metrics = hand_batch(), {}
    trainer_with(RolloutCorrectionConfig(rollout_is="sequence", rollout_is_threshold=5.0))._correct_rollout(
        batch, metrics)
    # row sums of x: 0.5 + 0 - 1.5 = -1 -> e^-1 = 0.368; 0.1 + 2.0 = 2.1 -> e^2.1 = 8.17 -> 5
    expected = torch.tensor([[math.exp(-1.0)] * 3, [5.0, 5.0, 0.0]])
    torch.testing.assert_close(batch.batch["rollout_is_weights"], expected)
    assert batch.batch["response_mask"].tolist() == MASK  # no rejection asked for

    batch = hand_batch()
    icepop = RolloutCorrectionConfig(rollout_is="token", rollout_is_threshold="0.5_1.5")
    trainer_with(icepop)._correct_rollout(batch, {})
    # IcePop zeroes weights outside [0.5, 1.5]: e^0.5 = 1.65, e^-1.5 = 0.22 and e^2 go, e^0 and e^0.1 stay
    expected = torch.tensor([[0.0, 1.0, 0.0], [math.exp(0.1), 0.0, 0.0]])
    torch.testing.assert_close(batch.batch["rollout_is_weights"], expected)

    batch, metrics = hand_batch(), {}
    trainer_with(RolloutCorrectionConfig())._correct_rollout(batch, metrics)  # off by default
    assert "rollout_is_weights" not in batch.batch and metrics == {}


def test_the_weights_follow_their_rows_through_balancing():
    batch = hand_batch()
    trainer_with(RolloutCorrectionConfig(rollout_is="token"))._correct_rollout(batch, {})
    batch.batch["row"] = torch.arange(2)
    dataflow.balance_batch(batch, world_size=2)
    x = batch.batch["old_log_probs"] - batch.batch["rollout_log_probs"]
    expected = torch.exp(x).clamp(max=2.0) * batch.batch["response_mask"]
    torch.testing.assert_close(batch.batch["rollout_is_weights"], expected)


def test_missing_rollout_log_probs_name_the_column_and_the_keys():
    message = r"'rollout_log_probs'(.|\n)*set algorithm.rollout_correction.rollout_is=null"
    trainer = trainer_with(RolloutCorrectionConfig(rollout_is="token"), CountingActor())
    batch = hand_batch(with_rollout=False, with_old=False)
    trainer._recompute(batch, {}, {})
    with pytest.raises(KeyError, match=message):
        trainer._correct_rollout(batch, {})
    trainer = trainer_with(RolloutCorrectionConfig(bypass_mode=True), CountingActor())
    with pytest.raises(KeyError, match=message):
        trainer._recompute(hand_batch(with_rollout=False, with_old=False), {}, {})


def test_bypass_mode_skips_the_old_log_prob_pass():
    actor = CountingActor()
    batch, metrics, timing = hand_batch(with_old=False), {}, {}
    trainer_with(RolloutCorrectionConfig(bypass_mode=True), actor)._recompute(batch, metrics, timing)
    assert actor.calls == 0 and "old_log_prob" not in timing and "actor/entropy" not in metrics
    torch.testing.assert_close(batch.batch["old_log_probs"], torch.tensor(ROLLOUT))
    # decoupled mode runs the pass and keeps the actor's log-probs
    batch, metrics, timing = hand_batch(with_old=False), {}, {}
    trainer_with(RolloutCorrectionConfig(), actor)._recompute(batch, metrics, timing)
    assert actor.calls == 1 and "old_log_prob" in timing and metrics["actor/entropy"] == 1.0
    assert (batch.batch["old_log_probs"] == -0.25).all()


def checked(*overrides: str) -> PPOTrainerConfig:
    return resolve_config(ppo_config("data.train_files=x.parquet", "actor_rollout_ref.model.path=m", *overrides))


def test_config_defaults_are_verls_and_bad_values_name_the_key():
    correction = checked().algorithm.rollout_correction
    assert (correction.rollout_is, correction.rollout_is_threshold, correction.rollout_is_batch_normalize,
            correction.rollout_rs, correction.rollout_rs_threshold, correction.bypass_mode,
            correction.loss_type) == (None, 2.0, False, None, None, False, "ppo_clip")
    icepop = checked(f"{KEY}.rollout_is=token", f"{KEY}.rollout_is_threshold=0.5_5.0").algorithm.rollout_correction
    assert icepop.rollout_is_threshold == "0.5_5.0"
    refused = {
        (f"{KEY}.rollout_is=tokens",): f"{KEY}.rollout_is must be one of",
        (f"{KEY}.rollout_is=token", f"{KEY}.rollout_is_threshold=5.0_1.0"): f"{KEY}.rollout_is_threshold",
        (f"{KEY}.rollout_is=token", f"{KEY}.rollout_is_threshold=null"): "null would compute no weights",
        (f"{KEY}.rollout_is_batch_normalize=true",): "act only on IS weights",
        (f"{KEY}.rollout_rs=token_k9", f"{KEY}.rollout_rs_threshold=2"): f"{KEY}.rollout_rs",
        (f"{KEY}.rollout_rs=token_k1",): "rollout_rs needs rollout_rs_threshold",
        (f"{KEY}.rollout_rs_threshold=2",): "acts only with",
        (f"{KEY}.bypass_mode=true", f"{KEY}.loss_type=reinfroce"): f"{KEY}.loss_type must be one of",
        (f"{KEY}.loss_type=reinforce",): "acts only in bypass mode",
    }
    for overrides, message in refused.items():
        with pytest.raises(ConfigError, match=message):
            checked(*overrides)
    # bypass mode corrects inside the loss: rejection with either loss, IS weights with reinforce
    checked(f"{KEY}.bypass_mode=true", f"{KEY}.rollout_rs=token_k1", f"{KEY}.rollout_rs_threshold=2")
    checked(f"{KEY}.bypass_mode=true", f"{KEY}.loss_type=reinforce", f"{KEY}.rollout_is=sequence")


def test_ppo_clip_in_bypass_mode_reports_is_weights_without_applying_them_and_says_so(caplog):
    # verl's multi-rejection recipe asks for token IS with ppo_clip: the weights become metrics only
    with caplog.at_level(logging.WARNING):
        checked(f"{KEY}.bypass_mode=true", f"{KEY}.rollout_is=token")
    assert "reported (rollout_corr/* metrics) but not applied" in caplog.text


def test_the_config_alone_takes_rejection_without_a_threshold_as_verls_does_and_a_run_refuses_it():
    # verl's RolloutCorrectionConfig(rollout_rs="token_k1") builds; its threshold is asked for where rejection runs
    correction = RolloutCorrectionConfig(rollout_rs="token_k1")
    assert (correction.rollout_rs, correction.rollout_rs_threshold) == ("token_k1", None)
    with pytest.raises(ConfigError, match=f"{KEY}.rollout_rs"):
        RolloutCorrectionConfig(rollout_rs="token_k9")  # an unknown option is refused at once
    with pytest.raises(ConfigError, match=f"set {KEY}.rollout_rs_threshold"):
        checked(f"{KEY}.rollout_rs=token_k1")


LOCAL = ["trainer.backend=local", "trainer.n_gpus_per_node=1", "trainer.total_training_steps=2"]


@pytest.mark.parametrize("mode", ["decoupled", "bypass", "bypass_reinforce"])
def test_two_grpo_steps_with_rollout_correction(arithmetic_data, tiny_model_dir, tmp_path, mode):
    extra = {"decoupled": [f"{KEY}.rollout_is=sequence", f"{KEY}.rollout_rs=token_k3",
                           f"{KEY}.rollout_rs_threshold=0.01"],
             "bypass": [f"{KEY}.bypass_mode=true", f"{KEY}.rollout_rs=token_k3", f"{KEY}.rollout_rs_threshold=0.01"],
             "bypass_reinforce": [f"{KEY}.bypass_mode=true", f"{KEY}.loss_type=reinforce", f"{KEY}.rollout_is=token",
                                  f"{KEY}.rollout_is_threshold=2.0"]}[mode]
    history = run_ppo_local(arithmetic_data, tiny_model_dir, tmp_path, extra)
    assert [step["training/global_step"] for step in history] == [1, 2]
    for step in history:
        assert step["actor/grad_norm"] > 0 and math.isfinite(step["actor/pg_loss"])
        assert "actor/entropy" in step  # from the update in bypass mode
        if mode.startswith("bypass"):
            assert not {"timing_s/old_log_prob", "rollout/log_prob_diff_max"} & set(step)
            # measured inside the loss against the current policy, which the first mini-batch has moved
            assert math.isfinite(step["rollout_corr/kl"]) and "actor/rollout_corr/kl" not in step
            assert ("rollout_corr/rollout_is_mean" in step) == (mode == "bypass_reinforce")
            assert ("rollout_corr/rollout_rs_masked_fraction" in step) == (mode == "bypass")
        else:
            # the HF engine samples with the actor's weights: weights ~ 1, nothing rejected
            assert step["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=1e-3)
            assert step["rollout_corr/rollout_rs_masked_fraction"] == 0.0
            assert "timing_s/old_log_prob" in step


def run_ppo_local(data, model, tmp_path, extra):
    from hybridrl.trainer.main_ppo import run_ppo

    return run_ppo(ppo_config(*tiny_run_overrides(data, model, tmp_path / "run"), *LOCAL, *extra))
