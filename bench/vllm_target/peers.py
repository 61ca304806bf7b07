"""The peer table: what a vLLM user compares before adopting drafter. On the testbed pair, per workload, one
vLLM CPU engine per way of speculating (bench/vllm_target/target.py, from the vLLM venv):

- `alone`: no speculation;
- `drafter-fp8`, `drafter-bf16`: drafter as vLLM's proposer, serving the pair's drafter as its FP8
  (weight-only) export or unquantized (its bf16 checkpoint, served in float32 on the CPU);
- `draft_model`: vLLM's in-process `draft_model` with the same drafter weights;
- `ngram`: vLLM's prompt lookup (2-5 grams).

Each workload's prompts go to `generate` together (a batch of up to --max-num-seqs rows), greedy, for
--max-tokens tokens each, after a warmup; the best of --repeats runs is kept. Reported: target tokens/s,
accepted tokens per step (1 + accepted / drafts, vLLM's mean acceptance length), the share of the run vLLM
spent waiting in drafter's `propose`, a projected GPU speedup (`projected_speedup`: these acceptance
figures at H100 costs), and whether the outputs equal `alone`'s token for token.

    python -m bench.vllm_target.peers --out out/vllm-peers         # about 10 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

from bench.harness.projection import GpuModel
from bench.harness.server import ServerProcess, free_port
from bench.testbed import PAIR, workload_tokens
from bench.vllm_target.driver import VllmTarget, vllm_available, vllm_python

WORKLOADS = ("prose", "code", "edit")
DRAFTER_SERVED = {"drafter-fp8": "drafter-fp8-weight-only", "drafter-bf16": "drafter"}
# Qwen3-0.6B's bf16 linears read per draft step against FP8's: the step is memory-bound, so ~1.6x the time
# (0.88 GB of bf16 linears + 0.31 GB embedding, against 0.44 + 0.31 GB).
BF16_STEP_FACTOR = {"drafter-bf16": 1.6, "draft_model": 1.6}
MODES = ("alone", "drafter-fp8", "drafter-bf16", "draft_model", "ngram")
SERVER_ARGS = ["--device=cpu", "--dtype=float32", "--max-seq-len=2048", "--batch-window-ms=1"]


def engine_options(mode: str, args, port: int, stats: Path) -> tuple[str, dict]:
    options = dict(k=args.k, max_num_seqs=args.max_num_seqs, max_model_len=2048)
    if mode == "alone":
        return "none", options
    if mode in DRAFTER_SERVED:
        return "drafter", {**options, "drafter_url": f"http://127.0.0.1:{port}", "stats_path": stats}
    if mode == "draft_model":
        return "draft_model", {**options, "draft_model": PAIR / "drafter"}
    return "ngram", options


def measure(mode: str, args, prompts: dict[str, list[list[int]]]) -> dict:
    """One engine (and for drafter modes one server) for every workload: {workload: row} or {"error": ...}."""
    port, stats = free_port(), Path(tempfile.mkdtemp(prefix="vllm-peers-")) / "stats.json"
    speculation, options = engine_options(mode, args, port, stats)
    server = None
    try:
        if mode in DRAFTER_SERVED:
            model = PAIR / DRAFTER_SERVED[mode]
            server = ServerProcess([f"--model={model}", *SERVER_ARGS, f"--port={port}"])
            server.wait_ready()
        with VllmTarget(PAIR / "target", speculation, **options) as vllm:
            print(f"{mode}: engine up in {vllm.ready['startup_s']:.0f} s", file=sys.stderr)
            vllm.generate([prompts[WORKLOADS[0]][0]], 16)  # warmup: first-call costs stay out of the figures
            return {name: best_run(vllm, batch, args) for name, batch in prompts.items()}
    except RuntimeError as error:  # a method vLLM's CPU build refuses: reported, not fatal
        return {"error": str(error).splitlines()[0] + " " + last_error_line(str(error))}
    finally:
        if server is not None:
            server.close()


def last_error_line(log: str) -> str:
    lines = [line for line in log.splitlines() if "Error" in line]
    return lines[-1].strip()[-300:] if lines else ""


def best_run(vllm: VllmTarget, batch: list[list[int]], args) -> dict:
    runs = [vllm.generate(batch, args.max_tokens) for _ in range(args.repeats)]
    best = min(runs, key=lambda run: run["seconds"])
    spec = best["spec"]
    proposer_s = best["proposer"]["propose_s"] if "proposer" in best else None
    generated = sum(len(output) for output in best["outputs"])
    return {
        "tokens_per_s": generated / best["seconds"],
        "seconds": best["seconds"],
        "accepted_tokens_per_step": 1 + spec["num_accepted_tokens"] / spec["num_drafts"]
        if spec["num_drafts"]
        else 1.0,
        "num_drafts": spec["num_drafts"],
        "num_draft_tokens": spec["num_draft_tokens"],
        "num_accepted_tokens": spec["num_accepted_tokens"],
        "proposer_share": proposer_s / best["seconds"] if proposer_s is not None else None,
        "outputs": best["outputs"],
    }


def projected_speedup(mode: str, row: dict, model: GpuModel) -> float:
    """The measured acceptance replayed at H100 costs (bench/harness/projection.py's floors): a step verifies
    at `verify_ms` whatever its drafts (memory-bound), and drafting k tokens costs the server's overhead plus
    k draft steps (FP8 or bf16 weights); vLLM's in-process methods pay no HTTP, ngram no model."""
    if mode == "alone" or not row["num_drafts"]:
        return 1.0
    drafts_per_step = row["num_draft_tokens"] / row["num_drafts"]
    step_ms = model.draft_step_ms * BF16_STEP_FACTOR.get(mode, 1.0) if mode != "ngram" else 0.0
    overhead_ms = model.draft_overhead_ms if mode in DRAFTER_SERVED else 0.0
    step_cost = model.verify_ms + overhead_ms + drafts_per_step * step_ms
    return row["accepted_tokens_per_step"] * model.verify_ms / step_cost


def table(results: dict, workloads) -> str:
    model = GpuModel()
    lines = [
        "| workload | mode | tokens/s | vs alone | accepted tokens/step | proposer share | projected GPU | lossless |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for workload in workloads:
        alone = results["alone"].get(workload)
        for mode, rows in results.items():
            if "error" in rows:
                lines.append(f"| {workload} | {mode} | failed: {rows['error'][:120]} | | | | | |")
                continue
            row = rows[workload]
            ratio = f"{row['tokens_per_s'] / alone['tokens_per_s']:.2f}x" if alone else ""
            share = f"{100 * row['proposer_share']:.0f}%" if row["proposer_share"] is not None else ""
            same = "yes" if alone and row["outputs"] == alone["outputs"] else "NO"
            lines.append(
                f"| {workload} | {mode} | {row['tokens_per_s']:.1f} | {ratio} | "
                f"{row['accepted_tokens_per_step']:.2f} | {share} | {projected_speedup(mode, row, model):.2f}x | {same} |"
            )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--workloads", default=",".join(WORKLOADS), help="comma-separated, of " + ",".join(WORKLOADS)
    )
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated, of " + ",".join(MODES))
    parser.add_argument("--k", type=int, default=8, help="num_speculative_tokens")
    parser.add_argument("--max-tokens", type=int, default=128, help="new tokens per prompt")
    parser.add_argument("--num-prompts", type=int, default=8, help="prompts per workload (one batch)")
    parser.add_argument("--max-num-seqs", type=int, default=8, help="vLLM's batch: rows per step")
    parser.add_argument("--repeats", type=int, default=2, help="runs per workload; the fastest is reported")
    parser.add_argument("--out", type=Path, help="write report.json and report.md here")
    args = parser.parse_args(argv)
    workloads, modes = args.workloads.split(","), args.modes.split(",")
    unknown = [w for w in workloads if w not in WORKLOADS] + [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"unknown workloads or modes: {unknown}")
    if "alone" not in modes:
        modes.insert(0, "alone")  # the baseline of every ratio and of the lossless check
    if not vllm_available():
        parser.error(f"no vLLM venv at {vllm_python()}: run bash bench/vllm_target/install.sh")
    started = time.monotonic()
    prompts = {name: workload_tokens(name)[: args.num_prompts] for name in workloads}
    results = {mode: measure(mode, args, prompts) for mode in modes}
    markdown = table(results, workloads)
    print(markdown)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        machine = f"{platform.machine()} {platform.processor() or ''}".strip()
        report = {"args": {k: str(v) for k, v in vars(args).items()}, "machine": machine, "results": results,
                  "seconds": time.monotonic() - started}  # fmt: skip
        (args.out / "report.json").write_text(json.dumps(report, indent=1))
        (args.out / "report.md").write_text(markdown + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
