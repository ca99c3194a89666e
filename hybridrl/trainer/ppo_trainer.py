"""The single controller of PPO/GRPO training, one method per stage (docs/architecture.md, "One PPO step").

All model work is a call on a worker group; estimators declare the inputs they need, never branched on by name.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hybridrl.algos import (
    apply_kl_penalty,
    compute_pf_ppo_reweight_data,
    get_adv_estimator_spec,
    get_kl_controller,
)
from hybridrl.data.sampler import StatefulDataLoader, prompt_sampler
from hybridrl.protocol import DataProto
from hybridrl.rewards.failures import add_reward_metrics
from hybridrl.trainer import dataflow
from hybridrl.trainer.async_training import Collected, GenerationAhead, Streamer, StreamSettings, staleness
from hybridrl.trainer.config_checks import report_config_changes, write_run_config
from hybridrl.trainer.dataflow import BackgroundReward
from hybridrl.trainer.metrics import (
    DivergenceGuard,
    StageCosts,
    compute_data_metrics,
    compute_memory_metrics,
    compute_rollout_agreement_metrics,
    compute_throughput_metrics,
    compute_timing_metrics,
    real_tokens,
    reduce_metrics,
)
from hybridrl.trainer.ppo_config import PPOTrainerConfig
from hybridrl.trainer.validation import Validator, generation_records, write_generations
from hybridrl.trainer.worker_groups import WorkerGroups
from hybridrl.utils.metric import timer
from hybridrl.utils.torch_functional import masked_mean
from hybridrl.utils.tracking import StepProgress, Tracking
from hybridrl.workers.checkpoint import commit_checkpoint, load_state_file
from hybridrl.workers.checkpoint_resume import (
    check_no_committed_after,
    check_uncommitted,
    find_latest_ckpt_path,
    load_newest_loadable,
    resume_candidates,
)
from hybridrl.workers.rollout.agent_loop import AGENT_INPUT_COLUMNS, compute_agent_metrics


class PPOTrainer:
    """Runs `fit()` over worker groups built by `WorkerGroups` (Ray or local backend)."""

    def __init__(self, config: PPOTrainerConfig, tokenizer: Any, groups: WorkerGroups, reward_fn: Any,
                 val_reward_fn: Any, train_dataset: Any, val_dataset: Any | None, collate_fn: Any) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.groups = groups
        self.reward_fn = reward_fn
        self.estimator = get_adv_estimator_spec(config.algorithm.adv_estimator)
        self.kl_ctrl = get_kl_controller(**vars(config.algorithm.kl_ctrl))
        self.sampler = prompt_sampler(config.data, train_dataset)
        self.dataloader = StatefulDataLoader(
            train_dataset, sampler=self.sampler, batch_size=config.data.train_batch_size, drop_last=True,
            collate_fn=collate_fn, num_workers=config.data.dataloader_num_workers,
        )
        self.validator = Validator(config, tokenizer, groups, val_reward_fn, val_dataset, collate_fn) \
            if val_dataset is not None and val_reward_fn is not None else None
        self.total_steps = config.trainer.total_training_steps  # from the data size (resolve_config)
        self.costs = StageCosts(groups.model_passes())
        self.global_steps = 0
        self.history: list[dict[str, float]] = []
        lrs = [f"actor_rollout_ref.actor.optim.lr={config.actor_rollout_ref.actor.optim.lr}"]
        if groups.critic is not None:
            lrs.append(f"critic.optim.lr={config.critic.optim.lr}")
        self.guard = DivergenceGuard(
            config.trainer.max_consecutive_skipped_steps,
            last_checkpoint=lambda: find_latest_ckpt_path(config.trainer.default_local_dir),
            hint=f"Lower the learning rate ({', '.join(lrs)}) or look for NaN in the rewards, then run again",
        )
        self._batches: Iterator[dict] | None = None
        # a background thread draws prompts while the main thread updates the sampler or saves the loader (reentrant)
        self._data_lock = threading.RLock()
        self.ahead = GenerationAhead(self._collect_ahead) if config.async_training.mode == "one_step_off" else None
        self._restored: Collected | None = None  # a batch generated before the checkpoint this run resumed from
        self.streamer: Streamer | None = None  # streaming: started by fit
        self._stream_prompts: DataProto | None = None  # streaming: prompts drawn, not yet sent to the rollout
        self._stream_restored: DataProto | None = None  # streaming: finished groups a checkpoint saved
        self.rollout_columns = AGENT_INPUT_COLUMNS if config.actor_rollout_ref.rollout.multi_turn.enable else ()
        self._reward_extra_keys: set[str] = set()  # per-sample values the reward function returned
        self.background_reward = BackgroundReward(reward_fn) if config.reward_model.launch_reward_fn_async else None
        # on a fully on-policy step the update's own forward pass gives the old log-probs
        self.fuse_old_log_prob = not dataflow.old_log_prob_blockers(config)

    # ----- the loop ------------------------------------------------------------------------------------
    def fit(self) -> list[dict[str, float]]:
        """Train for `total_steps` steps; returns every step's metrics (also sent to the loggers)."""
        cfg = self.config.trainer
        tracker = Tracking(cfg.project_name, cfg.experiment_name, cfg.logger, config=asdict(self.config),
                           log_dir=cfg.default_local_dir)
        bar = None
        try:
            resumed = self._load_checkpoint()
            # a rollout pool of its own starts from the model's files: it takes the (resumed) actor's weights
            self.groups.sync_rollout_weights(self.global_steps)
            if self.ahead is not None and self._restored is not None:
                self.ahead.restore(self._restored)
                self._restored = None
            if self.config.async_training.mode == "streaming":
                self.streamer = Streamer(self._stream_generate, self.groups.rollout.world_size, self._draw_prompts,
                                         self.stream_settings())
                self.streamer.start(self._stream_restored)
                self._stream_restored = None
            # metrics.jsonl keeps one line per step: lines of steps this run trains again move aside
            tracker.rewind(self.global_steps if resumed else -1)
            if self.validator and cfg.val_before_train:
                self._log(tracker, self.validator.run(self.global_steps))
            if cfg.val_only:
                return self.history
            bar = StepProgress(self.total_steps, initial_step=self.global_steps)
            while self.global_steps < self.total_steps:
                self.global_steps += 1
                metrics = self.train_step()
                healthy = self.guard.check(self.global_steps, metrics, log=partial(self._log, tracker, metrics))
                metrics.update(self._periodic(save=healthy))
                self._log(tracker, metrics)
                bar.update(self.global_steps, metrics)
        finally:
            for part in (bar, self.background_reward, self.ahead, self.streamer):
                if part is not None:
                    part.close()
            tracker.finish()
        return self.history

    def train_step(self) -> dict[str, float]:
        """One PPO/GRPO step: stages 1-8 of docs/architecture.md, "One PPO step"."""
        metrics: dict[str, float] = {}
        timing: dict[str, float] = {}
        self.costs.start_step()
        with timer("step", timing):
            batch = self._next_batch(metrics, timing)  # 1, 2, 4: prompts, responses, scores
            if self.config.trainer.balance_batch:  # 3, a group's rows on one rank if its prompt is computed once
                metrics.update(dataflow.balance_batch(batch, self.groups.world_size,
                                                      self.config.actor_rollout_ref.model.share_prompt_forward))
            pending = self._score_in_background(batch, timing)  # 4, while 5 runs
            self._recompute(batch, metrics, timing)  # 5: old/ref log-probs, values
            self._correct_rollout(batch, metrics)  # 5b: IS weights and rejection of the rollout's tokens
            if pending is not None:
                with timer("reward_wait", timing):
                    self._attach_scores(batch, pending.result(), metrics)
            self._apply_kl(batch, metrics)  # 6
            with timer("adv", timing):
                batch = self._compute_advantage(batch, metrics)  # 7
            if self.groups.critic is not None:  # 8
                output = self._run("update_critic", self.groups.critic.update_critic, batch, timing)
                metrics.update(reduce_metrics(output.meta_info["metrics"]))
            self._update_actor(batch, metrics, timing)
            if self.streamer is not None:
                self._sync_streaming(metrics)
            elif self.ahead is None:  # split: the rollout pool's copy (one step off: at the next step's start)
                metrics.update(self.groups.sync_rollout_weights(self.global_steps))
        self._dump_rollouts(batch)
        update = getattr(self.sampler, "update", None)
        if callable(update):  # a curriculum sampler (data.sampler) sees every trained batch, as in verl
            with self._data_lock:
                update(batch=batch)
        metrics.update(compute_data_metrics(batch, use_critic=self.groups.critic is not None))
        metrics.update(compute_agent_metrics(batch))
        metrics.update(compute_timing_metrics(batch, timing))
        metrics.update(compute_throughput_metrics(batch, timing, n_workers=self.groups.total_processes))
        metrics.update(self.costs.mfu_metrics())
        metrics.update(compute_memory_metrics(self.groups.process_memory()))
        return metrics

    # ----- stages --------------------------------------------------------------------------------------
    def _next_prompts(self) -> DataProto:
        with self._data_lock:
            batch = next(self._batches, None) if self._batches is not None else None
            if batch is None:  # the first step, or an epoch boundary: the sampler has moved on to the next epoch's order
                self._batches = iter(self.dataloader)
                batch = next(self._batches)
        return dataflow.new_prompt_batch(batch)

    def stream_settings(self) -> StreamSettings:
        async_cfg, rollout = self.config.async_training, self.config.actor_rollout_ref.rollout
        return StreamSettings(step_prompts=self.config.data.train_batch_size,
                              sync_every=async_cfg.trigger_parameter_sync_step,
                              staleness_threshold=async_cfg.staleness_threshold, partial=async_cfg.partial_rollout,
                              n=rollout.n, prompts_per_rank=max(1, rollout.max_num_seqs // rollout.n))

    def _stream_generate(self, prompts: list[DataProto | None], max_steps: int,
                         partial: bool) -> list[DataProto | None]:
        ranks = len(prompts)
        return self.groups.rollout.stream_generate(prompts, [max_steps] * ranks, [partial] * ranks)

    def _draw_prompts(self, count: int) -> DataProto:
        """Streaming: the next `count` prompts, from what a checkpoint saved first, then the loader."""
        with self._data_lock:
            while self._stream_prompts is None or len(self._stream_prompts) < count:
                drawn = self._next_prompts()
                self._stream_prompts = drawn if self._stream_prompts is None else \
                    DataProto.concat([self._stream_prompts, drawn])
            out = self._stream_prompts.select_rows(list(range(count)))
            rest = len(self._stream_prompts) - count
            self._stream_prompts = self._stream_prompts.select_rows(list(range(count, count + rest))) if rest else None
        return out

    def _take_streamed(self, metrics: dict, timing: dict, step: int) -> DataProto:
        taken = self.streamer.take(self.config.data.train_batch_size, version=step - 1)
        batch = taken.batch
        timing["trainer_idle"], timing["rollout_idle"] = taken.trainer_idle_s, taken.rollout_idle_s
        lag = staleness(batch, step - 1).float()
        versions = batch.batch["rollout_versions"]
        spans = versions.max(dim=1).values - batch.batch["weight_version"]  # versions a row's tokens span
        metrics.update({"async/staleness_mean": float(lag.mean()), "async/staleness_max": float(lag.max()),
                        "async/queue_size": self.streamer.queue_size, "async/stale_dropped": taken.dropped,
                        "async/partial_share": float((spans > 0).float().mean()),
                        "rollout/weight_staleness": float(lag.max())})
        if self.background_reward is None:  # else scored after balancing, in the background
            with timer("reward", timing):
                self._score(batch, metrics)
        return batch

    def _sync_streaming(self, metrics: dict) -> None:
        """Streaming, every trigger_parameter_sync_step steps: the rollout takes this step's weights."""
        settings = self.streamer.settings
        if self.global_steps % settings.sync_every:
            return
        start = time.perf_counter()
        with self.streamer.paused(drain=not settings.partial, new_window=True):
            metrics["timing_s/sync_drain"] = time.perf_counter() - start  # the trainer waiting for the rows in flight
            metrics.update(self.groups.sync_rollout_weights(self.global_steps))

    def _next_batch(self, metrics: dict, timing: dict) -> DataProto:
        """1, 2, 4: generated now (sync), or taken from the background, which then starts on the next batch."""
        step = self.global_steps
        if self.streamer is not None:
            return self._take_streamed(metrics, timing, step)
        if self._restored is not None and self._restored.step == step:  # generated before the checkpoint
            batch = self._use_collected(self._restored, metrics, timing)
            self._restored = None
        elif self.ahead is None:
            batch = self._collect_batch(metrics, timing, step, self.costs)
        else:
            if not self.ahead.holds(step):  # the run's first step
                self.ahead.start(step)
            taken = self.ahead.take()
            batch = self._use_collected(taken.collected, metrics, timing)
            timing["trainer_idle"], timing["rollout_idle"] = taken.trainer_idle_s, taken.rollout_idle_s
            metrics.update(self.groups.sync_rollout_weights(step - 1))
            if step < self.total_steps:
                self.ahead.start(step + 1)
            metrics["async/queue_size"] = self.ahead.in_flight
        version = metrics.get("rollout/weight_version")
        if version is not None:  # a rollout pool of its own: updates between the sampling weights and these
            staleness = step - 1 - version
            metrics["rollout/weight_staleness"] = staleness
            if self.ahead is not None:  # every row of a batch was sampled with one version
                metrics["async/staleness_mean"] = metrics["async/staleness_max"] = staleness
        return batch

    def _collect_ahead(self, step: int) -> Collected:
        metrics: dict[str, float] = {}
        timing: dict[str, float] = {}
        costs = StageCosts(self.costs.passes)
        batch = self._collect_batch(metrics, timing, step, costs)
        return Collected(step, batch, metrics, timing, dict(costs.flops), dict(costs.seconds))

    def _use_collected(self, collected: Collected, metrics: dict, timing: dict) -> DataProto:
        metrics.update(collected.metrics)
        for stage, seconds in collected.timing.items():
            timing[stage] = timing.get(stage, 0.0) + seconds
        self.costs.add(collected.flops, collected.seconds)
        return collected.batch

    def _collect_batch(self, metrics: dict, timing: dict, step: int, costs: StageCosts) -> DataProto:
        """Generate and score the batch of `step` until it is full (several rounds only with filter_groups)."""
        groups_cfg = self.config.algorithm.filter_groups
        want = self.config.data.train_batch_size
        kept, prompts, rounds = [], 0, 0
        while True:
            rounds += 1
            batch = self._generate(self._next_prompts(), metrics, timing, step, costs)
            if self.background_reward is not None:  # scored after balancing, in the background
                return batch
            with timer("reward", timing):
                self._score(batch, metrics)
            if not groups_cfg.enable:
                return batch
            batch, n_prompts = dataflow.keep_varied_groups(batch, groups_cfg.metric)
            kept.append(batch)
            prompts += n_prompts
            if prompts >= want:
                metrics["train/num_gen_batches"] = rounds
                n = self.config.actor_rollout_ref.rollout.n  # rows stay grouped by prompt, n at a time
                return DataProto.concat(kept).select_rows(slice(0, want * n))
            if 0 < groups_cfg.max_num_gen_batches <= rounds:
                raise RuntimeError(
                    f"after {rounds} generation rounds only {prompts} of {want} prompts had samples with "
                    f"different scores; the data may be too hard or too easy. Raise "
                    f"algorithm.filter_groups.max_num_gen_batches (0 = no limit) or disable filter_groups"
                )

    def _generate(self, batch: DataProto, metrics: dict, timing: dict, step: int, costs: StageCosts) -> DataProto:
        gen_input = dataflow.split_generation_input(batch, self.rollout_columns)
        gen_input.meta_info["seed"] = self.config.actor_rollout_ref.rollout.seed + step
        with timer("gen", timing):
            generated = self.groups.rollout.generate_sequences(gen_input)
        costs.record("gen", generated, real_tokens(generated), timing)
        version = generated.meta_info.pop("weight_version", None)
        if version is not None:  # a rollout pool of its own: the update its weights came from
            metrics["rollout/weight_version"] = version
        if "reward_baselines" in self.estimator.required_inputs:
            with timer("gen_baseline", timing):
                batch.batch["reward_baselines"] = self._greedy_baseline(batch, gen_input, timing, costs)
        return dataflow.attach_responses(batch, generated)

    def _greedy_baseline(self, batch: DataProto, gen_input: DataProto, timing: dict,
                         costs: StageCosts) -> torch.Tensor:
        """ReMax's baseline: the score of each prompt's greedy response, (prompts,)."""
        greedy_input = gen_input.select(deepcopy=False)
        greedy_input.meta_info = {"do_sample": False}
        generated = self.groups.rollout.generate_sequences(greedy_input)
        costs.record("gen_baseline", generated, real_tokens(generated), timing)
        greedy = dataflow.attach_responses(batch.select(deepcopy=True), generated)
        self._score(greedy, {})
        return dataflow.sequence_scores(greedy)

    def _score(self, batch: DataProto, metrics: dict) -> None:
        """4. Model and rule scores -> `token_level_scores` (the score on each row's last valid token)."""
        if self.groups.reward_model is not None:
            batch.union(self.groups.reward_model.compute_rm_score(batch))
        self._attach_scores(batch, self.reward_fn(batch, return_dict=True), metrics)

    def _score_in_background(self, batch: DataProto, timing: dict) -> Future | None:
        """4. with launch_reward_fn_async: the model scores now, the rule-based ones in a background thread."""
        if self.background_reward is None:
            return None
        with timer("reward", timing):
            if self.groups.reward_model is not None:
                batch.union(self.groups.reward_model.compute_rm_score(batch))
            return self.background_reward.submit(batch)

    def _attach_scores(self, batch: DataProto, result: dict, metrics: dict) -> None:
        add_reward_metrics(metrics, result.get("reward_metrics", {}))
        batch.batch["token_level_scores"] = result["reward_tensor"]
        for key, values in result.get("reward_extra_info", {}).items():
            batch.non_tensor_batch[key] = np.array(values, dtype=object)
            self._reward_extra_keys.add(key)

    def _recompute(self, batch: DataProto, metrics: dict, timing: dict) -> None:
        """5. The actor's old log-probs (unless the update gives them), the reference's, the critic's values."""
        self._old_log_probs(batch, metrics, timing)
        if self.groups.uses_reference:
            batch.union(self._run("ref", self.groups.actor_rollout.compute_ref_log_prob, batch, timing))
        if self.groups.critic is not None:
            batch.union(self._run("values", self.groups.critic.compute_values, batch, timing))

    def _run(self, stage: str, call: Callable[[DataProto], DataProto], batch: DataProto, timing: dict) -> DataProto:
        """One worker call on the step's batch: its time under `stage`, its FLOPs over the batch's real tokens."""
        with timer(stage, timing):
            output = call(batch)
        self.costs.record(stage, output, real_tokens(batch), timing)
        return output

    def _old_log_probs(self, batch: DataProto, metrics: dict, timing: dict) -> None:
        """5. `old_log_probs`: the actor's pass; the rollout's in bypass mode; or, fused, none yet (the update's)."""
        metrics["actor/old_log_prob_fused"] = float(self.fuse_old_log_prob)
        if self.config.algorithm.rollout_correction.bypass_mode:
            dataflow.bypass_old_log_probs(batch)
            return
        if self.fuse_old_log_prob:
            return
        old = self._run("old_log_prob", self.groups.actor_rollout.compute_log_prob, batch, timing)
        metrics["actor/entropy"] = float(masked_mean(old.batch.pop("entropys"), batch.batch["response_mask"]))
        batch.union(old)
        self._rollout_agreement(batch, metrics)

    def _correct_rollout(self, batch: DataProto, metrics: dict) -> None:
        """5b. Decoupled rollout correction: `rollout_is_weights` and the response_mask less rejected tokens."""
        correction = self.config.algorithm.rollout_correction
        if correction.decoupled:  # bypass mode corrects inside the actor's loss instead
            metrics.update(dataflow.correct_rollout(batch, correction))

    def _apply_kl(self, batch: DataProto, metrics: dict) -> None:
        """6. KL in the reward (PPO) or plain scores (GRPO puts KL in the actor's loss instead)."""
        algo = self.config.algorithm
        if not algo.use_kl_in_reward:
            batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
            return
        rewards, kl_metrics = apply_kl_penalty(
            batch.batch["token_level_scores"], batch.batch["old_log_probs"], batch.batch["ref_log_prob"],
            batch.batch["response_mask"], self.kl_ctrl, algo.kl_penalty,
        )
        batch.batch["token_level_rewards"] = rewards
        metrics.update(kl_metrics)

    def _compute_advantage(self, batch: DataProto, metrics: dict) -> DataProto:
        """7. Advantages and returns; with PF-PPO, the batch redrawn (seeded by the step, so a resume redraws it)."""
        algo = self.config.algorithm
        dataflow.compute_advantage(batch, algo.adv_estimator, algo)
        if not algo.use_pf_ppo:
            return batch
        generator = torch.Generator().manual_seed(self.config.actor_rollout_ref.rollout.seed + self.global_steps)
        tagged = batch.select()  # the same tensors under a new DataProto: the row tag stays off `batch`
        tagged.batch["pf_ppo_row"] = torch.arange(len(batch))
        resampled = compute_pf_ppo_reweight_data(tagged, algo.pf_ppo.reweight_method, algo.pf_ppo.weight_pow,
                                                 generator)
        drawn = resampled.batch.pop("pf_ppo_row")
        metrics["train/pf_ppo_distinct_rows"] = drawn.unique().numel() / len(resampled)  # share kept at least once
        return resampled

    def _update_actor(self, batch: DataProto, metrics: dict, timing: dict) -> None:
        """8. The policy update, once the critic has warmed up (`trainer.critic_warmup` steps)."""
        if self.config.trainer.critic_warmup <= self.global_steps:
            batch.meta_info["fuse_old_log_prob"] = self.fuse_old_log_prob
            correction = self.config.algorithm.rollout_correction
            if correction.bypass_mode:
                batch.meta_info["bypass_correction"] = correction
            output = self._run("update_actor", self.groups.actor_rollout.update_actor, batch, timing)
            metrics.update(dataflow.bypass_metric_names(reduce_metrics(output.meta_info["metrics"])))
            if self.fuse_old_log_prob:  # the update's forward pass gave them
                batch.union(output.select(batch_keys=["old_log_probs"], meta_info_keys=[]))
                self._rollout_agreement(batch, metrics)

    def _rollout_agreement(self, batch: DataProto, metrics: dict) -> None:
        if self.config.actor_rollout_ref.rollout.calculate_log_probs:
            metrics.update(compute_rollout_agreement_metrics(batch))

    # ----- validation, checkpoints, logging ------------------------------------------------------------
    def _periodic(self, save: bool = True) -> dict[str, float]:
        """9. Validate and checkpoint every test_freq / save_freq steps and at the end (no checkpoint if not `save`)."""
        cfg = self.config.trainer
        last = self.global_steps == self.total_steps
        metrics = {}
        if self.validator and cfg.test_freq > 0 and (self.global_steps % cfg.test_freq == 0 or last):
            with self._rollout_holds_latest_weights():
                metrics.update(self.validator.run(self.global_steps))
        if cfg.save_freq > 0 and (self.global_steps % cfg.save_freq == 0 or last):
            if not save:
                print(f"step {self.global_steps} is not checkpointed: its update was skipped")
                return metrics
            with timer("timing_s/save_checkpoint", metrics):
                self.save_checkpoint()
        return metrics

    @contextlib.contextmanager
    def _rollout_holds_latest_weights(self) -> Iterator[None]:
        """For validating: the rollout pool idle (generated ahead, or parked) and holding this step's weights."""
        if self.ahead is not None:
            self.ahead.settle()
        streamer = self.streamer
        parked = contextlib.nullcontext() if streamer is None else streamer.paused(drain=not streamer.settings.partial)
        with parked:
            self.groups.sync_rollout_weights(self.global_steps)
            yield

    def save_checkpoint(self) -> Path:
        cfg = self.config.trainer
        step_dir = Path(cfg.default_local_dir) / f"global_step_{self.global_steps}"
        check_uncommitted(step_dir)
        self.groups.actor_rollout.save_checkpoint(str(step_dir / "actor"), None, self.global_steps,
                                                  cfg.max_actor_ckpt_to_keep)
        if self.groups.critic is not None:
            self.groups.critic.save_checkpoint(str(step_dir / "critic"), None, self.global_steps,
                                               cfg.max_critic_ckpt_to_keep)
        # one step off, the batch generated ahead is saved with the loader state past its prompts: a resume trains it
        ahead = self.ahead.settle() if self.ahead is not None else None
        with self._streaming_state() as streaming, self._data_lock:
            loader_state = self.dataloader.state_dict()
        torch.save({"dataloader": loader_state, "kl_coef": self.kl_ctrl.value, "global_steps": self.global_steps,
                    "generated_ahead": ahead, "streaming": streaming}, step_dir / "data.pt")
        write_run_config(step_dir, asdict(self.config))
        commit_checkpoint(cfg.default_local_dir, self.global_steps)
        return step_dir

    @contextlib.contextmanager
    def _streaming_state(self) -> Iterator[dict[str, DataProto | None] | None]:
        """Streaming, for a checkpoint: the groups not yet trained and the prompts drawn but unfinished; else None."""
        if self.streamer is None:
            yield None
            return
        with self.streamer.paused(drain=False):
            unfinished = [p for p in self.groups.rollout.stream_unfinished() if p is not None]
            with self._data_lock:
                if self._stream_prompts is not None:
                    unfinished.append(self._stream_prompts)
            yield {"queued": self.streamer.queued(), "prompts": DataProto.concat(unfinished) if unfinished else None}

    def _load_checkpoint(self) -> bool:
        """Resume as trainer.resume_mode says, past checkpoints that fail to load; True if resumed."""
        cfg = self.config.trainer
        candidates = resume_candidates(cfg.resume_mode, cfg.default_local_dir, cfg.resume_from_path)
        step_dir = load_newest_loadable(candidates, self._load_from, fallback=cfg.resume_mode == "auto")
        if cfg.save_freq > 0:
            check_no_committed_after(cfg.default_local_dir, self.global_steps)
        if step_dir is not None:
            print(f"resumed from {step_dir} at step {self.global_steps}")
        return step_dir is not None

    def _load_from(self, step_dir: Path) -> None:
        self.groups.actor_rollout.load_checkpoint(str(step_dir / "actor"))
        if self.groups.critic is not None:
            self.groups.critic.load_checkpoint(str(step_dir / "critic"))
        state = load_state_file(step_dir / "data.pt", weights_only=False)
        changes = report_config_changes(step_dir, asdict(self.config))
        self.dataloader.load_state_dict(state["dataloader"])
        # the adaptive controller's coefficient is state, but a kl_coef or type given anew on resume wins
        if not changes.keys() & {"algorithm.kl_ctrl.kl_coef", "algorithm.kl_ctrl.type"}:
            self.kl_ctrl.value = state["kl_coef"]
        self.global_steps = state["global_steps"]
        self._restored = state.get("generated_ahead")
        streaming = state.get("streaming") or {}
        self._stream_restored, self._stream_prompts = streaming.get("queued"), streaming.get("prompts")

    def _dump_rollouts(self, batch: DataProto) -> None:
        out_dir = self.config.trainer.rollout_data_dir
        if not out_dir:
            return
        extra = {key: list(batch.non_tensor_batch[key]) for key in sorted(self._reward_extra_keys)
                 if key in batch.non_tensor_batch}
        records = generation_records(batch, self.tokenizer, dataflow.sequence_scores(batch).tolist(), extra,
                                     self.config.data.reward_fn_key)
        write_generations(out_dir, self.global_steps, records)

    def _log(self, tracker: Tracking, metrics: dict[str, float]) -> None:
        metrics = {"training/global_step": self.global_steps, "training/time": time.time(), **metrics}
        tracker.log(metrics, step=self.global_steps)
        self.history.append(metrics)
