"""Drafting ahead on a pair: the target runs its real speculative loop (bench/harness/decoding.py's, as in
bench/acceptance.py) on each workload against a drafter server (its FP8 weight-only drafter, model drafts)
with `--draft-ahead 0` and with `--draft-ahead N`: a fresh server per setting, which serves the workloads in
turn (each row is /info's counts before and after its workload; a server's start and warm-up is most of a
small run's time). This reports per workload and setting the hit rate (overall, after each conversation's
cold start, and by accepted count, from the server's /info), each call's latency as the target waited for
it, split into hits (answered from a branch: no engine time), the cold start and the rest, the target's
tokens/s measured here, whether every output is the target's own (lossless), and the same rounds projected
on a GPU (bench/harness/projection.py) where a hit costs only the call's overhead.

    python -m bench.ahead [--testbed [DIR]] [--branches 8] [--num-draft-tokens 8] [--workloads code,edit,prose]
    python -m bench.ahead --realpair [DIR] [--quick] [--verify-floor-ms 0,auto] [--json OUT]

`--testbed` (the default) is the committed pair (bench/testbed/); `--realpair` the real one (Qwen2.5-Coder-
1.5B-Instruct verifying Qwen2.5-Coder-0.5B-Instruct's drafts, from `python -m bench.realpair fetch`), on
bench/realpair/prompts.jsonl's quick prompts under the target's chat template, decoding greedily to
`<|im_end|>`, k = 3, 2 prompts per kind at 64 new tokens (about 20 minutes on a 2-core CPU), `--quick` 1 at
48 (about 8); bench/ahead_args.py says why. A real pair not on disk exits 2 with one line naming the fetch.

On the CPU, ahead work and the target share the cores, and the target verifies faster than the ahead loop
runs: `--verify-floor-ms` slows every verify pass to a GPU's ratio (bench/ahead_floor.py says how and why).

The first two calls of each conversation are its cold start, which no branch can answer: the first
verifies nothing (the server's /info does not count it) and after it nothing is planned, since the server
plans only when a session's next call would come after its loop ends and the session's pace is not known yet;
the second finds no branch (not_ready), and the branches planned after it can answer the third. Their latency
is reported apart (`call_ms_cold`), and the hit rate also without them (`hit_rate_after_cold`); /info's own
rate (`hit_rate`) counts every call but the first.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from bench.ahead_args import parse_args
from bench.ahead_floor import settled_floors, warm_server
from bench.ahead_report import print_table
from bench.harness.decoding import (
    pair_server_flags,
    speculative_greedy,
    target_cost_flags,
    target_greedy,
    timed,
)
from bench.harness.machine import describe
from bench.harness.projection import GpuModel
from bench.harness.prompts import WARMUP_PROMPT_LEN, WARMUP_SEED, BenchError, load_prompts, random_prompts
from bench.harness.report import percentiles
from bench.pair_choice import open_target
from drafter.integrations.transformers_generate import SpeculationStats
from drafter.sessions.draft_source import MODEL

MAX_SEQ_LEN = 4096
# Untimed decodes are short: the target's verify probe (what the server is told, which only `auto` k weighs)
# needs a few rounds, not a whole answer (so do a fresh server's warm-up and the floor's: bench/ahead_floor.py).
PROBE_NEW_TOKENS = 16
COLD_CALLS = 2  # a conversation's calls that no branch can answer (see above)


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


def cold_calls(starts: list[int], num_calls: int) -> tuple[set[int], set[int]]:
    """Indices of each conversation's first COLD_CALLS calls, and of its first alone (which /info does not
    count: it verifies nothing), given where each conversation's calls start."""
    spans = list(zip(starts, [*starts[1:], num_calls], strict=True))
    cold = {i for start, end in spans for i in range(start, min(start + COLD_CALLS, end))}
    return cold, {start for start, end in spans if end > start}


