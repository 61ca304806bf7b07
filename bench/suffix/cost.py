"""What the suffix index (drafter/sessions/suffix_index.py) costs on the CPU at an 8k-token context, and what
the server's suffix drafts (drafter/sessions/suffix_drafts.py) cost a call.

    python -m bench.suffix.cost [--tokens 8192] [--global-tokens 65536] [--max-depth 24] [--reps 2000]

One sequence of real token ids (the testbed workloads, concatenated and cycled to length, so its tail occurs
earlier too, as an edited file's or a repeated answer's would) is indexed with `add`; then `extend` by 1 and
by 9 tokens (each rolled back with `truncate`, untimed, so every repetition sees the same index), and
`speculate(context, max_tokens=16)` on a hit (the sequence itself as the context) and on a miss (a context
ending in ids no sequence holds). Figures are medians over the repetitions, in microseconds.

Then the server's side: a session whose index holds that sequence, beside a global index of
`--global-tokens` other tokens (a full one at the server's default cap). `lookup` is the one call a /draft
makes on its critical path (both indexes); `work` slices are what indexing a new 8k-token prompt holds the
event loop for at a time (the server's 0.2 ms budget): their median and maximum bound what a request
arriving meanwhile waits.
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable

import numpy as np

from bench.testbed import PAIR
from drafter.sessions.suffix_drafts import SuffixDrafts, SuffixRules
from drafter.sessions.suffix_index import SuffixIndex

WORKLOADS = PAIR / "workloads"
UNSEEN = 10**6  # above any vocabulary: never stored, so a context ending here matches nothing


def workload_tokens(length: int) -> list[int]:
    """`length` token ids from the workload files, in file and line order, cycled when they run out."""
    stream = []
    for path in sorted(WORKLOADS.glob("*.jsonl")):
        with path.open() as lines:
            stream += [token for line in lines if line.strip() for token in json.loads(line)["tokens"]]
    return list(itertools.islice(itertools.cycle(stream), length))


def median_us(call: Callable[[], object], reps: int, undo: Callable[[], object] | None = None) -> float:
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
        if undo is not None:
            undo()
    return 1e6 * statistics.median(times)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            return next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--global-tokens", type=int, default=65536)
    parser.add_argument("--max-depth", type=int, default=24)
    parser.add_argument("--reps", type=int, default=2000, help="for the fast calls; `add` gets a fiftieth")
    args = parser.parse_args(argv)

    stream = workload_tokens(args.tokens + 9)
    tokens, following = stream[: args.tokens], stream[args.tokens :]  # what the sequence would go on with
    index = SuffixIndex(args.max_depth)
    seq_id = index.add(tokens)
    rollback = lambda: index.truncate(seq_id, args.tokens)  # noqa: E731
    hit = index.speculate(tokens, max_tokens=16)
    miss_context = tokens + [UNSEEN, UNSEEN + 1]

    add_reps = max(3, args.reps // 50)
    rows = [
        (
            f"add ({args.tokens} tokens, from scratch)",
            median_us(lambda: SuffixIndex(args.max_depth).add(tokens), add_reps),
        ),
        ("extend by 1 token", median_us(lambda: index.extend(seq_id, following[:1]), args.reps, rollback)),
        ("extend by 9 tokens", median_us(lambda: index.extend(seq_id, following), args.reps, rollback)),
        (
            "speculate, hit (context = the sequence)",
            median_us(lambda: index.speculate(tokens, 16), args.reps),
        ),
        (
            "speculate, miss (unseen last token)",
            median_us(lambda: index.speculate(miss_context, 16), args.reps),
        ),
    ]
    rows += server_rows(args, stream)
    print(f"{cpu_name()}, Python {platform.python_version()}")
    print(
        f"{args.tokens} tokens, max_depth {args.max_depth}: {index.num_nodes} nodes, "
        f"{memory_bytes(tokens, args.max_depth) / 2**20:.1f} MiB"
    )
    print(f"the hit drafts {len(hit.tokens)} tokens on a {hit.match_len}-token match (score {hit.score:.2f})")
    print(f"medians over {args.reps} calls ({add_reps} for add)\n")
    print("| operation | us |")
    print("|---|---:|")
    for name, us in rows:
        print(f"| {name} | {us:,.1f} |")
    return 0


def memory_bytes(tokens: list[int], max_depth: int) -> int:
    """What an index of these tokens holds (tracemalloc's peak while building it, minus the start)."""
    tracemalloc.start()
    index = SuffixIndex(max_depth)
    index.add(tokens)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak


def server_rows(args, stream: list[int]) -> list[tuple[str, float]]:
    """The server's store: lookups at this context beside a full global index, and indexing's slices."""
    rules = SuffixRules(max_depth=args.max_depth)
    store = SuffixDrafts(rules, local_tokens=10 * args.tokens, global_tokens=args.global_tokens)
    others = workload_tokens(args.tokens + args.global_tokens)[args.tokens :]
    store.update("others", np.asarray(others[:1], dtype=np.int64))  # a one-token prompt: the rest is response
    store.update("others", np.asarray(others, dtype=np.int64))
    while store.work(budget_s=1.0):
        pass
    context = np.asarray(stream[: args.tokens], dtype=np.int64)
    store.update("session", context)
    slices = []
    while True:
        started = time.perf_counter()
        more = store.work()
        slices.append(time.perf_counter() - started)
        if not more:
            break
    miss = np.concatenate((context, [UNSEEN, UNSEEN + 1]))
    hit = store.lookup("session", context, 16, trusted=True)
    print(
        f"server: a hit drafts {len(hit.tokens)} tokens; global index {len(store.global_index)} tokens; "
        f"a new {args.tokens}-token prompt indexed in {len(slices)} slices"
    )
    return [
        (
            "server lookup, hit (session index + global index)",
            median_us(lambda: store.lookup("session", context, 16, True), args.reps),
        ),
        ("server lookup, miss", median_us(lambda: store.lookup("session", miss, 16, True), args.reps)),
        ("indexing: a slice, median", 1e6 * statistics.median(slices)),
        ("indexing: a slice, max", 1e6 * max(slices)),
    ]


if __name__ == "__main__":
    sys.exit(main())
