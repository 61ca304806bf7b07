"""What one vLLM step waits for drafts, by rows in the batch, three ways: the vLLM proposer as it is (one
POST /draft/batch per step: one engine batch), the proposer without that route (one call per row, all in
flight at once: the server batches what has arrived when the engine is free), and the same calls one after
another (what a proposer looping over rows with the blocking client would cost). Then, with no server, the
proposer's own host work per step by context length: rows tracked incrementally (the proposer) against
each row's whole context rebuilt from vLLM's array every step. No vLLM needed: `propose` is called as
vLLM's model runner calls it. The server serves the testbed pair's FP8 drafter; each row is a workload
prompt, and each step the target keeps every draft (the v2 call then carries k + 1 new tokens).

    python -m bench.proposer_batch [--rows 1,4,8] [--steps 30] [--k 8] [--json OUT]
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

from bench.harness.server import ServerProcess
from bench.testbed import PAIR, workload_tokens
from drafter.client import Backoff, DraftClient
from drafter.client.protocol import ServerState, SessionState, exchange
from drafter.integrations.vllm_proposer import DrafterProposer
from drafter.integrations.vllm_rows import RowSessions

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


def host_steps(context_len: int, num_rows: int, incremental: bool, steps: int = 30) -> list[float]:
    """The target side's work of `steps` steps up to the request bodies, with no I/O: matching rows to
    sessions and the v2 bodies (each step every row keeps all 8 drafts)."""
    rng = np.random.default_rng(0)
    token_ids = rng.integers(0, 4000, (num_rows, context_len + 10 * steps), dtype=np.int32)
    rows, server = RowSessions(SessionState), ServerState(Backoff())
    server.protocol_versions = frozenset((1, 2))
    times, length = [], context_len
    for _ in range(steps):
        started = time.perf_counter()
        if incremental:
            requests = rows.assign({row: token_ids[row, :length] for row in range(num_rows)})[0].values()
            jobs = [(r.session, r.tokens, r.known_len) for r in requests]
        else:
            contexts = {row: token_ids[row, :length].tolist() for row in range(num_rows)}
            jobs = [(r.session, contexts[row], 0) for row, r in rows.assign(
                {row: token_ids[row, :length] for row in range(num_rows)})[0].items()]  # fmt: skip
        for state, context, known_len in jobs:
            state.known_len = known_len
            next(exchange(server, state, list(context), {"num_draft_tokens": 8}))  # the body, built
            state.answered(
                context, {"tokens": token_ids[0, length : length + 9].tolist(), "session_token": "t"}
            )
        times.append(time.perf_counter() - started)
        length += 9
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
    print("\n| context tokens | rows | incremental ms/step | whole context ms/step |")
    print("|---:|---:|---:|---:|")
    host = []
    for context_len in (1000, 4000, 8000):
        row = {
            "context_len": context_len,
            "incremental_p50_ms": p50_ms(host_steps(context_len, max(rows), True)),
            "whole_p50_ms": p50_ms(host_steps(context_len, max(rows), False)),
        }
        host.append(row)
        print(
            f"| {context_len} | {max(rows)} | {row['incremental_p50_ms']:.3f} | {row['whole_p50_ms']:.3f} |"
        )
    if args.json:
        args.json.write_text(json.dumps({"wait": results, "host": host}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
