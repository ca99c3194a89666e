"""Offline generation: `python -m hybridrl.trainer.main_generation key=value ...` (config `generation.yaml`):
`data.n_samples` responses per prompt, added as a `responses` column. A pool of rollout ranks
(`trainer.nnodes` x `trainer.n_gpus_per_node`, on Ray or one rank in this process) splits every batch, each rank
a whole copy of the model: the rollout pool of a split PPO run, started on its own."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
import pyarrow as pa
import pyarrow.parquet as pq
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import DataLoader

from hybridrl.controller import ClassWithInitArgs, ray_for_backend, sigterm_raises_exit
from hybridrl.data.rl_dataset import RLHFDataset, collate_fn
from hybridrl.models.loading import load_tokenizer
from hybridrl.protocol import DataProto, pad_dataproto_to_divisor, unpad_dataproto
from hybridrl.trainer.command_line import verl_overrides, yaml_keys
from hybridrl.trainer.config_rules import ROLLOUT, no_effect_warnings
from hybridrl.trainer.placement import Pool, check_backend
from hybridrl.trainer.ppo_config import PPOTrainerConfig
from hybridrl.trainer.worker_groups import ActorRolloutRefGroup, start_pool
from hybridrl.utils.device import emulated_bf16_warning
from hybridrl.workers.config import ActorRolloutRefConfig, ModelConfig, to_dataclass
from hybridrl.workers.fsdp_workers import ActorRolloutRefWorker
from hybridrl.workers.rollout import RolloutConfig

logger = logging.getLogger(__name__)

# generation.yaml's `rollout` group: the dataclass is the one home of the rollout's defaults.
ConfigStore.instance().store(group="rollout", name="schema", node=RolloutConfig)


def check_config(config: DictConfig) -> RolloutConfig:
    """The rollout settings for this run, after checking the keys generation depends on."""
    check_backend(config.trainer)
    rollout = to_dataclass(RolloutConfig, OmegaConf.merge(config.rollout, {"n": config.data.n_samples}))
    warnings = [emulated_bf16_warning("rollout.dtype", rollout.dtype, config.trainer.device), *no_effect(rollout)]
    for warning in filter(None, warnings):
        logger.warning(warning)
    if rollout.n > 1 and (not rollout.do_sample or rollout.temperature == 0):
        raise ValueError(
            f"data.n_samples={rollout.n} needs sampling: set rollout.do_sample=true and rollout.temperature > 0 "
            f"(greedy decoding gives {rollout.n} identical responses)"
        )
    return rollout


def no_effect(rollout: RolloutConfig) -> list[str]:
    """The PPO trainer's warnings for rollout keys that act nowhere in this run (e.g. vLLM's with the HF engine),
    named by generation's keys."""
    ppo = PPOTrainerConfig()
    ppo.actor_rollout_ref.rollout = rollout
    return [warning.replace(f"{ROLLOUT}.", "rollout.") for warning in no_effect_warnings(ppo) if ROLLOUT in warning]


def generate_responses(group: ActorRolloutRefGroup, dataset: RLHFDataset, batch_size: int,
                       tokenizer) -> list[list[str]]:
    """n decoded responses (special tokens removed) for every dataset row, in row order; each batch is padded to
    a multiple of the pool's ranks with copies of its rows, whose responses are dropped."""
    results: list[list[str]] = []
    for items in DataLoader(dataset, batch_size=batch_size, collate_fn=collate_fn):
        prompts = DataProto.from_dict({k: items[k] for k in ("input_ids", "attention_mask", "position_ids")})
        padded, pad_size = pad_dataproto_to_divisor(prompts, group.group.world_size)
        out = group.generate_sequences(padded)
        n = len(out) // len(padded)
        out = unpad_dataproto(out, pad_size * n)  # rows are grouped by prompt, in prompt order
        texts = [
            tokenizer.decode(ids[mask.bool()], skip_special_tokens=True)
            for ids, mask in zip(out.batch["responses"], out.batch["response_mask"], strict=True)
        ]
        results += [texts[i : i + n] for i in range(0, len(texts), n)]
    return results


def run_generation(config: DictConfig) -> Path:
    """Generate for every row of data.path and write data.output_path; returns the output path."""
    rollout_config = check_config(config)
    trainer = config.trainer
    model_path = Path(config.model.path).expanduser()
    tokenizer = load_tokenizer(model_path, trust_remote_code=config.model.trust_remote_code)
    dataset = RLHFDataset(
        config.data.path,
        tokenizer,
        {"prompt_key": config.data.prompt_key, "max_prompt_length": rollout_config.prompt_length,
         "truncation": config.data.truncation},
    )
    # the rollout role's settings: generation's model and rollout keys in PPO's `actor_rollout_ref` layout
    model = to_dataclass(ModelConfig, {"path": str(model_path), "trust_remote_code": config.model.trust_remote_code,
                                       "external_lib": config.model.external_lib})
    worker = ClassWithInitArgs(ActorRolloutRefWorker, ActorRolloutRefConfig(hybrid_engine=False, model=model,
                                                                            rollout=rollout_config), "rollout")
    with sigterm_raises_exit(), ray_for_backend(trainer.backend, num_cpus=config.ray_init.num_cpus):
        pool = Pool("rollout", trainer.nnodes, trainer.n_gpus_per_node, ("rollout",))
        started = start_pool(pool, worker, trainer.backend, trainer.device)
        try:
            group = ActorRolloutRefGroup(started.processes)
            group.init_model()
            responses = generate_responses(group, dataset, config.data.batch_size, tokenizer)
        finally:
            started.stop()
    table = pq.read_table(Path(config.data.path).expanduser())
    if "responses" in table.column_names:
        table = table.drop_columns(["responses"])
    table = table.append_column("responses", pa.array(responses, type=pa.list_(pa.string())))
    output = Path(config.data.output_path).expanduser()
    output.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, output)
    print(f"wrote {len(responses)} rows x {rollout_config.n} responses to {output}")
    return output


@hydra.main(config_path="config", config_name="generation", version_base=None)
def hydra_main(config: DictConfig) -> None:
    run_generation(config)


def main() -> None:
    """The command line as verl reads it (blank arguments dropped, `+key` on a declared key), then Hydra."""
    sys.argv[1:] = verl_overrides(sys.argv[1:], yaml_keys("generation", rollout=RolloutConfig))
    hydra_main()


if __name__ == "__main__":
    main()
