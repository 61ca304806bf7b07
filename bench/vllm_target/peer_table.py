"""The peer table's figures from its measured runs (bench/vllm_target/peers.py): a row per run, the projected
GPU speedup, and the markdown table, one line per (workload, concurrency, mode).

`results` is {mode: {concurrency: {workload: row}}}, or {mode: {"error": ...}} for a mode that did not run.
"""

from __future__ import annotations

from bench.vllm_target.peer_modes import MODES


def run_row(run: dict) -> dict:
    """One measured `generate` (bench/vllm_target/target.py's answer) as the table's row."""
    spec = run["spec"]
    proposer = run.get("proposer")
    generated = sum(len(output) for output in run["outputs"])
    return {
        "tokens_per_s": generated / run["seconds"],
        "seconds": run["seconds"],
        "num_generated_tokens": generated,
        # vLLM's mean acceptance length: over the steps that had drafts
        "accepted_tokens_per_step": 1 + spec["num_accepted_tokens"] / spec["num_drafts"]
        if spec["num_drafts"]
        else 1.0,
        "num_drafts": spec["num_drafts"],
        "num_draft_tokens": spec["num_draft_tokens"],
        "num_accepted_tokens": spec["num_accepted_tokens"],
        # drafter modes: row-steps the proposer asked the server for drafts and got none (auto's 0, a timeout)
        "num_undrafted_calls": max(proposer["num_calls"] - spec["num_drafts"], 0) if proposer else 0,
        "proposer_share": proposer["propose_s"] / run["seconds"] if proposer else None,
        "proposer_skipped": proposer["skipped"] if proposer else {},
        "outputs": run["outputs"],
    }


def projected_speedup(mode: str, row: dict, gpu, bf16_step_factor: float) -> float:
    """The measured acceptance replayed at GPU costs (bench/harness/projection.py's floors): a step verifies at
    `verify_ms` whatever its drafts (memory-bound, for a batch of a few rows as for one), and drafting costs
    the server's overhead per call plus a draft step per draft token (FP8 or bf16 weights); vLLM's in-process
    methods pay no HTTP, ngram no model. Steps a drafter mode asked for drafts and got none cost a verify and
    the call, for one token; vLLM counts no such steps for its own methods."""
    spec = MODES[mode]
    drafted = row["num_drafts"]
    if spec.speculation == "none" or not drafted:
        return 1.0
    undrafted = row["num_undrafted_calls"]
    step_ms = 0.0 if spec.speculation == "ngram" else gpu.draft_step_ms
    step_ms *= bf16_step_factor if spec.bf16_drafts else 1.0
    overhead_ms = gpu.draft_overhead_ms if spec.speculation == "drafter" else 0.0
    tokens = drafted + row["num_accepted_tokens"] + undrafted
    cost_ms = (drafted + undrafted) * (gpu.verify_ms + overhead_ms) + row["num_draft_tokens"] * step_ms
    return tokens * gpu.verify_ms / cost_ms


def table(results: dict, workloads, concurrency, gpu, bf16_step_factor: float) -> str:
    lines = [
        "| workload | concurrency | mode | tokens/s | vs alone | accepted tokens/step | proposer share | "
        "projected GPU | lossless |",
        "|---|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for workload in workloads:
        for rows_in_flight in concurrency:
            alone = results.get("alone", {}).get(rows_in_flight, {}).get(workload)
            for mode, by_concurrency in results.items():
                where = f"| {workload} | {rows_in_flight} | {mode} |"
                if "error" in by_concurrency:
                    lines.append(f"{where} failed: {by_concurrency['error'][:120]} | | | | | |")
                    continue
                row = by_concurrency.get(rows_in_flight, {}).get(workload)
                if row is None:
                    continue
                lines.append(where + cells(mode, row, alone, gpu, bf16_step_factor))
    return "\n".join(lines)


def cells(mode: str, row: dict, alone: dict | None, gpu, bf16_step_factor: float) -> str:
    ratio = f"{row['tokens_per_s'] / alone['tokens_per_s']:.2f}x" if alone else ""
    share = f"{100 * row['proposer_share']:.0f}%" if row["proposer_share"] is not None else ""
    same = "" if alone is None else "yes" if row["outputs"] == alone["outputs"] else "NO"
    projected = projected_speedup(mode, row, gpu, bf16_step_factor)
    return (
        f" {row['tokens_per_s']:.1f} | {ratio} | {row['accepted_tokens_per_step']:.2f} | {share} | "
        f"{projected:.2f}x | {same} |"
    )
