"""The SFT loop on the driver: data order, steps, validation, metrics, and the final model directory; the
worker group's ranks split each global batch (`hybridrl.workers.sft_worker` has the loss)."""

from __future__ import annotations

import logging
import math
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import DataLoader, Dataset, Subset
from tqdm import tqdm

from hybridrl.controller import WorkerGroup
from hybridrl.data.sampler import ResumableSampler, StatefulDataLoader
from hybridrl.data.sft_dataset import SFTDataset
from hybridrl.models.loading import load_tokenizer
from hybridrl.models.lora import LoRASettings
from hybridrl.protocol import DataProto
from hybridrl.trainer.command_line import make_paths_absolute
from hybridrl.trainer.config_checks import report_config_changes, write_run_config
from hybridrl.trainer.metrics import DivergenceGuard
from hybridrl.trainer.placement import check_backend
from hybridrl.trainer.sft_config import SFTSchema
from hybridrl.trainer.worker_groups import SFTGroup
from hybridrl.utils.tracking import StepProgress, Tracking, parse_logger_backends
from hybridrl.utils.typed_config import added_keys, require, unknown_key_message
from hybridrl.workers.checkpoint import commit_checkpoint, load_state_file
from hybridrl.workers.checkpoint_resume import (
    check_no_committed_after,
    check_uncommitted,
    find_latest_ckpt_path,
    load_newest_loadable,
    resume_candidates,
)

logger = logging.getLogger(__name__)
SFT_POSTFIX = {"loss": ("train/loss", ".4f"), "step_s": ("timing_s/step", ".2f")}
ROLE = "actor"  # the role directory of a checkpoint, so the model merger and resume find it as for PPO
DATA_STATE = "data.pt"  # the dataloader position, next to the role directories of a step


def validate_config(config: DictConfig) -> DictConfig:
    """The config checked against the schema and for impossible settings, trainer.device resolved, read-only."""
    checked = OmegaConf.merge(OmegaConf.structured(SFTSchema), config)
    OmegaConf.resolve(checked)
    make_paths_absolute(checked)  # ranks on other hosts start in another working directory
    # Hydra's `+key=value` adds a key even under the typed nodes; nothing would read it
    unknown = [unknown_key_message(key, known) for key, known in added_keys(OmegaConf.to_object(checked))]
    require(not unknown, "\n".join(unknown))
    data, trainer, optim = checked.data, checked.trainer, checked.optim
    world = trainer.n_gpus_per_node * trainer.nnodes
    check_backend(trainer)
    require(data.train_batch_size > 0 and data.train_batch_size % world == 0,
             f"data.train_batch_size ({data.train_batch_size}) must be a positive multiple of the number of "
             f"ranks ({world} = trainer.n_gpus_per_node x trainer.nnodes)")
    sp = checked.ulysses_sequence_parallel_size
    require(sp >= 1 and world % sp == 0, f"ulysses_sequence_parallel_size={sp} must divide the number of ranks "
             f"({world} = trainer.n_gpus_per_node x trainer.nnodes)")
    require(data.micro_batch_size_per_gpu > 0,
             f"data.micro_batch_size_per_gpu must be positive, got {data.micro_batch_size_per_gpu}")
    require(not data.use_dynamic_bsz or data.max_token_len_per_gpu * sp >= data.max_length,
             f"data.max_token_len_per_gpu ({data.max_token_len_per_gpu}) x ulysses_sequence_parallel_size ({sp}) "
             f"must be at least data.max_length ({data.max_length}) with data.use_dynamic_bsz=true, so that the "
             f"longest sequence fits one pass")
    require(optim.lr_scheduler in ("constant", "cosine"),
             f"optim.lr_scheduler must be constant or cosine, got {optim.lr_scheduler!r}")
    trainer.logger = parse_logger_backends(trainer.logger)  # a name or a list; raises naming the valid backends
    require(trainer.resume_mode in ("auto", "disable", "resume_path"),
             f"trainer.resume_mode must be auto, disable or resume_path, got {trainer.resume_mode!r}")
    steps = trainer.total_training_steps
    require(steps is None or (isinstance(steps, int) and steps > 0),
             f"trainer.total_training_steps must be a positive integer or null, got {steps!r}")
    model = checked.model
    require(model.strategy in ("fsdp", "fsdp2"), f"model.strategy={model.strategy} is not supported by hybridrl: "
             "FSDP2 (fully_shard) is the only training engine. Set it to fsdp2")
    require(trainer.default_hdfs_dir is None, f"trainer.default_hdfs_dir={trainer.default_hdfs_dir} is not "
             "supported by hybridrl: checkpoints are written to trainer.default_local_dir only. Set it to null")
    LoRASettings.from_sft_model(model)  # raises naming model.lora_rank / lora_alpha / target_modules
    switches = {"model.use_liger": model.use_liger, "model.use_shm": model.use_shm, "data.use_shm": data.use_shm}
    if any(switches.values()):
        named = ", ".join(f"{key}=true" for key, value in switches.items() if value)
        logger.warning(f"no effect in this run: {named} (verl's GPU and file-copy switches that change no result)")
    if data.micro_batch_size is not None:
        logger.warning(f"no effect in this run: data.micro_batch_size={data.micro_batch_size} (verl's deprecated "
                       f"key, unread by verl's SFT trainer too); data.micro_batch_size_per_gpu="
                       f"{data.micro_batch_size_per_gpu} sets the micro-batch")
    OmegaConf.set_readonly(checked, True)
    return checked


