"""The drafting engine: token ids in, greedy draft token ids out; it knows nothing of HTTP, sessions or
tokenizers. Three rooms:
- `engine/model/`: our Qwen3 and Qwen2 (one set of modules, FP8 and CPU linears), its config, the loader and the presets;
- `engine/cache/`: the paged KV cache (the page pool, the allocator, the prefix index, the sequence table
  and which of its sequences a request continues);
- the draft loop, here at the root: placement and prefill (`engine.py`, `prefill.py`), attention over the
  pages (`attention.py`), the k-step decode loop (`decode.py`, `tiers.py`), drafting ahead's branches
  (`ahead.py`), torch.compile, CUDA graphs and warmup (`compile.py`, `cuda_graphs.py`, `recompiles.py`,
  `warmup.py`), and what the engine reports (`lifecycle.py`, `describe.py`, `requests.py`).
"""
