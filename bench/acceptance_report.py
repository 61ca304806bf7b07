"""bench/acceptance.py's report: each run's record (from its SpeculationStats and outputs), the per-workload
summary (`"auto"` against the best fixed k chosen afterwards), a terminal summary, and the files of `--out`:
report.json, report.md (the tables bench/README.md quotes) and speedup.png (speedup by k per workload,
measured on this machine and projected for the GPU)."""

from __future__ import annotations

from pathlib import Path

from bench.harness.projection import project
from bench.harness.report import percentiles, write_report

AUTO = "auto"


def first_mismatch(output: list[int], reference: list[int]) -> int | None:
    if output == reference:
        return None
    shorter = min(len(output), len(reference))
    return next((i for i in range(shorter) if output[i] != reference[i]), shorter)


def result(k, stats, outputs, reference, alone_s: float, speculative_s: float, gpus) -> dict:
    """One run's record: its SpeculationStats, its outputs against the target alone's, both wall times and
    the same rounds projected on each of `gpus` (bench.harness.projection.GpuModel; `projected_gpu` is the
    first one's, `projected_gpu_by_model` all of them by name)."""
    mismatches = [first_mismatch(out, ref) for out, ref in zip(outputs, reference, strict=True)]
    tokens = sum(map(len, outputs))
    wait_s = sum(stats.draft_call_ms) / 1e3
    return {
        "num_draft_tokens": k,
        "mean_accepted_tokens": stats.mean_accepted_tokens,
        "acceptance_by_position": stats.acceptance_by_position,
        "mean_drafts_per_round": sum(d for d, _, _ in stats.round_log) / max(1, stats.num_rounds),
        "suffix_draft_share": sum(stats.suffix_log) / max(1, sum(d for d, _, _ in stats.round_log)),
        "lossless": all(m is None for m in mismatches),
        "first_mismatch": mismatches,
        "target_only_s": alone_s,
        "speculative_s": speculative_s,
        "target_tokens_per_s": sum(map(len, reference)) / alone_s,
        "speculative_tokens_per_s": tokens / speculative_s,
        "speedup": alone_s / speculative_s,
        "draft_wait_share": wait_s / speculative_s,
        "rounds": stats.num_rounds,
        "split_ms_per_round": {
            "verify": sum(stats.verify_ms) / max(1, stats.num_rounds),
            "draft_engine": sum(stats.draft_engine_ms) / max(1, stats.num_rounds),
            "draft_http_and_client": (sum(stats.draft_call_ms) - sum(stats.draft_engine_ms))
            / max(1, stats.num_rounds),
        },
        "draft_call_ms": percentiles(stats.draft_call_ms),
        "projected_gpu": project(stats.round_log, gpus[0], stats.suffix_log),
        "projected_gpu_by_model": {gpu.name: project(stats.round_log, gpu, stats.suffix_log) for gpu in gpus},
        "outputs": outputs,
        "target_only_outputs": reference,
    }


def run_name(row: dict, results: list[dict]) -> str:
    """A row's workload, and its draft source where the run measured more than one."""
    if len({r.get("source", "model") for r in results}) == 1:
        return row["workload"]
    return f"{row['workload']} ({row.get('source', 'model')})"


def summarize(results: list[dict]) -> dict:
    """Per workload (and source): the best fixed k afterwards (measured and projected), and `"auto"` against
    it."""
    summary = {}
    for name in dict.fromkeys(run_name(r, results) for r in results):
        rows = [r for r in results if run_name(r, results) == name]
        workload = name
        fixed = [r for r in rows if r["num_draft_tokens"] != AUTO]
        auto = next((r for r in rows if r["num_draft_tokens"] == AUTO), None)
        entry = {}
        for name, speedup_of in (("measured", lambda r: r["speedup"]), ("projected", lambda r: r["projected_gpu"]["speedup"])):  # fmt: skip
            best = max(fixed, key=speedup_of, default=None)
            entry[name] = {
                "best_fixed_k": best and best["num_draft_tokens"],
                "best_fixed_speedup": best and speedup_of(best),
                "auto_speedup": auto and speedup_of(auto),
                "auto_over_best": (auto and best) and speedup_of(auto) / speedup_of(best),
            }
        summary[workload] = entry
    return summary


