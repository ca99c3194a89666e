"""Datasets, the prompt sampler, sequence balancing, and `tasks`, which write verl-schema parquet files.
Nothing is imported here, so `python -m hybridrl.data.tasks.<name>` stays light."""
