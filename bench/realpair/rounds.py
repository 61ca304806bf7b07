"""`python -m bench.realpair rounds [--quick] [--out DIR]`: tokens per round at every fixed k, over every
prompt of the real workloads, exactly, without running the speculative loop once per k.

Why it is exact: greedy drafting from a context the target agreed with so far drafts, at each position,
the drafter's greedy token after the target's own prefix (every earlier draft of the round equalled the
target's token, or the round had stopped). So one k = 1 draft per position of the target's greedy output,
"does the drafter's next token after the target's prefix equal the target's?", decides every round of every
k: a round starting at t keeps the run of agreements from t, at most k (and never past the output's end),
then adds the target's own token. bench.acceptance measures the same rounds through the real loop on the
quick prompts; the two agree up to near-ties (a decode step's rounding is not a prefill's).

Per prompt: the target's greedy output (timed: the alone tokens/s), then one draft call per output
position to a drafter server on the served FP8 export (model drafts, no drafting ahead; its prefix cache
prefills one new token a call). Reported per workload and k: tokens per round, acceptance by position, the
projected GPU speedups (bench/harness/gpu_floors.py), and a CPU figure *modelled* from the target's measured
step and per-token verify cost and the server's measured draft costs (the quick run measures the real one).
About 35 minutes for all 54 prompts at 64 new tokens on 2 cores, most of it the target's decoding.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tqdm import tqdm

from bench.harness.decoding import (
    PAIR_DRAFTERS,
    load_target,
    server_info,
    started_server,
    target_cost_flags,
    target_greedy,
    timed,
)
from bench.harness.gpu_floors import GPU_MODELS
from bench.harness.machine import describe
from bench.harness.projection import project
from bench.harness.prompts import WARMUP_PROMPT_LEN, WARMUP_SEED, random_prompts
from bench.realpair import benchmark as realpair
from drafter.client import DraftClient

KS = (1, 2, 3, 4, 6, 8, 12, 16)
MAX_NEW_TOKENS = 64
SERVER_FLAGS = ["--draft-source", "model", "--draft-ahead", "0", "--max-seq-len", "4096"]


def agreement(client: DraftClient, prompt: list[int], output: list[int]) -> list[bool]:
    """Per position t of the target's output: does the drafter's greedy token after prompt + output[:t]
    equal output[t]?"""
    return [
        client.draft(prompt + output[:t], 1, source="model").tokens == output[t : t + 1]
        for t in range(len(output))
    ]


def round_log(agree: list[bool], k: int) -> list[tuple[int, int]]:
    """(drafts, kept) per round of a k-draft loop over an output these agreements describe: a round at t
    drafts at most k and never past the output's last token, keeps the run of agreements from t, then the
    target adds its own token."""
    log, t, n = [], 0, len(agree)
    while t < n:
        drafts = min(k, n - 1 - t)
        kept = 0
        while kept < drafts and agree[t + kept]:
            kept += 1
        log.append((drafts, kept))
        t += kept + 1
    return log


def summarize(agreements: list[list[bool]], k: int, costs: dict, gpus) -> dict:
    """A workload's figures at one k: tokens per round, acceptance by position, projections."""
    logs = [round_log(agree, k) for agree in agreements]
    rounds = [entry for log in logs for entry in log]
    tokens = sum(kept + 1 for _, kept in rounds)
    drafted_at = [sum(1 for drafts, _ in rounds if drafts > j) for j in range(k)]
    kept_at = [sum(1 for drafts, kept in rounds if drafts > j and kept > j) for j in range(k)]
    cpu_ms = sum(
        costs["step_ms"]
        + drafts * costs["per_token_ms"]
        + (costs["draft_base_ms"] + drafts * costs["draft_step_ms"] if drafts else 0.0)
        for drafts, _ in rounds
    )
    called = [(drafts, kept, drafts > 0) for drafts, kept in rounds]
    return {
        "k": k,
        "rounds": len(rounds),
        "tokens_per_round": tokens / len(rounds),
        "acceptance_by_position": [
            kept / drafted if drafted else None for kept, drafted in zip(kept_at, drafted_at, strict=True)
        ],
        "cpu_modelled_speedup": tokens * costs["step_ms"] / cpu_ms,
        "projected": {gpu.name: project(called, gpu)["speedup"] for gpu in gpus},
    }


