"""The model room: our Qwen3 in plain PyTorch (`qwen3.py`, which serves the Qwen2 family too), its shape and
family (`config.py`), FP8 linears for exported checkpoints (`fp8.py`), the CPU's decode-speed linears
(`cpu_linears.py`), the loader (`loader.py`) and the random-weight presets (`presets.py`). It knows nothing of
pages' contents, requests or the loop that drives it.
"""
