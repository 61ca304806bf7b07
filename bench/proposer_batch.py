"""What one vLLM step waits for drafts, by rows in the batch, three ways: the vLLM proposer as it is (one
POST /draft/batch per step: one engine batch), the proposer without that route (one call per row, all in
flight at once: the server batches what has arrived when the engine is free), and the same calls one after
another (what a proposer looping over rows with the blocking client would cost). No vLLM needed: `propose` is called as
vLLM's model runner calls it. The server serves the testbed pair's FP8 drafter; each row is a workload
prompt, and each step the target keeps every draft (the v2 call then carries k + 1 new tokens).

    python bench/proposer_batch.py [--rows 1,4,8] [--steps 30] [--k 8] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from bench.server import ServerProcess
from bench.testbed import PAIR, workload_tokens
from drafter.client import DraftClient
from drafter.integrations.vllm_proposer import DrafterProposer

MAX_MODEL_LEN = 2048


def prompts(num_rows: int) -> list[list[int]]:
    return [tokens for workload in ("code", "prose", "edit") for tokens in workload_tokens(workload)][
        :num_rows
    ]


def proposer_steps(url: str, contexts: list[list[int]], k: int, steps: int, batch_route: bool) -> list[float]:
    config = SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=k),
        model_config=SimpleNamespace(max_model_len=MAX_MODEL_LEN),
        additional_config={"drafter": {"url": url, "timeout_s": 5.0}},
    )
    proposer = DrafterProposer(config)
    if not batch_route:  # as from a server without /draft/batch: /info offers no batch rows
        server, learn = proposer.client.server, proposer.client.server.learn
        server.learn = lambda info: (learn(info), setattr(server, "max_batch_rows", None))
    token_ids = np.zeros((len(contexts), MAX_MODEL_LEN), dtype=np.int32)
    lengths = np.zeros(len(contexts), dtype=np.int32)
    contexts = [list(c) for c in contexts]
    times = []
    try:
        for _ in range(steps):
            for row, context in enumerate(contexts):
                token_ids[row, : len(context)], lengths[row] = context, len(context)
            started = time.perf_counter()
            drafts = proposer.propose([[c[-1]] for c in contexts], lengths, token_ids)
            times.append(time.perf_counter() - started)
            contexts = [c + d + [d[-1] if d else 1] for c, d in zip(contexts, drafts, strict=True)]
    finally:
        proposer.close()
    return times


def sequential_steps(url: str, contexts: list[list[int]], k: int, steps: int) -> list[float]:
    contexts = [list(c) for c in contexts]
    times = []
    with DraftClient(url, timeout_s=5.0) as client:
        sessions = [client.session() for _ in contexts]
        for _ in range(steps):
            started = time.perf_counter()
            drafts = [session.draft(c, k).tokens for session, c in zip(sessions, contexts, strict=True)]
            times.append(time.perf_counter() - started)
            contexts = [c + d + [d[-1] if d else 1] for c, d in zip(contexts, drafts, strict=True)]
    return times


def p50_ms(times: list[float]) -> float:
    return 1e3 * statistics.median(times[3:])  # the first steps build sessions and warm the caches


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", default="1,4,8", help="batch sizes, comma-separated")
    parser.add_argument("--steps", type=int, default=30, help="steps per run (the first 3 are warmup)")
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    rows = [int(n) for n in args.rows.split(",")]
    model = PAIR / "drafter-fp8-weight-only"
    server_args = [f"--model={model}", "--device=cpu", "--dtype=float32", "--max-seq-len=2048"]
    server_args += [f"--max-batch-size={max(rows)}", "--batch-window-ms=1"]
    results = []
    with ServerProcess(server_args) as server:
        print("| rows | /draft/batch p50 ms | concurrent calls p50 ms | sequential calls p50 ms |")
        print("|---:|---:|---:|---:|")
        for n in rows:
            batch = prompts(n)
            row = {
                "rows": n,
                "batch_p50_ms": p50_ms(proposer_steps(server.url, batch, args.k, args.steps, True)),
                "concurrent_p50_ms": p50_ms(proposer_steps(server.url, batch, args.k, args.steps, False)),
                "sequential_p50_ms": p50_ms(sequential_steps(server.url, batch, args.k, args.steps)),
            }
            results.append(row)
            print(
                f"| {n} | {row['batch_p50_ms']:.2f} | {row['concurrent_p50_ms']:.2f} | {row['sequential_p50_ms']:.2f} |"
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
