"""Drafting ahead on the testbed pair: the target runs its real speculative loop (bench/harness/decoding.py's,
as in bench/acceptance.py) on each workload against a fresh drafter server with `--draft-ahead 0` and with
`--draft-ahead N`, and this reports per run the hit rate (overall and by accepted count, from the server's
/info), each call's latency as the target waited for it, split into hits (answered from a branch: no engine
time) and the rest, the target's tokens/s measured here, and the same rounds projected on a GPU
(bench/harness/projection.py) where a hit costs only the call's overhead.

    python -m bench.ahead [--branches 8] [--num-draft-tokens 8] [--workloads code,edit,prose] [--json OUT]

On the CPU the target and the drafter share the machine's cores, so ahead work slows the target's verify
pass; the projection assumes, as a GPU with the drafter beside the target would roughly give, that it
overlaps the verify at no cost to it (an upper bound: both read the same memory bus). And on the CPU this
small target verifies faster than the drafter's ahead loop runs, so the server rightly drafts nothing ahead
(too_slow). `--verify-floor-ms X` makes every verify pass last at least X ms, the rest spent asleep (the
CPU idle, as when the target verifies on a GPU): set it to the ratio of a GPU's verify to a draft step
(~22 for Qwen3-8B over an FP8 Qwen3-0.6B on an H100) times /info's ahead step_ms, to measure the hit rate
the prediction itself reaches when branches are ready in time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

from bench.harness.decoding import (
    DRAFT_TIMEOUT_S,
    PAIR_DRAFTERS,
    load_target,
    speculative_greedy,
    started_server,
    target_cost_flags,
    target_greedy,
    timed,
)
from bench.harness.machine import describe
from bench.harness.projection import GpuModel
from bench.harness.prompts import (
    WARMUP_PROMPT_LEN,
    WARMUP_SEED,
    load_prompts,
    random_prompts,
    read_prompt_lines,
)
from bench.harness.report import percentiles
from bench.testbed import PAIR
from drafter.client import DraftClient
from drafter.integrations.transformers_generate import AUTO, SpeculationStats
from drafter.sessions.draft_source import MODEL


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--branches", type=int, default=8, help="--draft-ahead of the 'on' runs [8]")
    parser.add_argument("--num-draft-tokens", default="8", help="k, or auto [8]")
    parser.add_argument("--workloads", default="code,edit,prose", help="the testbed's workloads to run")
    parser.add_argument("--max-prompts", type=int, default=None, help="first N prompts of each workload")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="[the recipe's]")
    parser.add_argument(
        "--verify-floor-ms", type=float, default=0.0, help="every verify pass lasts at least this [0]"
    )
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args(argv)
    args.k = AUTO if args.num_draft_tokens == AUTO else int(args.num_draft_tokens)
    return args


def projected(rounds: list[tuple[int, int, bool]], hits: list[bool], gpu: GpuModel) -> float:
    """Target tokens/s on the GPU model for these rounds: a hit costs the call's overhead alone."""
    ms, kept = 0.0, 0
    called = iter(hits)
    for drafts, num_kept, was_called in rounds:
        kept += num_kept
        ms += gpu.verify_ms
        if was_called:
            ms += gpu.draft_overhead_ms + (0.0 if next(called) else drafts * gpu.draft_step_ms)
    return 1e3 * kept / ms


@contextlib.contextmanager
def verify_floor(model, floor_ms: float):
    """Every forward pass of `model` lasts at least `floor_ms`, asleep for the rest (the CPU left idle)."""
    forward = model.forward

    def floored(*args, **kwargs):
        began = time.perf_counter()
        out = forward(*args, **kwargs)
        time.sleep(max(0.0, floor_ms / 1e3 - (time.perf_counter() - began)))
        return out

    if floor_ms > 0:
        model.forward = floored
    try:
        yield
    finally:
        if floor_ms > 0:
            del model.forward  # the class's own again


