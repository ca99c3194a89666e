"""Entry point: `python -m hybridrl.trainer.main_sft key=value ...` (Hydra, config `sft_trainer.yaml`), on Ray
or one in-process rank (`trainer.backend=local`)."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from hybridrl.controller import (
    ClassWithInitArgs,
    WorkerGroup,
    create_worker_group,
    ray_for_backend,
    sigterm_raises_exit,
)
from hybridrl.trainer.command_line import verl_overrides
from hybridrl.trainer.sft_config import SFTSchema
from hybridrl.trainer.sft_trainer import SFTTrainer, load_data, validate_config
from hybridrl.workers.sft_worker import SFTWorker


def build_worker_group(config: DictConfig) -> tuple[WorkerGroup, object | None]:
    """The SFT worker group and, under Ray (already started), its resource pool (to release afterwards)."""
    trainer = config.trainer
    if trainer.backend == "local":
        return create_worker_group("local", ClassWithInitArgs(SFTWorker, config), device=trainer.device), None
    from hybridrl.controller.ray import RayClassWithInitArgs, RayResourcePool

    pool = RayResourcePool(process_on_nodes=[trainer.n_gpus_per_node] * trainer.nnodes,
                           use_gpu=trainer.device == "cuda", name_prefix="sft")
    try:
        group = create_worker_group("ray", RayClassWithInitArgs(SFTWorker, config), resource_pool=pool,
                                    device=trainer.device)
    except BaseException:
        pool.remove()
        raise
    print(pool.placed())
    return group, pool


def run_sft(config: DictConfig) -> dict[str, float]:
    """Validate the config, train, and release the workers (and a Ray it started); returns the last step's metrics."""
    config = validate_config(config)
    data = load_data(config)  # a bad row fails here, before Ray starts
    with sigterm_raises_exit(), ray_for_backend(config.trainer.backend, num_cpus=config.ray_init.num_cpus):
        worker_group, pool = build_worker_group(config)
        try:
            return SFTTrainer(config, worker_group, data).fit()
        finally:
            worker_group.shutdown()
            if pool is not None:
                pool.remove()


@hydra.main(config_path="config", config_name="sft_trainer", version_base=None)
def hydra_main(config: DictConfig) -> None:
    run_sft(config)


def main() -> None:
    """The command line as verl reads it (blank arguments dropped, `+key` on a declared key), then Hydra."""
    sys.argv[1:] = verl_overrides(sys.argv[1:], SFTSchema)
    hydra_main()


if __name__ == "__main__":
    main()