def build_dataset(config: DictConfig, files: Any, tokenizer: Any, max_samples: int = -1) -> SFTDataset | Subset:
    """The dataset of `files`; with `max_samples` > 0, its first `max_samples` rows (verl's train/val_max_samples)."""
    data = config.data
    keys: dict[str, Any] = {"messages_key": data.multiturn.messages_key} if data.multiturn.enable else {
        "prompt_key": data.prompt_key, "prompt_dict_keys": data.prompt_dict_keys,
        "response_key": data.response_key, "response_dict_keys": data.response_dict_keys,
    }
    files = list(files) if OmegaConf.is_list(files) else files
    dataset = SFTDataset(files, tokenizer, max_length=data.max_length, truncation=data.truncation, **keys)
    return Subset(dataset, range(max_samples)) if 0 < max_samples < len(dataset) else dataset


def load_data(config: DictConfig) -> tuple[Dataset, Dataset | None]:
    """The train and validation sets, built (every row checked) before any worker or Ray starts."""
    tokenizer = load_tokenizer(config.model.partial_pretrain, trust_remote_code=config.model.trust_remote_code)
    data = config.data
    train_set = build_dataset(config, data.train_files, tokenizer, data.train_max_samples)
    val_set = None if data.val_files is None else build_dataset(config, data.val_files, tokenizer, data.val_max_samples)
    require(len(train_set) >= config.data.train_batch_size, f"the training data has {len(train_set)} rows, "
             f"fewer than data.train_batch_size={config.data.train_batch_size}")
    return train_set, val_set


def to_proto(batch: dict[str, torch.Tensor]) -> DataProto:
    return DataProto.from_dict(dict(batch))  # input_ids, attention_mask, position_ids, loss_mask: (rows, len)


