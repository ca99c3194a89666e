"""Offline generation: `python -m hybridrl.trainer.main_generation key=value ...` (config `generation.yaml`):
`data.n_samples` responses per prompt, added as a `responses` column, on one rank in this process."""

from __future__ import annotations

import logging
from pathlib import Path

import hydra
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import DataLoader

from hybridrl.controller.decorator import on_device, to_cpu
from hybridrl.data.rl_dataset import RLHFDataset, collate_fn
from hybridrl.models.loading import load_causal_lm, load_tokenizer
from hybridrl.protocol import DataProto
from hybridrl.utils.device import (
    device_setting_problem,
    emulated_bf16_warning,
    local_device,
    pinned,
    resolve_device_type,
)
from hybridrl.workers.config import to_dataclass
from hybridrl.workers.rollout import BaseRollout, RolloutConfig, build_rollout

logger = logging.getLogger(__name__)

# generation.yaml's `rollout` group: the dataclass is the one home of the rollout's defaults.
ConfigStore.instance().store(group="rollout", name="schema", node=RolloutConfig)


def check_config(config: DictConfig) -> RolloutConfig:
    """The rollout settings for this run, after checking the keys generation depends on."""
    ranks = config.trainer.nnodes * config.trainer.n_gpus_per_node
    if ranks != 1:
        raise ValueError(
            f"main_generation runs on one rank in this process for now; got trainer.nnodes x "
            f"trainer.n_gpus_per_node = {ranks}. Set both to 1."
        )
    config.trainer.device = resolve_device_type(config.trainer.device)
    device_problem = device_setting_problem(config.trainer.device)
    if device_problem is not None:
        raise ValueError(device_problem)
    rollout = to_dataclass(RolloutConfig, OmegaConf.merge(config.rollout, {"n": config.data.n_samples}))
    warning = emulated_bf16_warning("rollout.dtype", rollout.dtype, config.trainer.device)
    if warning:
        logger.warning(warning)
    if rollout.n > 1 and (not rollout.do_sample or rollout.temperature == 0):
        raise ValueError(
            f"data.n_samples={rollout.n} needs sampling: set rollout.do_sample=true and rollout.temperature > 0 "
            f"(greedy decoding gives {rollout.n} identical responses)"
        )
    return rollout


def generate_responses(engine: BaseRollout, dataset: RLHFDataset, batch_size: int, tokenizer,
                       device: str | torch.device = "cpu") -> list[list[str]]:
    """n decoded responses (special tokens removed) for every dataset row, in row order, generated on `device`."""
    results: list[list[str]] = []
    for items in DataLoader(dataset, batch_size=batch_size, collate_fn=collate_fn):
        prompts = DataProto.from_dict({k: items[k] for k in ("input_ids", "attention_mask", "position_ids")})
        out = to_cpu(engine.generate_sequences(on_device(prompts, torch.device(device))))
        n = len(out) // len(prompts)
        texts = [
            tokenizer.decode(ids[mask.bool()], skip_special_tokens=True)
            for ids, mask in zip(out.batch["responses"], out.batch["response_mask"], strict=True)
        ]
        results += [texts[i : i + n] for i in range(0, len(texts), n)]  # rows are interleaved by prompt
    return results


def run_generation(config: DictConfig) -> Path:
    """Generate for every row of data.path and write data.output_path; returns the output path."""
    rollout_config = check_config(config)
    model_path = Path(config.model.path).expanduser()
    tokenizer = load_tokenizer(model_path, trust_remote_code=config.model.trust_remote_code)
    dataset = RLHFDataset(
        config.data.path,
        tokenizer,
        {"prompt_key": config.data.prompt_key, "max_prompt_length": rollout_config.prompt_length,
         "truncation": config.data.truncation},
    )
    # this process is its own worker, on trainer.device (`auto` dtypes and vLLM ask `hybridrl.utils.device`)
    with pinned(config.trainer.device), torch.no_grad():
        device = local_device()
        module = None
        if rollout_config.name == "hf":
            module = load_causal_lm(model_path, dtype=rollout_config.dtype,
                                    trust_remote_code=config.model.trust_remote_code).to(device)
        engine = build_rollout(rollout_config, module=module, tokenizer=tokenizer, model_path=model_path)
        responses = generate_responses(engine, dataset, config.data.batch_size, tokenizer, device=device)
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
def main(config: DictConfig) -> None:
    run_generation(config)


if __name__ == "__main__":
    main()
