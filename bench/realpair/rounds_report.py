"""The rounds benchmark's report (bench/realpair/rounds.py): per workload and k, tokens per round, acceptance by
position and the speedups; with several drafters, each against bf16 (or the first), and how often its greedy
token differs from that one's."""

from __future__ import annotations


def differ_share(report: dict, drafter: str, reference: str) -> float:
    """How often `drafter`'s greedy token differs from `reference`'s over every position."""
    pairs = [
        (a, b)
        for mine, theirs in zip(
            report["drafters"][drafter]["tokens"], report["drafters"][reference]["tokens"], strict=True
        )
        for a, b in zip(mine, theirs, strict=True)
    ]
    return sum(a != b for a, b in pairs) / len(pairs)


def markdown(report: dict) -> str:
    config, machine = report["config"], report["machine"]
    gpu_names = [gpu["name"] for gpu in config["gpu_models"]]
    first = config["drafters"][0]
    costs = report["drafters"][first]["costs"]
    lines = [
        f"Target {config['pair']}/target (cpu, float32), drafter {first}; {len(report['prompts'])} prompts, "
        f"up to {config['max_new_tokens']} new tokens each (greedy, to EOS); {machine.get('cpu', '?')}, "
        f"{machine.get('cpu_cores', '?')} cores; {config['seconds'] / 60:.0f} min in all.",
        "",
        "| workload | k | tokens/round | acceptance by position | CPU speedup, modelled | "
        + " | ".join(f"projected, {name}" for name in gpu_names)
        + " |",
        "|---|---|---|---|---|" + "---|" * len(gpu_names),
    ]
    for row in report["results"]:
        if row["drafter"] != first:
            continue
        positions = " ".join(f"{p:.2f}" if p is not None else "-" for p in row["acceptance_by_position"][:8])
        more = " ..." if row["k"] > 8 else ""
        projected = " | ".join(f"{row['projected'][name]:.2f}" for name in gpu_names)
        lines.append(
            f"| {row['workload']} | {row['k']} | {row['tokens_per_round']:.2f} | {positions}{more} | "
            f"{row['cpu_modelled_speedup']:.2f} | {projected} |"
        )
    alone = {r["workload"]: r["alone_tokens_per_s"] for r in report["results"]}
    lines += [
        "",
        f"CPU model: target step {costs['step_ms']:.0f} ms + {costs['per_token_ms']:.0f} ms per more token "
        f"verified; a draft call {costs['draft_base_ms']:.0f} ms + {costs['draft_step_ms']:.0f} ms a step "
        "(the server's startup measure). The target alone: "
        + ", ".join(f"{kind} {tokens_per_s:.2f}" for kind, tokens_per_s in alone.items())
        + " tokens/s.",
    ]
    if len(config["drafters"]) > 1:
        reference = "bf16" if "bf16" in config["drafters"] else first
        lines += ["", "Drafters against each other, tokens per round (mean over workloads), and how often each"
                  f" one's greedy token differs from {reference}'s:", "",
                  "| drafter | " + " | ".join(f"k = {k}" for k in config["k"]) + f" | vs {reference} at k = 4 | "
                  f"greedy token differs from {reference}'s |",
                  "|---|" + "---|" * (len(config["k"]) + 2)]  # fmt: skip
        by = {
            (r["drafter"], r["k"]): [
                x["tokens_per_round"]
                for x in report["results"]
                if (x["drafter"], x["k"]) == (r["drafter"], r["k"])
            ]
            for r in report["results"]
        }
        mean = {key: sum(values) / len(values) for key, values in by.items()}
        for drafter in config["drafters"]:
            ratio = mean[(drafter, 4)] / mean[(reference, 4)] if (drafter, 4) in mean else float("nan")
            cells = " | ".join(f"{mean[(drafter, k)]:.3f}" for k in config["k"])
            lines.append(
                f"| {drafter} | {cells} | {ratio:.3f} | {100 * differ_share(report, drafter, reference):.1f}% |"
            )
    return "\n".join(lines) + "\n"