class SFTTrainer:
    """Drives an SFT worker group (any backend) over the configured data; `fit()` runs the whole job."""

    def __init__(self, config: DictConfig, worker_group: WorkerGroup,
                 data: tuple[Dataset, Dataset | None]) -> None:
        self.config = config
        self.wg = SFTGroup(worker_group)
        self.out_dir = Path(config.trainer.default_local_dir).expanduser()
        self.train_set, self.val_set = data
        self.steps_per_epoch = len(self.train_set) // config.data.train_batch_size
        self.total_steps = config.trainer.total_training_steps or self.steps_per_epoch * config.trainer.total_epochs
        sampler = ResumableSampler(len(self.train_set), shuffle=True, seed=config.trainer.seed)
        self.loader = StatefulDataLoader(self.train_set, sampler=sampler,
                                         batch_size=config.data.train_batch_size, drop_last=True)
        trainer = config.trainer
        self.tracker = Tracking(trainer.project_name, trainer.experiment_name, list(trainer.logger),
                                config=OmegaConf.to_container(config, resolve=True), log_dir=self.out_dir)
        self.global_step = 0
        self.guard = DivergenceGuard(
            config.trainer.max_consecutive_skipped_steps, last_checkpoint=lambda: find_latest_ckpt_path(self.out_dir),
            hint=f"Lower optim.lr (now {config.optim.lr}), then run again")
        self.hf_model_dir: Path | None = None  # the fine-tuned model's HF directory, set by the final checkpoint

    def fit(self) -> dict[str, float]:
        """Train for `total_steps` steps, validating as configured; returns the last step's metrics."""
        info = self.wg.init_model(self.total_steps)[0]
        print(f"SFT: {info['params']:,} parameters ({info['local_params']:,} on rank 0), {len(self.train_set)} "
              f"train rows, {self.steps_per_epoch} steps/epoch, {self.total_steps} steps", flush=True)
        self._resume()
        self.tracker.rewind(self.global_step if self.global_step else -1)
        bar = StepProgress(self.total_steps, initial_step=self.global_step, desc="SFT", postfix=SFT_POSTFIX)
        try:
            return self._train_loop(bar)
        finally:
            bar.close()
            self.tracker.finish()

    def _train_loop(self, bar: StepProgress) -> dict[str, float]:
        last: dict[str, float] = {}
        while self.global_step < self.total_steps:
            for batch in self.loader:
                last = self._train_step(to_proto(batch))
                healthy = self.guard.check(self.global_step, last, log=partial(self.tracker.log, last, self.global_step))
                if self._should_validate():
                    last.update(self._validate())
                self.tracker.log(last, self.global_step)
                bar.update(self.global_step, last)
                done = self.global_step >= self.total_steps
                freq = self.config.trainer.save_freq
                if (done or (freq > 0 and self.global_step % freq == 0)) and healthy:
                    self._save_checkpoint(final=done)
                if done:
                    break
            else:  # the epoch ran out before the step budget
                if self.config.trainer.test_freq <= 0 and self.val_set is not None:
                    self.tracker.log(self._validate(), self.global_step)
        return last

    def _train_step(self, batch: DataProto) -> dict[str, float]:
        start = time.perf_counter()
        # loss, num_tokens, grad_norm, lr and skipped_step: every rank returns the same all-reduced numbers
        metrics = self.wg.train_batch(batch)[0]
        self.global_step += 1
        return {**{f"train/{name}": value for name, value in metrics.items()},
                "timing_s/step": time.perf_counter() - start, "epoch": (self.global_step - 1) // self.steps_per_epoch}

    def _should_validate(self) -> bool:
        """After the last step, and every test_freq steps when it is positive (else at epoch ends)."""
        freq = self.config.trainer.test_freq
        return self.val_set is not None and (self.global_step >= self.total_steps
                                             or (freq > 0 and self.global_step % freq == 0))

    def _validate(self) -> dict[str, float]:
        """Token-mean NLL of assistant tokens over the whole validation set."""
        loss_sum = num_tokens = 0.0
        size = self.config.data.train_batch_size * 4  # no gradients: bigger batches are fine
        for batch in DataLoader(self.val_set, batch_size=size):
            out = self.wg.eval_batch(to_proto(batch))
            loss_sum += float(out.batch["loss_sum"].sum())
            num_tokens += float(out.batch["num_tokens"].sum())
        return {"val/loss": loss_sum / num_tokens if num_tokens else math.nan}

    def _save_checkpoint(self, final: bool) -> None:
        """global_step_N/actor (+ huggingface/ when final) and the data position, then commit the step."""
        step_dir = self.out_dir / f"global_step_{self.global_step}"
        trainer = self.config.trainer
        check_uncommitted(step_dir)
        self.wg.save_checkpoint(str(step_dir / ROLE), self.global_step, trainer.max_ckpt_to_keep, final)
        torch.save(self.loader.state_dict(), step_dir / DATA_STATE)
        write_run_config(step_dir, OmegaConf.to_container(self.config, resolve=True))
        commit_checkpoint(self.out_dir, self.global_step)
        if final:
            self.hf_model_dir = step_dir / ROLE / "huggingface"
            tqdm.write(f"saved the fine-tuned model to {self.hf_model_dir}")

    def _resume(self) -> None:
        """Continue as trainer.resume_mode says, past checkpoints that fail to load; stops a run that would save
        over newer committed steps."""
        trainer = self.config.trainer
        candidates = resume_candidates(trainer.resume_mode, self.out_dir, trainer.resume_from_path)
        path = load_newest_loadable(candidates, self._load_from, fallback=trainer.resume_mode == "auto")
        check_no_committed_after(self.out_dir, self.global_step)  # the final step is always saved
        if path is None:
            return
        if self.global_step >= self.total_steps:
            self.hf_model_dir = path / ROLE / "huggingface"
        print(f"resumed from {path} at step {self.global_step}", flush=True)

    def _load_from(self, path: Path) -> None:
        meta = self.wg.load_checkpoint(str(path / ROLE))[0]
        state = load_state_file(path / DATA_STATE)
        report_config_changes(path, OmegaConf.to_container(self.config, resolve=True))
        self.loader.load_state_dict(state)
        self.global_step = int(meta["global_step"])
