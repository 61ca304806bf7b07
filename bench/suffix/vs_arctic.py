"""Our suffix index (drafter/sessions/suffix_index.py) against Snowflake's arctic-inference, the library
vLLM's `suffix` method uses: the same drafts, and what each costs, on the same histories.

    python -m bench.suffix.vs_arctic [--prompts 3000] [--tokens 8192]

Run it where `arctic_inference` imports (its suffix module is C++ built from an sdist; see
bench/README.md for the recipe); drafter's index is pure Python and needs only this checkout on the path.

Drafts: for each of `--prompts` random histories (small alphabets, so matches are many and deep) and
contexts (the history's own tails, and random lead-ins ending in a piece of it), both index the history as
a request's prompt and speculate with the same rules; a pair is `equal`, `ties` (same score and match
length, different tokens: the two order equal counts differently), `whole context` (ours matched the whole
context, which arctic never tries: its loop stops at match lengths below the context's; a server's contexts
are longer than max_depth, where the two agree), or `different`. Costs: indexing an
8k-token prompt of testbed tokens, a hit and a miss at that context, and appending one token; medians in
microseconds.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

import numpy as np

from bench.suffix.cost import UNSEEN, cpu_name, workload_tokens
from drafter.sessions.suffix_index import SuffixIndex

RULES = dict(max_spec_factor=1.0, max_spec_offset=0.0, min_token_prob=0.1)
MAX_DEPTH, MAX_TOKENS = 24, 16


def compare_drafts(num_prompts: int, seed: int = 0) -> dict[str, int]:
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    rng = random.Random(seed)
    outcome = {"equal": 0, "ties": 0, "whole context": 0, "different": 0}
    for n in range(num_prompts):
        alphabet = rng.choice((2, 3, 5, 20))
        history = [rng.randrange(alphabet) for _ in range(rng.randrange(4, 200))]
        ours = SuffixIndex(MAX_DEPTH)
        ours.add(history)
        theirs = SuffixDecodingCache(MAX_DEPTH, max_cached_requests=0)
        theirs.start_request(n, history)
        end = rng.randrange(1, len(history) + 1)
        lead_in = [rng.randrange(alphabet) for _ in range(rng.randrange(3))]
        context = lead_in + history[rng.randrange(end) : end]
        mine = ours.speculate(context, MAX_TOKENS, **RULES)
        other = theirs.speculate(n, context, max_spec_tokens=MAX_TOKENS, **RULES)
        theirs.stop_request(n)
        if mine.tokens == list(other.token_ids):
            outcome["equal"] += 1
        elif abs(mine.score - other.score) < 1e-6 and mine.match_len == other.match_len:
            outcome["ties"] += 1
        elif mine.match_len == len(context):
            outcome["whole context"] += 1
        else:
            outcome["different"] += 1
    return outcome


def median_us(call, reps: int) -> float:
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return 1e6 * statistics.median(times)


def compare_costs(num_tokens: int, reps: int) -> list[tuple[str, float, float]]:
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    tokens = workload_tokens(num_tokens)
    prompt = tokens[:num_tokens]
    miss = prompt + [UNSEEN]
    array = np.asarray(prompt, dtype=np.int32)

    ours = SuffixIndex(MAX_DEPTH)
    seq = ours.add(prompt)
    theirs = SuffixDecodingCache(MAX_DEPTH, max_cached_requests=-1)
    theirs.start_request("r", array)

    def start_theirs():
        cache = SuffixDecodingCache(MAX_DEPTH, max_cached_requests=-1)
        cache.start_request("x", array)

    stream = iter(workload_tokens(num_tokens + 4 * reps)[num_tokens:] * 2)  # the prompt's own continuation

    few = max(3, reps // 100)
    return [
        (
            f"index a {num_tokens}-token prompt",
            median_us(lambda: SuffixIndex(MAX_DEPTH).add(prompt), few),
            median_us(start_theirs, few),
        ),
        (
            "speculate, hit",
            median_us(lambda: ours.speculate(prompt, MAX_TOKENS, **RULES), reps),
            median_us(lambda: theirs.speculate("r", prompt, max_spec_tokens=MAX_TOKENS, **RULES), reps),
        ),
        (
            "speculate, miss",
            median_us(lambda: ours.speculate(miss, MAX_TOKENS, **RULES), reps),
            median_us(lambda: theirs.speculate("r", miss, max_spec_tokens=MAX_TOKENS, **RULES), reps),
        ),
        (
            "append one token",
            median_us(lambda: ours.extend(seq, [next(stream)]), reps),
            median_us(lambda: theirs.add_active_response("r", [next(stream)]), reps),
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=3000)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--reps", type=int, default=2000)
    args = parser.parse_args(argv)
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache  # noqa: F401
    except ImportError:
        print(
            "suffix_vs_arctic: arctic_inference does not import here (see bench/README.md)", file=sys.stderr
        )
        return 2
    outcome = compare_drafts(args.prompts)
    print(f"{cpu_name()}; max_depth {MAX_DEPTH}, max {MAX_TOKENS} tokens, {RULES}")
    print(f"drafts over {args.prompts} histories: " + ", ".join(f"{k} {v}" for k, v in outcome.items()))
    print("\n| operation | drafter (Python) us | arctic-inference (C++) us |\n|---|---:|---:|")
    for name, ours, theirs in compare_costs(args.tokens, args.reps):
        print(f"| {name} | {ours:,.1f} | {theirs:,.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