def run(args) -> dict:
    directory = args.dir
    realpair.check_fetched(directory, PAIR_DRAFTERS["weight-only"])
    tokenizer = realpair.chat_tokenizer(directory / realpair.TARGET)
    workloads = realpair.workload_entries(tokenizer, args.quick)
    model = load_target(directory / realpair.TARGET, "cpu", "float32")
    generation = realpair.plain_greedy(model, tokenizer)
    [warmup] = random_prompts(model.config.vocab_size, WARMUP_PROMPT_LEN, (WARMUP_PROMPT_LEN,), WARMUP_SEED)
    cost_flags, step_ms, per_token_ms = target_cost_flags(model, warmup, args)
    flags = ["--model", str(directory / PAIR_DRAFTERS["weight-only"]), "--device", "cpu", *SERVER_FLAGS]
    gpus = [GPU_MODELS[name] for name in realpair.GPU_MODELS]
    total = sum(map(len, workloads.values()))
    per_prompt, started = [], time.perf_counter()
    with started_server(flags + cost_flags) as url, DraftClient(url, timeout_s=60) as client:
        policy = server_info(client)["draft_length_policy"]
        costs = dict(step_ms=step_ms, per_token_ms=per_token_ms)
        costs.update(draft_base_ms=policy["draft_base_ms"], draft_step_ms=policy["step_ms_at_startup"])
        with tqdm(total=total, desc="rounds", unit="prompt", file=sys.stderr) as bar:
            for kind, entries in workloads.items():
                for where, entry in entries:
                    prompt = entry["tokens"]
                    output, seconds = timed(target_greedy, model, prompt, args.max_new_tokens, True)
                    agree = agreement(client, prompt, output)
                    per_prompt.append(
                        dict(kind=kind, prompt=where, alone_s=seconds, output=output, agree=agree)
                    )
                    bar.update()
    results = []
    for kind in workloads:
        rows = [p for p in per_prompt if p["kind"] == kind]
        agreements = [p["agree"] for p in rows]
        alone = sum(len(p["output"]) for p in rows) / sum(p["alone_s"] for p in rows)
        for k in args.k:
            results.append(
                {"workload": kind, "alone_tokens_per_s": alone, **summarize(agreements, k, costs, gpus)}
            )
    return {
        "results": results,
        "prompts": per_prompt,
        "config": {
            "pair": str(directory),
            "quick": args.quick,
            "max_new_tokens": args.max_new_tokens,
            "k": list(args.k),
            "generation": generation,
            "costs": costs,
            "gpu_models": [gpu.as_dict() for gpu in gpus],
            "seconds": time.perf_counter() - started,
        },
        "machine": describe("cpu"),
    }


def markdown(report: dict) -> str:
    config, machine = report["config"], report["machine"]
    gpu_names = [gpu["name"] for gpu in config["gpu_models"]]
    costs = config["costs"]
    lines = [
        f"Target {config['pair']}/target (cpu, float32), drafter FP8 weight-only; "
        f"{len(report['prompts'])} prompts, up to {config['max_new_tokens']} new tokens each (greedy, to EOS); "
        f"{machine.get('cpu', '?')}, {machine.get('cpu_cores', '?')} cores; {config['seconds'] / 60:.0f} min.",
        "",
        "| workload | k | tokens/round | acceptance by position | CPU speedup, modelled | "
        + " | ".join(f"projected, {name}" for name in gpu_names)
        + " |",
        "|---|---|---|---|---|" + "---|" * len(gpu_names),
    ]
    for row in report["results"]:
        positions = " ".join(f"{p:.2f}" if p is not None else "-" for p in row["acceptance_by_position"][:8])
        more = " ..." if row["k"] > 8 else ""
        projected = " | ".join(f"{row['projected'][name]:.2f}" for name in gpu_names)
        lines.append(
            f"| {row['workload']} | {row['k']} | {row['tokens_per_round']:.2f} | {positions}{more} | "
            f"{row['cpu_modelled_speedup']:.2f} | {projected} |"
        )
    lines += [
        "",
        f"CPU model: target step {costs['step_ms']:.0f} ms + {costs['per_token_ms']:.0f} ms per more token "
        f"verified; a draft call {costs['draft_base_ms']:.0f} ms + {costs['draft_step_ms']:.0f} ms a step "
        "(the server's startup measure); the target alone "
        + ", ".join(
            f"{r['workload']} {r['alone_tokens_per_s']:.2f}"
            for r in report["results"]
            if r["k"] == config["k"][0]
        )
        + " tokens/s.",
    ]
    return "\n".join(lines) + "\n"


def add_parser(commands) -> None:
    parser = commands.add_parser("rounds", help="tokens per round at every k, exactly, on every prompt")
    parser.add_argument("--dir", type=Path, default=realpair.DEFAULT_DIR, help="the fetched pair")
    parser.add_argument("--quick", action="store_true", help="the quick prompts only, 2 per kind")
    parser.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS, help=f"[{MAX_NEW_TOKENS}]")
    parser.add_argument(
        "--k",
        type=lambda text: tuple(int(k) for k in text.split(",")),
        default=KS,
        help="[1,2,3,4,6,8,12,16]",
    )
    parser.add_argument("--out", type=Path, help="write report.json and report.md here")


def main(args: argparse.Namespace) -> int:
    report = run(args)
    text = markdown(report)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "report.json").write_text(json.dumps(report, indent=1))
        (args.out / "report.md").write_text(text)
    print(text)
    return 0
