"""FP8 per-tensor export of Qwen3 checkpoints with torchao; `python -m export --help`."""
