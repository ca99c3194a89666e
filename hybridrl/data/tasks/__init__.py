"""Task data in verl's parquet schema: `python -m hybridrl.data.tasks.<task> --out DIR [--input RAW]` writes
`DIR/train.parquet` and `DIR/test.parquet` (generated, or converted from the publisher's files: gsm8k, math);
`extra_info.answer` is a full worked response for an SFT warm start.
"""
