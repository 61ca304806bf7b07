"""What a target framework imports to speculate with drafter: the transformers `custom_generate` loop
(`transformers_generate.py`) and a transformers target to try it with (`target.py`). They use
drafter.client and the target's own torch; none imports server code."""