def run_one(args, model, flags, prompts, warmup, reference, alone_s, gpu) -> dict:
    with (
        started_server(flags) as url,
        DraftClient(url, timeout_s=DRAFT_TIMEOUT_S) as client,
        verify_floor(model, args.verify_floor_ms),
    ):
        n = args.max_new_tokens
        speculative_greedy(model, client, warmup, n, SpeculationStats(args.k), False, MODEL)
        before = client.info().get("draft_ahead", {})
        stats, outputs, seconds = SpeculationStats(args.k), [], 0.0
        for prompt in prompts:
            out, took = timed(speculative_greedy, model, client, prompt, n, stats, False, MODEL)
            outputs.append(out)
            seconds += took
        after = client.info().get("draft_ahead", {})
    # A call with drafts and no engine time was answered from a branch.
    hits = [engine == 0.0 for engine in stats.draft_engine_ms]
    calls = stats.draft_call_ms
    delta = {key: after[key] - before.get(key, 0) for key in ("hits", "misses", "not_ready") if key in after}
    by_accepted = [
        a - b
        for a, b in zip(after.get("hits_by_accepted", []), before.get("hits_by_accepted", []), strict=False)
    ]
    answered = sum(delta.values()) if delta else 0
    tokens = sum(map(len, outputs))
    return {
        "lossless": outputs == reference,
        "rounds": stats.num_rounds,
        "mean_accepted_tokens": stats.mean_accepted_tokens,
        "hit_rate": delta["hits"] / answered if answered else None,
        **delta,
        "hits_by_accepted": by_accepted,
        "wasted_steps": after.get("wasted_steps", 0) - before.get("wasted_steps", 0),
        "preempted": after.get("preempted", 0) - before.get("preempted", 0),
        "too_slow": after.get("too_slow", 0) - before.get("too_slow", 0),
        "ahead_step_ms": after.get("step_ms"),
        "call_ms_hit": percentiles([c for c, h in zip(calls, hits, strict=True) if h]),
        "call_ms_miss": percentiles([c for c, h in zip(calls, hits, strict=True) if not h]),
        "call_ms_all": percentiles(calls),
        # The server's own time on a hit (Server-Timing receive + host: no queue, no engine).
        "server_ms_hit": percentiles([t for t, h in zip(stats.draft_server_ms, hits, strict=True) if h]),
        "server_engine_ms_mean": sum(stats.draft_engine_ms) / max(1, len(stats.draft_engine_ms)),
        "target_tokens_per_s_cpu": tokens / seconds,
        "target_alone_tokens_per_s_cpu": sum(map(len, reference)) / alone_s,
        "projected_gpu_tokens_per_s": projected(stats.round_log, hits, gpu),
        "projected_gpu_alone_tokens_per_s": 1e3 / gpu.verify_ms,
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    from bench.testbed.recipe import FULL

    args.max_new_tokens = args.max_new_tokens or FULL.workload_new_tokens
    model = load_target(PAIR / "target", "cpu", "float32")
    vocab = model.config.vocab_size
    [warmup] = random_prompts(vocab, WARMUP_PROMPT_LEN, (WARMUP_PROMPT_LEN,), WARMUP_SEED)
    cost_flags, _, _ = target_cost_flags(
        model, warmup, argparse.Namespace(max_new_tokens=args.max_new_tokens)
    )
    gpu = GpuModel()
    base = ["--model", str(PAIR / PAIR_DRAFTERS["weight-only"]), "--device", "cpu", *cost_flags]
    base += ["--draft-source", MODEL, "--max-seq-len", "4096"]
    base += [f"--max-batch-size={max(8, args.branches)}"]  # one loop drafts all of a session's branches
    report = {"machine": describe("cpu"), "k": args.k, "branches": args.branches, "gpu_model": gpu.as_dict()}
    report["verify_floor_ms"] = args.verify_floor_ms
    rows = []
    for workload in args.workloads.split(","):
        path = PAIR / "workloads" / f"{workload}.jsonl"
        entries = read_prompt_lines(path)[: args.max_prompts]
        where = argparse.Namespace(max_new_tokens=args.max_new_tokens, target=PAIR / "target")
        prompts = load_prompts(where, entries, vocab, 4096)
        target_greedy(model, warmup, args.max_new_tokens)
        reference, alone_s = [], 0.0
        for prompt in prompts:
            out, took = timed(target_greedy, model, prompt, args.max_new_tokens)
            reference.append(out)
            alone_s += took
        for branches in (0, args.branches):
            flags = [*base, f"--draft-ahead={branches}"]
            row = run_one(args, model, flags, prompts, warmup, reference, alone_s, gpu)
            rows.append({"workload": workload, "draft_ahead": branches, **row})
            print(json.dumps(rows[-1]), file=sys.stderr)
    report["rows"] = rows
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    print_table(rows)
    return 0 if all(r["lossless"] for r in rows) else 1


def print_table(rows: list[dict]) -> None:
    def ms(stats: dict | None, key: str) -> str:
        return f"{stats[key]:.2f}" if stats and stats.get(key) is not None else "-"

    print("| workload | ahead | hit rate | hits by accepted | p50 / p99 hit ms | server p50 / p99 hit ms | "
          "p50 / p99 other ms | tok/s CPU | tok/s projected GPU | lossless |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        rate = f"{r['hit_rate']:.0%}" if r["hit_rate"] is not None else "-"
        print(
            f"| {r['workload']} | {r['draft_ahead']} | {rate} | {r['hits_by_accepted'] or '-'} | "
            f"{ms(r['call_ms_hit'], 'p50')} / {ms(r['call_ms_hit'], 'p99')} | "
            f"{ms(r['server_ms_hit'], 'p50')} / {ms(r['server_ms_hit'], 'p99')} | "
            f"{ms(r['call_ms_miss'], 'p50')} / {ms(r['call_ms_miss'], 'p99')} | "
            f"{r['target_tokens_per_s_cpu']:.1f} | {r['projected_gpu_tokens_per_s']:.1f} | {r['lossless']} |"
        )


if __name__ == "__main__":
    sys.exit(main())