def measure(args, model, client, prompts, reference, alone_s) -> dict:
    """One workload's prompts through a warm server: its row."""
    n, stop = args.max_new_tokens, args.stop_at_eos
    before = client.info().get("draft_ahead", {})
    stats, outputs, seconds, starts = SpeculationStats(args.k), [], 0.0, []
    for prompt in prompts:
        starts.append(len(stats.draft_call_ms))
        out, took = timed(speculative_greedy, model, client, prompt, n, stats, stop, MODEL)
        outputs.append(out)
        seconds += took
    after = client.info().get("draft_ahead", {})
    # A call with drafts and no engine time was answered from a branch.
    hits = [engine == 0.0 for engine in stats.draft_engine_ms]
    calls = stats.draft_call_ms
    cold, firsts = cold_calls(starts, len(calls))
    delta = {key: after[key] - before.get(key, 0) for key in ("hits", "misses", "not_ready") if key in after}
    by_accepted = [
        a - b
        for a, b in zip(after.get("hits_by_accepted", []), before.get("hits_by_accepted", []), strict=False)
    ]
    answered = sum(delta.values()) if delta else 0  # every call but each conversation's first
    warm = answered - len(cold - firsts)
    tokens = sum(map(len, outputs))
    return {
        "lossless": outputs == reference,
        "rounds": stats.num_rounds,
        "mean_accepted_tokens": stats.mean_accepted_tokens,
        "hit_rate": delta["hits"] / answered if answered else None,
        "hit_rate_after_cold": delta["hits"] / warm if warm > 0 else None,
        **delta,
        "cold_calls": len(cold),
        "hits_by_accepted": by_accepted,
        "wasted_steps": after.get("wasted_steps", 0) - before.get("wasted_steps", 0),
        "preempted": after.get("preempted", 0) - before.get("preempted", 0),
        "too_slow": after.get("too_slow", 0) - before.get("too_slow", 0),
        "ahead_step_ms": after.get("step_ms"),
        "call_ms_hit": percentiles([c for c, h in zip(calls, hits, strict=True) if h]),
        "call_ms_miss": percentiles([c for c, h in zip(calls, hits, strict=True) if not h]),
        "call_ms_cold": percentiles([calls[i] for i in sorted(cold)]),
        "call_ms_all": percentiles(calls),
        # The server's own time on a hit (Server-Timing receive + host: no queue, no engine).
        "server_ms_hit": percentiles([t for t, h in zip(stats.draft_server_ms, hits, strict=True) if h]),
        "server_engine_ms_mean": sum(stats.draft_engine_ms) / max(1, len(stats.draft_engine_ms)),
        "target_tokens_per_s_cpu": tokens / seconds,
        "target_alone_tokens_per_s_cpu": sum(map(len, reference)) / alone_s,
        "projected_gpu_tokens_per_s": projected(stats.round_log, hits, args.gpu),
        "projected_gpu_alone_tokens_per_s": 1e3 / args.gpu.verify_ms,
    }


def target_alone(args, model, prompts: list[list[int]]) -> tuple[list[list[int]], float]:
    """The target's own greedy outputs (the reference a lossless run reproduces) and their seconds."""
    outputs, seconds = [], 0.0
    for prompt in prompts:
        out, took = timed(target_greedy, model, prompt, args.max_new_tokens, args.stop_at_eos)
        outputs.append(out)
        seconds += took
    return outputs, seconds


def chosen_workloads(args, workloads: dict[str, list]) -> dict[str, list]:
    unknown = [name for name in args.workloads if name not in workloads]
    if unknown:
        raise BenchError(f"--workloads {','.join(unknown)}: the pair's are {','.join(workloads)}")
    return {name: workloads[name][: args.max_prompts] for name in args.workloads}


