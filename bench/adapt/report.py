"""bench/adapt/run.py's report: the stream cut into windows (tokens per round of the fixed and the adapting
drafter, their ratio, the target's tokens/s measured and projected), the goals of docs/adaptation.md checked
against them, the adaptation's costs, a terminal summary, and the files of `--out`: report.json, report.md
(the table bench/README.md quotes) and adapt.png (tokens per round over the stream, in
bench/acceptance_report.py's style)."""

from __future__ import annotations

from pathlib import Path

from bench.acceptance_report import fmt
from bench.harness.projection import GpuModel, project
from bench.harness.report import percentiles, write_report

GOAL_RATIO = 1.3  # the adapting drafter's tokens per round over the fixed one's, after a few thousand tokens
FLOOR_RATIO = 0.98  # never more than 2% below the fixed drafter in any window
SIDES = ("off", "on")


def figures(rows: list[dict], gpu: GpuModel) -> dict:
    """Tokens per round and the target's tokens/s (alone, with each drafter; measured, and projected on
    `gpu`) over some prompts."""
    tokens = sum(r["new_tokens"] for r in rows)
    alone_s = sum(r["alone_s"] for r in rows)
    result = {"tokens": tokens, "alone_tokens_per_s": tokens / alone_s}
    for side in SIDES:
        runs = [r[side] for r in rows]
        round_log = [tuple(entry) for run in runs for entry in run["round_log"]]
        result[side] = {
            "tokens_per_round": sum(run["kept"] for run in runs) / max(1, sum(run["rounds"] for run in runs)),
            "tokens_per_s": tokens / sum(run["seconds"] for run in runs),
            "projected": project(round_log, gpu),
        }
    result["ratio"] = result["on"]["tokens_per_round"] / result["off"]["tokens_per_round"]
    result["measured_tokens_per_s_ratio"] = result["on"]["tokens_per_s"] / result["off"]["tokens_per_s"]
    result["projected_speedup_ratio"] = (
        result["on"]["projected"]["speedup"] / result["off"]["projected"]["speedup"]
    )
    return result


def windows(rows: list[dict], size: int, gpu: GpuModel) -> list[dict]:
    out, served = [], 0
    for start in range(0, len(rows), size):
        chunk = rows[start : start + size]
        out.append({
            "prompts": [start, start + len(chunk) - 1],
            "tokens_served_before": served,
            "version": chunk[-1]["version_before"],  # the adapting server's at the window's last prompt
            **figures(chunk, gpu),
        })  # fmt: skip
        served += sum(r["new_tokens"] for r in chunk)
    return out


def first_calls(rows: list[dict]) -> dict:
    """A prompt's first call prefills it whole; on the adapting server, those right after a swap (the engine
    dropped every cached page) against the others, and the fixed server's, in ms. Swaps land in the idle
    time between prompts here, so a conversation never meets one midway."""
    after_swap = [i > 0 and r["version_before"] != rows[i - 1]["version_before"] for i, r in enumerate(rows)]
    on = [
        (swapped, r["on"]["draft_call_ms"][0])
        for swapped, r in zip(after_swap, rows, strict=True)
        if r["on"]["draft_call_ms"]
    ]
    return {
        "on_after_a_swap": percentiles([ms for swapped, ms in on if swapped]) | {"n": sum(s for s, _ in on)},
        "on_otherwise": percentiles([ms for swapped, ms in on if not swapped]) | {"n": sum(not s for s, _ in on)},
        "off": percentiles([r["off"]["draft_call_ms"][0] for r in rows if r["off"]["draft_call_ms"]]),
    }  # fmt: skip


def costs(rows: list[dict], think_s: float) -> dict:
    """From the adapting server's counters during the think times only (bench/adapt/run.py's TRAINER_COUNTERS):
    a training step's and a swap's time, and how much of the idle time the trainer used."""
    total = {key: sum(r["trainer_in_think"][key] for r in rows) for key in rows[0]["trainer_in_think"]}
    steps, swaps = total["training_steps"], total["swaps"] + total["rollbacks"]
    return {
        "in_think_times": total,
        "training_step_ms": 1e3 * total["training_seconds"] / steps if steps else None,
        "swap_ms": 1e3 * total["swap_seconds"] / swaps if swaps else None,
        "swap_commit_ms": 1e3 * total.get("swap_commit_seconds", 0.0) / swaps if swaps else None,
        "trainer_seconds": sum(
            total[key] for key in ("training_seconds", "making_seconds", "scoring_seconds", "swap_seconds")
        ),
        "think_seconds": think_s * len(rows),
        "first_call_ms": first_calls(rows),
        "call_ms": {
            side: percentiles([ms for r in rows for ms in r[side]["draft_call_ms"]]) for side in SIDES
        },
    }


