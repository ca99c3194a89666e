"""Entry point: `python -m hybridrl.trainer.main_sft key=value ...` (Hydra, config `sft_trainer.yaml`), on Ray
or one in-process rank (`trainer.backend=local`)."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from hybridrl.controller import ClassWithInitArgs, ray_for_backend, sigterm_raises_exit
from hybridrl.trainer.command_line import verl_overrides
from hybridrl.trainer.placement import Pool
from hybridrl.trainer.sft_config import SFTSchema
from hybridrl.trainer.sft_trainer import SFTTrainer, load_data, validate_config
from hybridrl.trainer.worker_groups import start_pool
from hybridrl.workers.sft_worker import SFTWorker


def run_sft(config: DictConfig) -> dict[str, float]:
    """Validate the config, train, and release the workers (and a Ray it started); returns the last step's metrics."""
    config = validate_config(config)
    data = load_data(config)  # a bad row fails here, before Ray starts
    trainer = config.trainer
    with sigterm_raises_exit(), ray_for_backend(trainer.backend, num_cpus=config.ray_init.num_cpus):
        pool = Pool("sft", trainer.nnodes, trainer.n_gpus_per_node, ("sft",))
        started = start_pool(pool, ClassWithInitArgs(SFTWorker, config), trainer.backend, trainer.device)
        try:
            return SFTTrainer(config, started.processes, data).fit()
        finally:
            started.stop()


@hydra.main(config_path="config", config_name="sft_trainer", version_base=None)
def hydra_main(config: DictConfig) -> None:
    run_sft(config)


def main() -> None:
    """The command line as verl reads it (blank arguments dropped, `+key` on a declared key), then Hydra."""
    sys.argv[1:] = verl_overrides(sys.argv[1:], SFTSchema)
    hydra_main()


if __name__ == "__main__":
    main()
