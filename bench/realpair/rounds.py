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
position to a drafter server on the served FP8 export (model drafts, no drafting ahead; all of a prompt's
positions in flight at once, batched by the server). `--drafters weight-only,dynamic,bf16` repeats the draft
calls for each drafter on the same target outputs: what FP8 costs, on every prompt, and how often each
one's greedy token differs from bf16's. Reported per workload and k: tokens per round, acceptance by position, the
projected GPU speedups (bench/harness/gpu_floors.py), and a CPU figure *modelled* from the target's measured
step and per-token verify cost and the server's measured draft costs (the quick run measures the real one).
About 35 minutes for all 54 prompts at 64 new tokens on 2 cores, most of it the target's decoding.
"""

from __future__ import annotations

import argparse
import asyncio
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
from bench.harness.prompts import WARMUP_PROMPT_LEN, WARMUP_SEED, BenchError, random_prompts
from bench.harness.report import publish
from bench.realpair import benchmark as realpair
from bench.realpair.rounds_report import markdown
from drafter.client import AsyncDraftClient, DraftClient

KS = (1, 2, 3, 4, 6, 8, 12, 16)
MAX_NEW_TOKENS = 64
SERVER_FLAGS = [
    "--draft-source",
    "model",
    "--draft-ahead",
    "0",
    "--max-seq-len",
    "4096",
    "--max-batch-size",
    "16",
    "--request-timeout-s",
    "600",
]
DRAFT_TIMEOUT_S = 600  # a prompt's positions all wait in the server's queue together


def greedy_tokens(url: str, prompt: list[int], output: list[int]) -> list[int | None]:
    """Per position t of the target's output, the drafter's greedy token after prompt + output[:t] (None
    where it drafted nothing). All positions in flight at once, for the server to batch (each row prefills
    only what its prefix cache lacks)."""

    async def drafts():
        async with AsyncDraftClient(url, timeout_s=DRAFT_TIMEOUT_S) as client:
            calls = [client.draft(prompt + output[:t], 1, source="model") for t in range(len(output))]
            return await asyncio.gather(*calls)

    return [answer.tokens[0] if answer.tokens else None for answer in asyncio.run(drafts())]


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
    # As bench.harness.projection reads a round: its drafts, the tokens it added, whether it called us.
    called = [(drafts, kept + 1, drafts > 0) for drafts, kept in rounds]
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


def target_outputs(model, workloads: dict, max_new_tokens: int) -> list[dict]:
    """The target's greedy output for every prompt, timed: {kind, prompt, tokens, output, alone_s} each."""
    rows = []
    with tqdm(total=sum(map(len, workloads.values())), desc="target", unit="prompt", file=sys.stderr) as bar:
        for kind, entries in workloads.items():
            for where, entry in entries:
                output, seconds = timed(target_greedy, model, entry["tokens"], max_new_tokens, True)
                rows.append(
                    dict(kind=kind, prompt=where, tokens=entry["tokens"], output=output, alone_s=seconds)
                )
                bar.update()
    return rows


def drafter_tokens(model_dir: Path, cost_flags: list[str], rows: list[dict]) -> tuple[list[list], dict]:
    """One drafter's greedy token at every position of every output, and its measured draft costs."""
    flags = ["--model", str(model_dir), "--device", "cpu", *SERVER_FLAGS, *cost_flags]
    with started_server(flags) as url, DraftClient(url, timeout_s=60) as client:
        policy = server_info(client)["draft_length_policy"]
        tokens = [
            greedy_tokens(url, row["tokens"], row["output"])
            for row in tqdm(rows, desc=model_dir.name, unit="prompt", file=sys.stderr)
        ]
    return tokens, {"draft_base_ms": policy["draft_base_ms"], "draft_step_ms": policy["step_ms_at_startup"]}


def decode_with_target(args) -> tuple[list[dict], dict, list[str], float, float]:
    """The target's outputs, its generation settings and measured costs; the target (6 GB in float32) is
    freed on return, before any drafter server starts beside it."""
    directory = args.dir
    tokenizer = realpair.chat_tokenizer(directory / realpair.TARGET)
    workloads = realpair.workload_entries(tokenizer, args.quick)
    model = load_target(directory / realpair.TARGET, "cpu", "float32")
    generation = realpair.plain_greedy(model, tokenizer)
    vocab_size = model.config.vocab_size
    [warmup] = random_prompts(vocab_size, WARMUP_PROMPT_LEN, (WARMUP_PROMPT_LEN,), WARMUP_SEED)
    cost_flags, step_ms, per_token_ms = target_cost_flags(model, warmup, args)
    return (
        target_outputs(model, workloads, args.max_new_tokens),
        generation,
        cost_flags,
        step_ms,
        per_token_ms,
    )


