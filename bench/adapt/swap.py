"""What a weights swap (`--adapt`, engine/swap.py) costs a request: made in one go, a request that arrives
meanwhile waits for all of it; made a piece at a time as the adaptation cycle makes it, for the piece under
way or the commit. And what it costs a conversation: its cache is dropped with the old weights.

    python -m bench.adapt.swap [--model DIR] [--dtype bfloat16] [--repeats 3] [--context 1024] [--threads 2] \
        [--out DIR]

The model's own weights as served (adaptation's version 0) are swapped in: what a swap costs does not depend
on their values. Per repeat, in one process and one after the other, the swap in one go
(`Engine.swap_weights`) and in pieces (`Engine.weight_swap`, each piece timed); then a conversation's next
call after a swap, which prefills its `--context` tokens again or finds them cached again (as
drafter/server/recache_work.py does while the engine is quiet). The first repeat pays for the allocator's
first growth; read the later ones. Default model: the real pair's served drafter (Qwen2.5-Coder-0.5B FP8
weight-only, as `python -m bench.realpair fetch` leaves it).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from bench.adapt.args import REALPAIR_RUN, add_model_argument
from bench.harness.machine import describe
from bench.harness.report import publish
from drafter.adaptation.weights import source_tensors
from drafter.server.recache_work import recache
from engine.config import EngineConfig
from engine.engine import DTYPES, Engine
from engine.model.errors import LoadError
from engine.requests import DraftRequest

K = REALPAIR_RUN["num_draft_tokens"]  # as bench.adapt --realpair drafts


def in_one_go(engine: Engine, tensors: dict[str, torch.Tensor]) -> float:
    began = time.perf_counter()
    engine.swap_weights(tensors)
    return time.perf_counter() - began


def in_pieces(engine: Engine, tensors: dict[str, torch.Tensor]) -> dict:
    """Each piece's seconds; the last is the commit."""
    pieces, seconds = engine.weight_swap(tensors), []
    while True:
        began = time.perf_counter()
        try:
            next(pieces)
        except StopIteration:
            seconds.append(time.perf_counter() - began)
            break
        seconds.append(time.perf_counter() - began)
    *made, commit = seconds
    return {"pieces": len(made), "whole_s": sum(seconds), "longest_piece_s": max(made), "commit_s": commit}


def next_call(engine: Engine, tensors: dict[str, torch.Tensor], context: list[int], recached: bool) -> dict:
    """A conversation's next call after a swap, its context cached before it: it prefills all of it again, or
    finds it `recached` by the server's own call (drafter/server/recache_work.py). Its
    seconds, and the context tokens it found cached."""
    engine.draft_batch([DraftRequest(context, K, "conversation")])
    engine.swap_weights(tensors)
    if recached:
        recache(engine, context, "conversation")
    began = time.perf_counter()
    result = engine.draft_batch([DraftRequest([*context, context[0]], K, "conversation")])[0]
    return {"seconds": time.perf_counter() - began, "cached": result.cached}


def measure(engine: Engine, repeats: int, context_len: int) -> list[dict]:
    tensors = source_tensors(engine.loaded, DTYPES[engine.config.dtype])
    vocab = engine.loaded.config.vocab_size
    context = torch.randint(0, vocab, (context_len,), generator=torch.Generator().manual_seed(0)).tolist()
    return [
        {
            "one_go_s": in_one_go(engine, tensors),
            **in_pieces(engine, tensors),
            "next_call_prefilled": next_call(engine, tensors, context, recached=False),
            "next_call_recached": next_call(engine, tensors, context, recached=True),
        }
        for _ in range(repeats)
    ]


def markdown(report: dict) -> str:
    config = report["config"]
    lines = [
        f"{config['model']} ({config['dtype']}, {config['threads']} threads, {report['machine']['cpu']}): what "
        "a request arriving during a swap waits for, and a conversation's next call after it "
        f"({config['context']} tokens of context, k = {K}).",
        "",
        "| repeat | one go, ms | in pieces: whole, ms | pieces | longest piece, ms | commit, ms | "
        "wait, one go / pieces | next call: prefilled, ms | recached, ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for i, row in enumerate(report["repeats"], 1):
        wait = max(row["longest_piece_s"], row["commit_s"])
        lines.append(
            f"| {i} | {1e3 * row['one_go_s']:.0f} | {1e3 * row['whole_s']:.0f} | {row['pieces']} | "
            f"{1e3 * row['longest_piece_s']:.1f} | {1e3 * row['commit_s']:.1f} | {row['one_go_s'] / wait:.0f}x | "
            f"{1e3 * row['next_call_prefilled']['seconds']:.0f} | {1e3 * row['next_call_recached']['seconds']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_argument(parser)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16", help="served dtype [bfloat16]")
    parser.add_argument("--repeats", type=int, default=3, help="swaps of each kind [3]")
    parser.add_argument("--context", type=int, default=1024, help="a conversation's context, tokens [1024]")
    parser.add_argument("--threads", type=int, default=2, help="torch threads [2]")
    parser.add_argument("--out", type=Path, help="write report.json and report.md here")
    args = parser.parse_args(argv)
    if min(args.repeats, args.threads) < 1 or args.context < 2:
        parser.error("--repeats and --threads must be positive, --context at least 2")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        engine = Engine.load(args.model, EngineConfig(device="cpu", dtype=args.dtype))
    except (LoadError, OSError) as error:
        print(f"error: cannot load {args.model}: {error}", file=sys.stderr)
        return 2
    report = {
        "repeats": measure(engine, args.repeats, args.context),
        "config": {
            "model": args.model,
            "dtype": args.dtype,
            "threads": args.threads,
            "context": args.context,
        },
        "machine": describe("cpu"),
    }
    publish(report, markdown(report), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
