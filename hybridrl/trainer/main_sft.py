"""Entry point: `python -m hybridrl.trainer.main_sft key=value ...` (Hydra, config `sft_trainer.yaml`), on Ray
or one in-process rank (`trainer.backend=local`); verl's `torchrun ... -m` launch works too (`from_torchrun`)."""

from __future__ import annotations

import os
import sys

import hydra
from omegaconf import DictConfig

from hybridrl.controller import ClassWithInitArgs, ray_for_backend, sigterm_raises_exit
from hybridrl.trainer.command_line import verl_overrides
from hybridrl.trainer.placement import Pool
from hybridrl.trainer.sft_config import SFTSchema
from hybridrl.trainer.sft_trainer import SFTTrainer, load_data, validate_config
from hybridrl.trainer.worker_groups import start_pool
from hybridrl.utils.typed_config import ConfigError
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


# what torchrun sets for its workers; the driver's Ray workers must not inherit them
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                      "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT")


def from_torchrun(args: list[str]) -> list[str]:
    """verl starts its SFT trainer with `torchrun --nproc_per_node=N -m ...`, one process per rank. hybridrl's SFT
    is one driver over a pool of ranks, so under torchrun rank 0 drives a pool of N ranks (trainer.n_gpus_per_node=N)
    and the other processes exit at once. Returns the arguments rank 0 runs with (`args` outside torchrun)."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return args
    rank, per_node = int(os.environ["RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    nodes = int(os.environ["WORLD_SIZE"]) // per_node
    if rank != 0:
        print(f"main_sft under torchrun: rank 0 drives the run's {per_node} ranks; rank {rank} exits", file=sys.stderr)
        sys.exit(0)
    if nodes > 1:
        raise ConfigError(f"torchrun over {nodes} nodes: hybridrl's SFT runs ranks on several hosts through a Ray "
                          f"cluster. Start one (docs/multinode.md) and run `python -m hybridrl.trainer.main_sft "
                          f"trainer.nnodes={nodes} trainer.n_gpus_per_node={per_node} ...` on its head")
    for name in [n for n in os.environ if n in TORCHRUN_VARIABLES or n.startswith("TORCHELASTIC_")]:
        del os.environ[name]
    sizes = [arg.split("=", 1)[1] for arg in args if arg.lstrip("+").startswith("trainer.n_gpus_per_node=")]
    if any(size != str(per_node) for size in sizes):
        raise ConfigError(f"trainer.n_gpus_per_node={sizes[-1]} differs from torchrun's --nproc_per_node={per_node}: "
                          f"drop one of them")
    return args if sizes else [*args, f"trainer.n_gpus_per_node={per_node}"]


def main() -> None:
    """The command line as verl reads it (torchrun's processes, blank arguments dropped, `+key` on a declared
    key), then Hydra."""
    sys.argv[1:] = verl_overrides(from_torchrun(sys.argv[1:]), SFTSchema)
    hydra_main()


if __name__ == "__main__":
    main()