def earlier_outputs(args) -> tuple[list[dict], dict, float, float, dict]:
    """An earlier report's target outputs, measured target costs and drafters (--outputs-from): more
    drafters' rounds on the same outputs need no target at all, and are compared with the earlier ones."""
    try:
        earlier = json.loads(args.outputs_from.read_text())
        costs = next(iter(earlier["drafters"].values()))["costs"]
        args.max_new_tokens, args.quick = earlier["config"]["max_new_tokens"], earlier["config"]["quick"]
        rows, generation = earlier["prompts"], earlier["config"]["generation"]
        return rows, generation, costs["step_ms"], costs["per_token_ms"], earlier["drafters"]
    except (OSError, ValueError, KeyError, StopIteration) as error:
        raise BenchError(f"cannot take target outputs from {args.outputs_from}: {error!r}") from None


def run(args) -> dict:
    directory = args.dir
    for drafter in args.drafters:
        realpair.check_fetched(directory, drafter_directory(directory, drafter).name)
    started = time.perf_counter()
    drafters = {}
    if args.outputs_from:
        rows, generation, step_ms, per_token_ms, drafters = earlier_outputs(args)
        cost_flags = [
            "--target-verify-ms",
            f"{step_ms:.3f}",
            "--target-verify-ms-per-token",
            f"{per_token_ms:.3f}",
        ]
    else:
        rows, generation, cost_flags, step_ms, per_token_ms = decode_with_target(args)
    kinds = list(dict.fromkeys(row["kind"] for row in rows))
    gpus = [GPU_MODELS[name] for name in realpair.GPU_MODELS]
    for drafter in args.drafters:
        tokens, draft_costs = drafter_tokens(drafter_directory(directory, drafter), cost_flags, rows)
        costs = dict(step_ms=step_ms, per_token_ms=per_token_ms, **draft_costs)
        drafters[drafter] = {"costs": costs, "tokens": tokens}
    results = []
    for drafter, measured in drafters.items():
        tokens, costs = measured["tokens"], measured["costs"]
        for kind in kinds:
            mine = [(row, drafted) for row, drafted in zip(rows, tokens, strict=True) if row["kind"] == kind]
            agreements = [
                [d == t for d, t in zip(drafted, row["output"], strict=True)] for row, drafted in mine
            ]
            alone = sum(len(row["output"]) for row, _ in mine) / sum(row["alone_s"] for row, _ in mine)
            for k in args.k:
                figures = summarize(agreements, k, costs, gpus)
                results.append({"drafter": drafter, "workload": kind, "alone_tokens_per_s": alone, **figures})
    return {
        "results": results,
        "prompts": rows,
        "drafters": drafters,
        "config": {
            "pair": str(directory),
            "quick": args.quick,
            "max_new_tokens": args.max_new_tokens,
            "k": list(args.k),
            "drafters": list(drafters),
            "generation": generation,
            "gpu_models": [gpu.as_dict() for gpu in gpus],
            "seconds": time.perf_counter() - started,
        },
        "machine": describe("cpu"),
    }


def drafter_names(text: str) -> tuple[str, ...]:
    """The pair's drafters by name (weight-only, dynamic, bf16), or other exports beside them by directory
    name (e.g. drafter-fp8-weight-only-channel, made with `python -m export ... --scales channel`)."""
    return tuple(text.split(","))


def drafter_directory(directory: Path, name: str) -> Path:
    return directory / PAIR_DRAFTERS.get(name, name)


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
    parser.add_argument(
        "--drafters",
        type=drafter_names,
        default=("weight-only",),
        help="the pair's drafters ("
        + ", ".join(PAIR_DRAFTERS)
        + ") or other exports in DIR by directory name, each on the same target outputs [weight-only]",
    )
    parser.add_argument(
        "--outputs-from",
        type=Path,
        metavar="REPORT",
        help="take the target's outputs and costs from an earlier run's report.json (no target decoding)",
    )
    parser.add_argument("--out", type=Path, help="write report.json and report.md here")


def main(args: argparse.Namespace) -> int:
    report = run(args)
    publish(report, markdown(report), args.out)
    return 0