def measure_settings(args, model, floors, base, costs, warmup, prompts, references):
    """Per floor, --draft-ahead 0 and N, each a fresh server through every workload: the rows, and each
    setting's wall time (its server's start and warm-up included)."""
    rows, servers = [], []
    for floor in floors:
        # The server is told the costs the target now has: the floor's, where it is the longer (a GPU's
        # verify, whose extra tokens cost ~nothing), else the measured step and per-token cost.
        cost_flags, verify_ms = costs
        floored = ["--target-verify-ms", f"{floor['ms']:.3f}"]
        told = pair_server_flags(
            args.pair, args.drafter, "cpu", floored if floor["ms"] > verify_ms else cost_flags
        )
        for branches in (0, args.branches):
            started = time.perf_counter()
            flags = [*told, *base, f"--draft-ahead={branches}"]
            with warm_server(args, model, flags, warmup, floor["ms"]) as client:
                for workload, workload_prompts in prompts.items():
                    row = measure(args, model, client, workload_prompts, *references[workload])
                    rows.append(
                        {"workload": workload, "draft_ahead": branches, "verify_floor_ms": floor["ms"], **row}
                    )
                    print(json.dumps(rows[-1]), file=sys.stderr)
            seconds = time.perf_counter() - started
            servers.append({"verify_floor_ms": floor["ms"], "draft_ahead": branches, "seconds": seconds})
    return rows, servers


def run(args) -> dict:
    began = time.perf_counter()
    model, workloads, generation = open_target(args, quick_prompts=True)
    workloads = chosen_workloads(args, workloads)
    args.stop_at_eos = bool(args.realpair)  # a chat answer ends at <|im_end|>; the testbed's text does not
    vocab = model.config.vocab_size
    [warmup] = random_prompts(vocab, WARMUP_PROMPT_LEN, (WARMUP_PROMPT_LEN,), WARMUP_SEED)
    cost_flags, verify_ms, _ = target_cost_flags(
        model, warmup, argparse.Namespace(max_new_tokens=PROBE_NEW_TOKENS)
    )
    base = ["--draft-source", MODEL, "--max-seq-len", str(MAX_SEQ_LEN)]
    base += [f"--max-batch-size={max(8, args.branches)}"]  # one loop drafts all of a session's branches
    floors = settled_floors(
        args, model, [*pair_server_flags(args.pair, args.drafter, "cpu", cost_flags), *base], warmup
    )
    prompts, references = {}, {}
    for workload, entries in workloads.items():
        where = argparse.Namespace(max_new_tokens=args.max_new_tokens, target=args.target)
        prompts[workload] = load_prompts(where, entries, vocab, MAX_SEQ_LEN)
        references[workload] = target_alone(args, model, prompts[workload])
    costs = (cost_flags, verify_ms)
    rows, servers = measure_settings(args, model, floors, base, costs, warmup, prompts, references)
    return {
        "machine": describe("cpu"),
        "pair": str(args.pair),
        "k": args.k,
        "branches": args.branches,
        "max_new_tokens": args.max_new_tokens,
        "num_prompts": {workload: len(entries) for workload, entries in workloads.items()},
        "stop_at_eos": args.stop_at_eos,
        "generation": generation,
        "target_verify_ms": verify_ms,
        "verify_floors": floors,
        "gpu_model": args.gpu.as_dict(),
        "rows": rows,
        "servers": servers,  # each setting's wall time, its server's start and warm-up included
        "seconds": time.perf_counter() - began,
    }


def main(argv=None) -> int:
    args = parse_args(argv, __doc__.split("\n\n")[0])
    try:
        report = run(args)
    except (BenchError, OSError) as error:
        print(f"ahead: error: {error}", file=sys.stderr)
        return 2
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    order = list(report["num_prompts"])
    print_table(sorted(report["rows"], key=lambda row: order.index(row["workload"])))
    for floor in report["verify_floors"]:
        print(f"\nverify floor {floor['ms']:.0f} ms: {floor['basis']}")
    print(f"{report['seconds']:.0f} s on {report['machine']['cpu']}")
    return 0 if all(r["lossless"] for r in report["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
