"""What a target framework imports to speculate with drafter: the transformers `custom_generate` loop
(`transformers_generate.py`), a transformers target to try it with (`target.py`), and vLLM's speculative
proposer (`vllm_proposer.py`, with `vllm_rows.py` matching vLLM's batch rows to sessions). They use
drafter.client and the target's own torch; none imports server code."""
