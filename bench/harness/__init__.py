"""The shared harness: what the benchmarks, the rooms beside it and the tests use to start a drafter server
and measure it, so that every figure comes from the same code.

- server.py: the one launcher for a server process (port 0, ready on /health/ready), bench's and tests';
- workload.py and runners.py: the simulated conversations a target posts, and how a case drives them
  in-process or over HTTP; call_cost.py: what a /draft call costs beyond the engine;
- prompts.py and decoding.py: prompt files and a transformers target's greedy decoding, alone and with
  drafts from a server; baselines.py: the transformers drafters we are compared with;
- machine.py, projection.py, report.py and refusals.py: what a result was measured on and its floor, the
  projected GPU figures, result rows, tables and plots, and a refused request said in one line;
  gpu_floors.py: the GPU cost models the projection uses, from a pair's shapes (Qwen3-8B/0.6B, the real
  pair's Qwen2.5-Coder-1.5B/0.5B).

It imports nothing from the other rooms (device, vllm_target, suffix, testbed) nor from a benchmark at
bench/'s root: they import it.
"""