def fmt(value, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def markdown(report: dict) -> str:
    config, machine = report["config"], report["machine"]
    gpus = config["gpu_models"]
    lines = [
        f"Target `{config['target']}` ({config['device']}, {config['dtype']}), drafter {config['drafter']['model']} "
        f"({config['drafter']['quantization']}), {config['max_new_tokens']} new tokens per prompt, "
        f"prompts per workload {config['num_prompts']}; {machine['cpu']}, {machine['cpu_cores']} cores, "
        f"{machine['date']}. Lossless (every output exactly the target's alone): "
        f"{'yes' if report['lossless'] else 'NO'}.",
        "",
        "| workload | source | k | alone tok/s | with drafts tok/s | speedup | tokens/round | drafts/round "
        "| from suffix | acceptance by position | waiting for drafts | lossless | "
        + " | ".join(f"projected speedup, {gpu['name']}" for gpu in gpus)
        + " |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|" + "---|" * len(gpus),
    ]
    for r in report["results"]:
        by_position = " ".join(fmt(a) for a in r["acceptance_by_position"][:8])
        if len(r["acceptance_by_position"]) > 8:
            by_position += " ..."
        lines.append(
            f"| {r['workload']} | {r.get('source', 'model')} | {r['num_draft_tokens']} | {r['target_tokens_per_s']:.1f} "
            f"| {r['speculative_tokens_per_s']:.1f} | **{r['speedup']:.2f}** | {r['mean_accepted_tokens']:.2f} "
            f"| {r['mean_drafts_per_round']:.1f} | {100 * r.get('suffix_draft_share', 0):.0f}% | {by_position} | {100 * r['draft_wait_share']:.0f}% "
            f"| {'yes' if r['lossless'] else 'NO'} | "
            + " | ".join(fmt(r["projected_gpu_by_model"][gpu["name"]]["speedup"]) for gpu in gpus)
            + " |"
        )
    lines += [
        "",
        "Projected GPU columns: the measured rounds replayed on a cost model (bench/harness/projection.py):",
        "",
    ]
    lines += [f"- {gpu['name']}: verify {gpu['verify_ms']:.3g} ms, draft {gpu['draft_overhead_ms']:.3g} ms + "
              f"{gpu['draft_step_ms']:.3g} ms per token. {gpu['basis']}" for gpu in gpus]  # fmt: skip
    lines += ["", f'`"auto"` against the best fixed k chosen afterwards (projected: {gpus[0]["name"]}):',
              "",
              "| workload | measured: best k | its speedup | auto | auto / best | projected: best k | its speedup "
              "| auto | auto / best |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for workload, entry in report["summary"].items():
        cells = []
        for name in ("measured", "projected"):
            e = entry[name]
            cells += [
                str(e["best_fixed_k"]),
                fmt(e["best_fixed_speedup"]),
                fmt(e["auto_speedup"]),
                fmt(e["auto_over_best"]),
            ]
        lines.append(f"| {workload} | " + " | ".join(cells) + " |")
    lines += ["", "Where a round's time went, ms per round (verify: the target's forward; engine: the server's "
              "drafting; HTTP and client: the rest of the call):", "",
              "| workload | source | k | verify | draft engine | HTTP and client |", "|---|---|---|---|---|---|"]  # fmt: skip
    for r in report["results"]:
        split = r["split_ms_per_round"]
        lines.append(f"| {r['workload']} | {r.get('source', 'model')} | {r['num_draft_tokens']} | {split['verify']:.2f} | "
                     f"{split['draft_engine']:.2f} | {split['draft_http_and_client']:.2f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=False)
    for workload in report["summary"]:
        rows = [r for r in report["results"] if run_name(r, report["results"]) == workload]
        labels = [str(r["num_draft_tokens"]) for r in rows]
        axes[0].plot(labels, [r["speedup"] for r in rows], marker="o", label=workload)
        axes[1].plot(labels, [r["projected_gpu"]["speedup"] for r in rows], marker="o", label=workload)
    for ax, title in zip(
        axes,
        (f"measured ({report['machine']['cpu']})", f"projected: {report['config']['gpu_models'][0]['name']}"),
        strict=True,
    ):
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set(title=title, xlabel="num_draft_tokens", ylabel="target speedup")
        ax.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def write_outputs(report: dict, directory: Path) -> None:
    write_report(directory, report, markdown(report))
    plot(report, directory / "speedup.png")


def print_summary(report: dict) -> None:
    for r in report["results"]:
        projected = ", ".join(
            f"{name} {fmt(p['speedup'])}x" for name, p in r["projected_gpu_by_model"].items()
        )
        print(
            f"{r['workload']:>8} {r.get('source', 'model'):>6} k={r['num_draft_tokens']!s:<4} speedup {r['speedup']:.2f}x "
            f"(projected: {projected}), {r['mean_accepted_tokens']:.2f} tokens/round, "
            f"waiting {100 * r['draft_wait_share']:.0f}%, lossless {'yes' if r['lossless'] else 'NO'}"
        )
        if not r["lossless"]:
            differing = [
                f"prompt {i} at new token {m}" for i, m in enumerate(r["first_mismatch"]) if m is not None
            ]
            print(f"  output differs: {', '.join(differing)}")
