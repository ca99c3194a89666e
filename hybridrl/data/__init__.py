"""Datasets and data preparation.

- `hybridrl.data.sft_dataset`: chats -> input_ids / loss_mask for supervised fine-tuning.
- `hybridrl.data.rl_dataset`: prompts for RL (RLHFDataset), left-padded.
- `hybridrl.data.seqlen_balancing`: partitioning sequences by token count.
- `hybridrl.data.tasks`: generators and preprocessors that write verl-schema parquet files.

Nothing is imported here, so `python -m hybridrl.data.tasks.<name>` does not pay for torch/transformers.
"""
