"""Entry point: `python -m hybridrl.trainer.main_sft key=value ...` (Hydra, config `sft_trainer.yaml`).

Starts (or joins) Ray and a worker group of `trainer.n_gpus_per_node x trainer.nnodes` SFT ranks, or
one in-process rank with `trainer.backend=local`, then runs the SFT loop.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from hybridrl.controller import ClassWithInitArgs, WorkerGroup, create_worker_group
from hybridrl.trainer.sft_trainer import SFTTrainer, validate_config
from hybridrl.workers.sft_worker import SFTWorker


def build_worker_group(config: DictConfig) -> tuple[WorkerGroup, object | None]:
    """The SFT worker group and, under Ray, its resource pool (to release afterwards)."""
    trainer = config.trainer
    if trainer.backend == "local":
        return create_worker_group("local", ClassWithInitArgs(SFTWorker, config)), None
    from hybridrl.controller.ray import RayClassWithInitArgs
    from hybridrl.controller.ray_resources import RayResourcePool, init_ray

    init_ray(num_cpus=config.ray_init.num_cpus)
    pool = RayResourcePool(process_on_nodes=[trainer.n_gpus_per_node] * trainer.nnodes,
                           use_gpu=trainer.device == "cuda")
    return create_worker_group("ray", RayClassWithInitArgs(SFTWorker, config), resource_pool=pool), pool


def run_sft(config: DictConfig) -> dict[str, float]:
    """Validate the config, train, and release the workers; returns the last step's metrics."""
    config = validate_config(config)
    worker_group, pool = build_worker_group(config)
    try:
        return SFTTrainer(config, worker_group).fit()
    finally:
        worker_group.shutdown()
        if pool is not None:
            pool.remove()


@hydra.main(config_path="config", config_name="sft_trainer", version_base=None)
def main(config: DictConfig) -> None:
    run_sft(config)


if __name__ == "__main__":
    main()
