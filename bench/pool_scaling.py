"""Does a decode step's cost grow with the KV pool? Compiled against eager decode per call, by pool size.

    python -m bench.pool_scaling                          # tiny preset, fp32, CPU: pools 0.01, 0.5, 2 GiB
    python -m bench.pool_scaling --pools-gb 0.01,0.5 --json out.json

One conversation of `--context` tokens drafts `--draft-tokens` tokens per call, growing by one accepted draft
and a token of the target's each call, so every measured call is decode only (no prefill). A step reads the
weights and the conversation's own keys and values: its time must not depend on how many other pages the
pool holds. A compiled step that rewrote the whole pool (a functional scatter over a stacked
[layers, slots, ...] tensor) took 25 ms with a 0.01 GiB pool and 1.8 s with 0.5 GiB on the CPU; eager took
7 ms with either.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time

import numpy as np
import torch

from bench.harness import machine
from engine.config import EngineConfig
from engine.engine import Engine
from engine.requests import DraftRequest


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--pools-gb", default="0.01,0.5,2", help="KV-pool budgets in GiB [0.01,0.5,2]")
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--draft-tokens", type=int, default=8)
    parser.add_argument("--calls", type=int, default=8, help="measured calls per engine [8]")
    parser.add_argument("--variants", default="eager,compiled")
    parser.add_argument("--attention", default="sdpa", choices=("sdpa", "flex"))
    parser.add_argument("--json", help="write the rows here")
    return parser.parse_args(argv)


def measure(args, pool_gb: float, compiled: bool) -> dict:
    config = EngineConfig(
        device="cpu",
        dtype="float32",
        max_seq_len=args.context + 4 * args.calls * args.draft_tokens,
        max_batch_size=1,
        batch_buckets=(1,),
        max_draft_tokens=args.draft_tokens,
        draft_length_tiers=(args.draft_tokens,),
        kv_cache_gb=pool_gb,
        compile=compiled,
        attention=args.attention,
    )
    engine = Engine.load(args.model, config)
    snapshot = engine.warmup()
    rng = np.random.default_rng(0)
    context = rng.integers(0, engine.loaded.config.vocab_size, args.context).tolist()
    decode_ms = []
    for call in range(args.calls + 1):  # call 0 prefills the context: not measured
        [result] = engine.draft_batch([DraftRequest(context, args.draft_tokens, "pool")])
        if call:
            decode_ms.append(result.decode_ms)
        context += [*result.tokens[:1], int(rng.integers(engine.loaded.config.vocab_size))]
    row = {
        "variant": "compiled" if compiled else "eager",
        "pool_gb": pool_gb,
        "pool_bytes": engine.pool.num_bytes,
        "p50_decode_ms": statistics.median(decode_ms),
        "min_decode_ms": min(decode_ms),
        "fallbacks": snapshot["fallbacks"],
    }
    del engine
    gc.collect()
    return row


def main(argv=None) -> int:
    args = parse_args(argv)
    rows = []
    started = time.perf_counter()
    for pool_gb in [float(p) for p in args.pools_gb.split(",")]:
        for variant in args.variants.split(","):
            row = measure(args, pool_gb, compiled=variant == "compiled")
            rows.append(row)
            fell_back = " (fell back: " + "; ".join(row["fallbacks"]) + ")" if row["fallbacks"] else ""
            print(
                f"pool {pool_gb:>5} GiB  {row['variant']:<8}  decode p50 {row['p50_decode_ms']:8.2f} ms"
                f"  min {row['min_decode_ms']:8.2f} ms{fell_back}",
                flush=True,
            )
    print(f"{len(rows)} engines in {time.perf_counter() - started:.0f} s; torch {torch.__version__}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(
                {"machine": machine.describe("cpu"), "args": vars(args), "results": rows}, out, indent=1
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
