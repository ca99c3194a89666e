"""The SFT trainer's typed config under verl's SFT key names (composed by `sft_trainer.yaml`): every SFT default,
sized for the built-in arithmetic task and a tiny model on a CPU."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore

from hybridrl.workers.config import CheckpointConfig, FSDPConfig


@dataclass
class MultiturnSchema:
    # Train on a column of whole chats (role/content dicts) instead of prompt/response columns.
    enable: bool = False
    # The chat column when multiturn.enable is true; every assistant turn is trained on.
    messages_key: str = "messages"


@dataclass
class DataSchema:
    # Parquet file(s) to train on: a path or a list of paths.
    train_files: Any = "???"
    # Parquet file(s) for the validation loss; null skips validation.
    val_files: Any = None
    # Column holding the prompt: a string (one user message) or a list of chat messages (RL parquet files).
    prompt_key: str = "prompt"
    # Column holding the response text; with response_dict_keys, the column holds dicts to walk into.
    response_key: str = "extra_info"
    # Keys walked into a dict-valued prompt column, e.g. [question] reads row[prompt_key]["question"].
    prompt_dict_keys: Any = None
    # Keys walked into a dict-valued response column: the task files keep the worked answer in extra_info.answer.
    response_dict_keys: Any = field(default_factory=lambda: ["answer"])
    multiturn: MultiturnSchema = field(default_factory=MultiturnSchema)
    # Tokens per sequence (chat template included); micro-batches are cut to their longest row.
    max_length: int = 1024
    # What to do with a longer chat: error (name the row), left (keep the end) or right (keep the start).
    truncation: str = "error"
    # Sequences per optimizer step, over all ranks; must divide by the number of ranks.
    train_batch_size: int = 256
    # Sequences per forward/backward pass on each rank; gradients accumulate over the micro-batches.
    micro_batch_size_per_gpu: int = 4
    # verl's deprecated global micro-batch size, which verl's SFT trainer does not read either: no effect
    # (a warning names it); micro_batch_size_per_gpu sets the micro-batch.
    micro_batch_size: Any = None
    # Form micro-batches by tokens instead (verl's SFT key): each pass at most max_token_len_per_gpu padded
    # tokens (rows x longest row); micro_batch_size_per_gpu is then unused. Same loss, less padding.
    use_dynamic_bsz: bool = False
    # The token budget of one forward/backward pass with use_dynamic_bsz; at least data.max_length.
    max_token_len_per_gpu: int = 8192
    # Train (validate) on the first this many rows only; -1 or less: every row.
    train_max_samples: int = -1
    val_max_samples: int = -1
    # verl's shared-memory copy of the files: no effect here (a warning names it when set).
    use_shm: bool = False


@dataclass
class ModelSchema:
    # HF model directory to start from (a local path; nothing is downloaded).
    partial_pretrain: str = "???"
    # Recompute activations in backward to save memory (slower).
    enable_gradient_checkpointing: bool = False
    # Allow model code shipped inside the model directory.
    trust_remote_code: bool = False
    # A module every rank imports before loading the model (registers custom architectures), as in verl.
    external_lib: Any = None
    # LoRA adapters instead of full fine-tuning (docs/lora.md): rank (0 = off), alpha (the adapter's scale is
    # alpha / rank), and the linears to adapt ("all-linear" or a list of module names).
    lora_rank: int = 0
    lora_alpha: float = 16
    target_modules: Any = "all-linear"
    # fsdp or fsdp2: both run FSDP2 (fully_shard) here.
    strategy: str = "fsdp2"
    # verl's GPU switches that change no result (Liger kernels, shared-memory model copy): no effect here (a
    # warning names them when set).
    use_liger: bool = False
    use_shm: bool = False
    # FSDP2 sharding settings (hybridrl.workers.config.FSDPConfig).
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)


@dataclass
class OptimSchema:
    # Peak AdamW learning rate (verl's default, for a pretrained model; the quickstart's tiny one takes 3e-3).
    lr: float = 1.0e-5
    # AdamW betas.
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    # AdamW decoupled weight decay.
    weight_decay: float = 0.01
    # Fraction of the training steps spent warming the learning rate up linearly from ~0.
    lr_warmup_steps_ratio: float = 0.1
    # Clip the global gradient norm to this value (0 or less: no clipping).
    clip_grad: float = 1.0
    # After warmup: constant or cosine (decays to min_lr_ratio x lr by the last step).
    lr_scheduler: str = "cosine"
    # Floor of the cosine schedule, as a fraction of lr.
    min_lr_ratio: float = 0.0


@dataclass
class TrainerSchema:
    # Where metrics.jsonl and the checkpoints (global_step_N/actor/, the last with huggingface/) are written.
    default_local_dir: str = "checkpoints/${trainer.project_name}/${trainer.experiment_name}"
    # Names for loggers and the default output directory.
    project_name: str = "hybridrl-sft"
    experiment_name: str = "arithmetic-tiny"
    # Passes over the training data (total_training_steps, when set, wins).
    total_epochs: int = 4
    # Stop after this many optimizer steps (wins over total_epochs); null means total_epochs x steps per epoch.
    total_training_steps: Any = None
    # Where metrics go, as for PPO: console (a table per step), file (metrics.jsonl in default_local_dir),
    # tensorboard, wandb or mlflow (the last two are extras).
    logger: Any = field(default_factory=lambda: ["console", "file"])
    # Seed of the model's random state and of the data order.
    seed: int = 1
    # Ranks per node (on CPU: worker processes).
    n_gpus_per_node: int = 1
    # Hosts of the Ray cluster: each node's n_gpus_per_node ranks go to a host of their own (docs/multinode.md).
    nnodes: int = 1
    # cpu, cuda (needs a GPU torch can see), or auto: cuda where torch sees a GPU, else cpu.
    device: str = "auto"
    # ray: ranks in Ray actors; local: one rank in this process (for debugging).
    backend: str = "ray"
    # Validation loss every this many steps; -1 means once per epoch (and after the last step).
    test_freq: int = -1
    # Checkpoint every this many steps; -1 means only the final one (which also holds the HF model dir,
    # default_local_dir/global_step_N/actor/huggingface).
    save_freq: int = -1
    # Checkpoints to keep on disk; null or 0 keeps all.
    max_ckpt_to_keep: Any = None
    # verl's HDFS copy of the checkpoints: only null runs (checkpoints stay in default_local_dir).
    default_hdfs_dir: Any = None
    # disable: start fresh; auto: continue from the newest complete checkpoint in default_local_dir;
    # resume_path: continue from trainer.resume_from_path (a global_step_N directory).
    resume_mode: str = "auto"
    resume_from_path: Any = None
    # What each checkpoint holds: model, optimizer (with the lr schedule), extra (RNG states), hf_model
    # (a full HF model directory; the final checkpoint always has one).
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    # Steps in a row with a non-finite loss or gradient norm (updates skipped, never checkpointed) tolerated
    # before the run stops; 0 stops at the first: without fp16 loss scaling a NaN means divergence or bad data.
    max_consecutive_skipped_steps: int = 0


@dataclass
class RayInitSchema:
    # CPUs of the local Ray cluster started when none is running; null means all of this machine's.
    num_cpus: Any = None


@dataclass
class SFTSchema:
    data: DataSchema = field(default_factory=DataSchema)
    model: ModelSchema = field(default_factory=ModelSchema)
    optim: OptimSchema = field(default_factory=OptimSchema)
    trainer: TrainerSchema = field(default_factory=TrainerSchema)
    ray_init: RayInitSchema = field(default_factory=RayInitSchema)
    # Ulysses sequence parallelism (verl's key): groups of this many ranks split each sequence
    # (hybridrl/workers/sequence_parallel.py); data.micro_batch_size_per_gpu then counts rows per group.
    ulysses_sequence_parallel_size: int = 1
    # verl's switch for computing on unpadded tokens: the same loss either way, as every micro-batch is cut to
    # its longest row.
    use_remove_padding: bool = False


ConfigStore.instance().store(name="sft_trainer_schema", node=SFTSchema)
