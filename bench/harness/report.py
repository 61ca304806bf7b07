"""Latencies → result rows, ratios against the baseline of the same run, a terminal table and a plot; and
percentiles of any measurements."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

BASELINE = "hf-generate"
KEY_FIELDS = ("pattern", "context_len", "num_draft_tokens")


def summarize(case: dict, latencies_s: list[float], floor: float) -> dict:
    ms = np.asarray(latencies_s) * 1e3
    mean = float(ms.mean())
    return {
        **case,
        "calls": len(ms),
        "p50_ms": float(np.percentile(ms, 50)),
        "p90_ms": float(np.percentile(ms, 90)),
        "p99_ms": float(np.percentile(ms, 99)),
        "mean_ms": mean,
        "min_ms": float(ms.min()),  # the least disturbed call: on a shared machine, the closest to its speed
        # Closed-loop clients: by Little's law, requests in flight / mean latency.
        "throughput_rps": case["concurrency"] / mean * 1e3,
        # A call's p50 per draft token: a decode step's cost, with the call's fixed cost spread over k.
        "step_ms": float(np.percentile(ms, 50)) / case["num_draft_tokens"],
        "floor_ms": floor,
        "floor_fraction": floor / float(np.percentile(ms, 50)),
    }


def percentiles(values: list[float]) -> dict:
    """p50, p99 and mean of some measurements (None for each, of none)."""
    if not values:
        return {"p50": None, "p99": None, "mean": None}
    p50, p99 = np.percentile(values, [50, 99])
    return {"p50": float(p50), "p99": float(p99), "mean": float(np.mean(values))}


def add_ratios(rows: list[dict]) -> None:
    """`speedup_vs_hf_generate`: the baseline's p50 over ours, for single-client rows of the same case;
    `http_minus_in_process_ms`: on http rows, what the HTTP path adds to the in-process engine's p50."""
    baseline = {tuple(r[f] for f in KEY_FIELDS): r["p50_ms"] for r in rows if r["variant"] == BASELINE}
    eager = {
        tuple(r[f] for f in (*KEY_FIELDS, "concurrency")): r["p50_ms"]
        for r in rows
        if r["variant"] == "eager"
    }
    for row in rows:
        reference = baseline.get(tuple(row[f] for f in KEY_FIELDS))
        if row["concurrency"] == 1 and reference is not None:
            row["speedup_vs_hf_generate"] = reference / row["p50_ms"]
        in_process = eager.get(tuple(row[f] for f in (*KEY_FIELDS, "concurrency")))
        if row["variant"] == "http" and in_process is not None:
            row["http_minus_in_process_ms"] = row["p50_ms"] - in_process


COLUMNS = [
    ("variant", "{}"),
    ("pattern", "{}"),
    ("context_len", "{}"),
    ("num_draft_tokens", "{}"),
    ("concurrency", "{}"),
    ("p50_ms", "{:.2f}"),
    ("p90_ms", "{:.2f}"),
    ("p99_ms", "{:.2f}"),
    ("mean_ms", "{:.2f}"),
    ("throughput_rps", "{:.1f}"),
    ("step_mb", "{:.1f}"),
    ("step_ms", "{:.2f}"),
    ("floor_fraction", "{:.1%}"),
    ("speedup_vs_hf_generate", "{:.1f}x"),
    ("http_minus_in_process_ms", "{:+.2f}"),
]
HEADERS = {"context_len": "ctx", "num_draft_tokens": "k", "concurrency": "c", "throughput_rps": "req/s",
           "step_mb": "MB/step", "step_ms": "ms/step", "floor_fraction": "of floor", "speedup_vs_hf_generate": "vs hf-generate",
           "http_minus_in_process_ms": "http - in-process"}  # fmt: skip


def table(rows: list[dict]) -> str:
    """A Markdown table (it reads on a terminal and pastes into bench/README.md)."""
    names = [HEADERS.get(name, name) for name, _ in COLUMNS]
    lines = ["| " + " | ".join(names) + " |", "|" + "---|" * len(names)]
    for row in rows:
        cells = [fmt.format(row[name]) if name in row else "" for name, fmt in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[dict], path: str, title: str) -> None:
    """p50 latency vs context length, one line per variant and pattern, for single-client rows."""
    import matplotlib

    matplotlib.use("Agg")  # files only; no display on a server
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogFormatter, NullFormatter

    single = [r for r in rows if r["concurrency"] == 1]
    k = max(
        {r["num_draft_tokens"] for r in single}, key=lambda k: sum(r["num_draft_tokens"] == k for r in single)
    )
    figure, axes = plt.subplots(figsize=(8, 5))
    for variant in dict.fromkeys(r["variant"] for r in single):
        for pattern, style in (("growing", "-"), ("cold", "--")):
            points = sorted(
                (r["context_len"], r["p50_ms"])
                for r in single
                if r["variant"] == variant and r["pattern"] == pattern and r["num_draft_tokens"] == k
            )
            if len(points) > 1:
                xs, ys = zip(*points, strict=True)
                axes.plot(xs, ys, style, marker="o", label=f"{variant} ({pattern})")
    axes.set(
        xscale="log",
        yscale="log",
        xlabel="context length (tokens)",
        ylabel=f"p50 latency of a {k}-token draft (ms)",
    )
    # Plain numbers on both log axes ("2048", "200", not "2x10^3"): x ticks at the measured context
    # lengths; y labels minor ticks too when the latencies span less than a few decades.
    axes.set_xticks(sorted({r["context_len"] for r in single}))
    axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axes.xaxis.set_minor_formatter(NullFormatter())
    axes.yaxis.set_major_formatter(LogFormatter(labelOnlyBase=False))
    axes.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))
    axes.set_title(f"{title}\nk = {k} draft tokens, 1 client (one request at a time)")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def write_report(directory: Path, report: dict, markdown: str) -> None:
    """A benchmark's report.json and report.md in `directory` (made if missing)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    (directory / "report.md").write_text(markdown)


def publish(report: dict, markdown: str, directory: Path | None) -> None:
    """A benchmark's markdown on stdout, and both files in `directory` when one is given (`--out`)."""
    if directory is not None:
        write_report(directory, report, markdown)
    print(markdown)
