"""Entry point: `python -m hybridrl.trainer.main_ppo key=value ...` (or `hybridrl-train key=value ...`): resolves
the config, starts or joins Ray (unless trainer.backend=local), trains, and stops what it started."""

from __future__ import annotations

import os
import sys
from dataclasses import asdict
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from hybridrl.controller import ray_for_backend, sigterm_raises_exit
from hybridrl.trainer.command_line import register_config_search_path, verl_overrides
from hybridrl.trainer.config_checks import batch_plan, bounds_read_as_numbers, resolve_config
from hybridrl.trainer.ppo_config import PPOTrainerConfig
from hybridrl.utils.typed_config import ConfigError


def run_ppo(cfg: DictConfig) -> list[dict[str, float]]:
    """Train with a composed config; returns every step's metrics."""
    from hybridrl.data.rl_dataset import build_rl_dataset, collate_fn
    from hybridrl.models.loading import load_tokenizer
    from hybridrl.rewards.scorers import check_code_sandbox
    from hybridrl.trainer.dataflow import load_reward_manager
    from hybridrl.trainer.placement import describe, placement
    from hybridrl.trainer.ppo_trainer import PPOTrainer
    from hybridrl.trainer.worker_groups import WorkerGroups

    loaded: dict[str, Any] = {}  # what train_rows loads: the tokenizer and the datasets

    def train_rows(checked: PPOTrainerConfig) -> int:
        model = checked.actor_rollout_ref.model
        # data.tokenizer, when set, is the model's tokenizer_path (fill_derived): the workers load the same one
        tokenizer = load_tokenizer(model.tokenizer_path or model.path,
                                   trust_remote_code=checked.data.trust_remote_code or model.trust_remote_code)
        # every row is checked here, before Ray starts; rule-based rewards need each row's ground truth
        needs_truth = not checked.reward_model.enable
        loaded["tokenizer"] = tokenizer
        loaded["train"] = build_rl_dataset(checked.data.train_files, tokenizer, checked.data,
                                           require_ground_truth=needs_truth)
        loaded["val"] = build_rl_dataset(checked.data.val_files, tokenizer, checked.data,
                                         require_ground_truth=needs_truth) if checked.data.val_files else None
        return len(loaded["train"])

    config = resolve_config(cfg, None if cfg.trainer.dry_run else train_rows)  # a dry run loads no data
    if config.trainer.dry_run:
        print(OmegaConf.to_yaml(OmegaConf.structured(config)))
        print("batch arithmetic:")
        for name, value in batch_plan(config).items():
            print(f"  {name:<42} {value}")
        print(describe(config))
        return []
    tokenizer, train_dataset, val_dataset = loaded["tokenizer"], loaded["train"], loaded["val"]
    if not (config.custom_reward_function.path or config.reward_model.enable):
        # before Ray: code tasks need a sandbox here (a custom reward function raises itself when it needs one)
        check_code_sandbox((row.get(config.data.reward_fn_key) for dataset in (train_dataset, val_dataset)
                            if dataset is not None for row in getattr(dataset, "rows", ())),
                           config.reward_model.sandbox.limits())
    plain = asdict(config)
    reward_fn = load_reward_manager(plain, tokenizer, num_examine=0)
    val_reward_fn = load_reward_manager(plain, tokenizer, num_examine=1)
    ri = config.ray_init
    # a local cluster big enough for every pool's processes on this one node
    processes = sum(pool.processes_per_node for pool in placement(config))
    num_cpus = ri.num_cpus or max(os.cpu_count() or 1, processes * ri.cpus_per_worker)
    # the workers, and a Ray this run started, end with the run: on success, on an error and on SIGTERM
    with sigterm_raises_exit(), ray_for_backend(config.trainer.backend, num_cpus=num_cpus,
                                                  object_store_memory=ri.object_store_memory,
                                                  include_dashboard=ri.include_dashboard):
        groups = WorkerGroups.create(config)
        try:
            trainer = PPOTrainer(config, tokenizer, groups, reward_fn, val_reward_fn, train_dataset, val_dataset,
                                 collate_fn)
            return trainer.fit()
        finally:
            groups.shutdown()
            reward_fn.close()  # the reward functions' worker processes
            val_reward_fn.close()


@hydra.main(config_path="config", config_name="ppo_trainer", version_base=None)
def hydra_main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    misread = bounds_read_as_numbers(list(HydraConfig.get().overrides.task))
    if misread:
        raise ConfigError("; ".join(misread))
    run_ppo(cfg)


def main() -> None:
    """The command line as verl reads it (command_line.py), then Hydra."""
    sys.argv[1:] = verl_overrides(sys.argv[1:], PPOTrainerConfig)
    register_config_search_path()
    hydra_main()


if __name__ == "__main__":
    main()
