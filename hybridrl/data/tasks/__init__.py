"""Task data in verl's parquet schema.

Each task is a command that writes `DIR/train.parquet` and `DIR/test.parquet`:

    python -m hybridrl.data.tasks.arithmetic --out ~/data/arithmetic
    python -m hybridrl.data.tasks.countdown  --out ~/data/countdown
    python -m hybridrl.data.tasks.gsm8k      --input ~/raw/gsm8k --out ~/data/gsm8k
    python -m hybridrl.data.tasks.math       --input ~/raw/MATH  --out ~/data/math

Every row has `data_source`, `prompt` (chat messages), `ability`,
`reward_model={"style": "rule", "ground_truth": ...}` and
`extra_info={"split", "index", "question", "answer", ...}`, where `extra_info["answer"]` is a full
worked target response (used for an SFT warm start).
"""
