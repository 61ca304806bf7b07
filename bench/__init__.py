"""Benchmarks: per-call draft latency against the baselines a user would otherwise deploy, and the
acceptance a target model sees when it decodes with our drafts. Run as scripts: `python bench/latency.py`."""
