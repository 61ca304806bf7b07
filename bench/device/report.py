"""The device check's report: its JSON rendered as Markdown tables (stages, rows, engines, server costs)."""

from __future__ import annotations

import logging

from bench.harness import report

log = logging.getLogger(__name__)

COLUMNS = [("variant", "{}"), ("context_len", "{}"), ("num_draft_tokens", "{}"), ("concurrency", "{}"),
           ("p50_ms", "{:.2f}"), ("p90_ms", "{:.2f}"), ("p99_ms", "{:.2f}"), ("ms_per_step", "{:.3f}"),
           ("floor_ms", "{:.3f}"), ("floor_fraction", "{:.1%}"), ("num_graphs", "{}")]  # fmt: skip
OVERHEAD_FIELDS = ("context_len", "health_ms", "excess_ms", "engine_ms", "wall_ms")


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


def markdown(result: dict) -> str:
    stages = [
        [s["stage"], s["status"], f"{s['seconds']:.0f}", s.get("summary", "")] for s in result["stages"]
    ]
    lines = table(["stage", "status", "s", "tests"], stages) + [""]
    names = [report.HEADERS.get(name, name) for name, _ in COLUMNS] + ["fallbacks"]
    rows = [
        [f.format(row[n]) if row.get(n) is not None else "" for n, f in COLUMNS]
        + [str(len(row.get("fallbacks", [])))]
        for row in result["results"]
    ]
    lines += table(names, rows) + [""]
    engine_rows = []
    for name, facts in result["engines"].items():
        captured = facts.get("captured") or {}
        memory, peak = captured.get("memory_bytes"), facts.get("peak_memory_bytes")
        engine_rows.append([
            name, f"{sum((facts.get('stage_seconds') or {}).values()):.1f}",
            f"{captured['capture_seconds']:.1f}" if captured else "", f"{memory / 1e6:.0f}" if memory else "",
            f"{facts['kernels_per_step']:.0f}" if facts.get("kernels_per_step") else "",
            str(facts.get("recompiles_after_warmup")), f"{peak / 2**30:.1f}" if peak else "",
            "; ".join(facts.get("fallbacks") or []) or "none",
        ])  # fmt: skip
    header = [
        "engine",
        "warmup s",
        "capture s",
        "graph MB",
        "kernels/step",
        "recompiles",
        "peak GiB",
        "fallbacks",
    ]
    lines += table(header, engine_rows) + [""]
    costs = []
    for name, facts in result["engines"].items():
        for row in facts.get("overhead", []):
            cells = [name, str(row["context_len"]), *(f"{row[k]:.3f}" for k in OVERHEAD_FIELDS[1:])]
            costs.append([*cells, str(facts.get("inline_batches"))])
    header = [
        "engine",
        "context",
        "health RTT ms",
        "excess ms",
        "engine ms",
        "draft wall ms",
        "inline batches",
    ]
    lines += table(header, costs)
    ahead = [
        [
            name,
            str(row["branches"]),
            f"{row['p50_ms']:.3f}",
            f"{row['batch1_p50_ms']:.3f}",
            f"{row['ratio']:.2f}",
        ]
        for name, facts in result["engines"].items()
        for row in facts.get("ahead_loop", [])
    ]
    if ahead:
        lines += [""] + table(
            ["engine", "branches", "ahead loop p50 ms", "batch-1 draft p50 ms", "ratio"], ahead
        )
    lines += [f"\nskipped: {why}" for why in result["skipped"]]
    return "\n".join(lines)


def plot(rows: list[dict], path, title: str) -> None:
    """report.plot's picture, where matplotlib is installed (a device image may lack it; the tables stand)."""
    try:
        report.plot(rows, str(path), title)
    except ImportError as missing:
        log.warning("no plot: %s", missing)
