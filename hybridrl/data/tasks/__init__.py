"""Task data in verl's parquet schema: `python -m hybridrl.data.tasks.<task> --out DIR [--input RAW]` writes
`DIR/train.parquet` and `DIR/test.parquet` (generated: arithmetic, countdown, tool_arithmetic; converted
from the publisher's files: gsm8k, math). Rows hold `data_source`, `prompt` (chat messages), `ability`,
`reward_model={"style": "rule", "ground_truth": ...}` and `extra_info` with `split`, `index`, `question`
and `answer`, a full worked response for an SFT warm start.
"""