def summarize(rows: list[dict], window: int, gpu: GpuModel, think_s: float) -> dict:
    cut = windows(rows, window, gpu)
    at_goal = next((w for w in cut if w["ratio"] >= GOAL_RATIO), None)
    return {
        "lossless": all(r[side]["lossless"] for r in rows for side in SIDES),
        "not_lossless": [r["name"] for r in rows if not (r["off"]["lossless"] and r["on"]["lossless"])],
        "windows": cut,
        "whole_stream": figures(rows, gpu),
        "second_half": figures(rows[len(rows) // 2 :], gpu),
        "goal": {
            "ratio": GOAL_RATIO,
            "first_window_at_goal": at_goal and cut.index(at_goal),
            "tokens_served_before_it": at_goal and at_goal["tokens_served_before"],
            "windows_at_goal_from_then": at_goal and sum(w["ratio"] >= GOAL_RATIO for w in cut[cut.index(at_goal) :]),
            "windows_from_then": at_goal and len(cut) - cut.index(at_goal),
            "floor": FLOOR_RATIO,
            "windows_below_floor": [i for i, w in enumerate(cut) if w["ratio"] < FLOOR_RATIO],
        },
        "costs": costs(rows, think_s),
    }  # fmt: skip


PAIR_NAMES = {
    "testbed": "Testbed pair",
    "realpair": "Real pair (Qwen2.5-Coder-1.5B-Instruct target, Qwen2.5-Coder-0.5B-Instruct drafter)",
}


def adapted_weights(rank: int) -> str:
    return f"rank-{rank} adapters" if rank else "every decoder weight"


def markdown(report: dict) -> str:
    config, machine, summary = report["config"], report["machine"], report["summary"]
    goal, adaptation, cost = summary["goal"], report["adaptation"], summary["costs"]
    lines = [
        f"{PAIR_NAMES[config.get('pair_kind', 'testbed')]}, drafter {config['drafter']['model']} "
        f"({config['drafter']['quantization']}; adapting with {adapted_weights(config.get('adapt_rank', 0))}), "
        f"target fp32 on the CPU; stream: {config['stream']['domain']}, {config['num_prompts']} prompts of "
        f"{config['max_new_tokens']} new tokens, k = {config['num_draft_tokens']}, model drafts, "
        f"{config['think_s']} s idle after each prompt (the adapting server paused while the target alone and "
        f"the fixed drafter are timed); {machine['cpu']}, {machine['cpu_cores']} cores, "
        f"{machine['date']}, {config['wall_s'] / 60:.1f} min. Lossless (every output exactly the target's "
        f"alone): {'yes' if summary['lossless'] else 'NO'}.",
        "",
        "| window (prompts) | tokens served before | version | tokens/round off | on | on / off "
        "| tok/s alone | off | on | on / off | projected speedup off | on |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for w in summary["windows"]:
        lines.append(
            f"| {w['prompts'][0]}-{w['prompts'][1]} | {w['tokens_served_before']} | {w['version']} "
            f"| {w['off']['tokens_per_round']:.2f} | {w['on']['tokens_per_round']:.2f} | **{w['ratio']:.2f}** "
            f"| {w['alone_tokens_per_s']:.3g} | {w['off']['tokens_per_s']:.3g} | {w['on']['tokens_per_s']:.3g} "
            f"| {w['measured_tokens_per_s_ratio']:.2f} | {fmt(w['off']['projected']['speedup'])} "
            f"| {fmt(w['on']['projected']['speedup'])} |"
        )
    lines += ["", "| part of the stream | tokens/round off | on | on / off | tok/s alone | off | on | on / off "
              "| projected speedup off | on | on / off |", "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, key in (("whole", "whole_stream"), ("second half", "second_half")):
        f = summary[key]
        lines.append(
            f"| {name} | {f['off']['tokens_per_round']:.2f} | {f['on']['tokens_per_round']:.2f} | **{f['ratio']:.2f}** "
            f"| {f['alone_tokens_per_s']:.3g} | {f['off']['tokens_per_s']:.3g} | {f['on']['tokens_per_s']:.3g} "
            f"| {f['measured_tokens_per_s_ratio']:.2f} | {fmt(f['off']['projected']['speedup'])} "
            f"| {fmt(f['on']['projected']['speedup'])} | {f['projected_speedup_ratio']:.2f} |"
        )
    reached = (
        f"first reached in window {goal['first_window_at_goal']}, after {goal['tokens_served_before_it']} "
        f"target tokens served; {goal['windows_at_goal_from_then']} of the {goal['windows_from_then']} windows "
        "from then on at or above it"
        if goal["first_window_at_goal"] is not None
        else "not reached in any window"
    )
    first = cost["first_call_ms"]
    lines += [
        "",
        f"- Goal {goal['ratio']}x tokens per round: {reached}. Windows below {goal['floor']}x: "
        f"{goal['windows_below_floor'] or 'none'}.",
        f"- Adaptation at the end: version {adaptation['version']}, {adaptation['swaps']} swaps, "
        f"{adaptation['rejected_candidates']} rejected candidates, {adaptation['rollbacks']} rollbacks, "
        f"{adaptation['training_steps']} training steps.",
        f"- Costs: a training step {fmt(cost['training_step_ms'])} ms, a swap {fmt(cost['swap_ms'])} ms "
        f"(its commit, the part a request waits for: {fmt(cost.get('swap_commit_ms'))} ms); the "
        f"trainer (training, scoring, swaps) ran {cost['trainer_seconds']:.1f} s of the "
        f"{cost['think_seconds']:.0f} s of think time (counted there only). A prompt's first call (its prefill): {fmt(first['on_after_a_swap']['p50'], '.1f')} ms "
        f"p50 right after a swap (n = {first['on_after_a_swap']['n']}; swaps fall between prompts, so no "
        f"conversation re-prefills midway), {fmt(first['on_otherwise']['p50'], '.1f')} ms "
        f"otherwise, {fmt(first['off']['p50'], '.1f')} ms on the fixed server. Calls p50 / p99: off "
        f"{fmt(cost['call_ms']['off']['p50'], '.1f')} / {fmt(cost['call_ms']['off']['p99'], '.1f')} ms, on "
        f"{fmt(cost['call_ms']['on']['p50'], '.1f')} / {fmt(cost['call_ms']['on']['p99'], '.1f')} ms.",
        f"- Projected: {config['gpu_model']['name']}: verify {config['gpu_model']['verify_ms']:.3g} ms, draft "
        f"{config['gpu_model']['draft_overhead_ms']:.3g} ms + {config['gpu_model']['draft_step_ms']:.3g} ms per "
        f"token. {config['gpu_model']['basis']}",
        f"- Stream: {', '.join(config['stream']['files'])} (sha256 {config['stream']['sha256'][:16]}).",
    ]
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cut = report["summary"]["windows"]
    served = [w["tokens_served_before"] + w["tokens"] for w in cut]
    figure, axes = plt.subplots(1, 2, figsize=(11, 4))
    axes[0].plot(served, [w["off"]["tokens_per_round"] for w in cut], marker="o", label="--adapt off")
    axes[0].plot(served, [w["on"]["tokens_per_round"] for w in cut], marker="o", label="--adapt on")
    axes[0].set(
        title="tokens per round, per window", xlabel="target tokens served", ylabel="tokens per round"
    )
    axes[1].plot(served, [w["ratio"] for w in cut], marker="o", color="C2", label="on / off")
    axes[1].axhline(GOAL_RATIO, color="C3", linewidth=0.8, linestyle="--", label=f"goal {GOAL_RATIO}x")
    axes[1].axhline(FLOOR_RATIO, color="grey", linewidth=0.8, label=f"floor {FLOOR_RATIO}x")
    axes[1].set(title=f"on / off ({report['machine']['cpu']})", xlabel="target tokens served", ylabel="ratio")
    for ax in axes:
        ax.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def write_outputs(report: dict, directory: Path) -> None:
    write_report(directory, report, markdown(report))
    plot(report, directory / "adapt.png")


def print_summary(report: dict) -> None:
    summary = report["summary"]
    for i, w in enumerate(summary["windows"]):
        print(
            f"window {i:>2} (after {w['tokens_served_before']:>5} tokens, v{w['version']}): tokens/round "
            f"off {w['off']['tokens_per_round']:.2f} on {w['on']['tokens_per_round']:.2f} = {w['ratio']:.2f}x, "
            f"tok/s off {w['off']['tokens_per_s']:.3g} on {w['on']['tokens_per_s']:.3g}"
        )
    whole, goal = summary["whole_stream"], summary["goal"]
    print(
        f"whole stream: {whole['ratio']:.2f}x tokens/round, {whole['measured_tokens_per_s_ratio']:.2f}x tok/s "
        f"measured, {whole['projected_speedup_ratio']:.2f}x projected; goal first met in window "
        f"{goal['first_window_at_goal']}, windows below {goal['floor']}x: {goal['windows_below_floor']}; "
        f"lossless {'yes' if summary['lossless'] else 'NO: ' + ', '.join(summary['not_lossless'])}"
    )
