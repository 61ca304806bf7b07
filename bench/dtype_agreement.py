"""How far bf16 (and FP8 checkpoints) drafts agree with fp32's on the CPU, on the same weights.

    python -m bench.dtype_agreement [--model bench-cpu] [--fp8 DIR[,DIR]] [--contexts 32] [--length 512] [--k 16]

For each random context, fp32's greedy draft of k tokens is the reference; each other variant's draft is
scored by its accepted length against it (the leading tokens equal to fp32's: what an fp32 target would
keep) and by its first token. FP8 directories are exports of the same model (`python -m export MODEL DIR`),
served in bf16 as on a GPU. A random preset's logits are flatter than a trained model's, so its agreement
is a floor for a real checkpoint's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.config import EngineConfig  # noqa: E402
from engine.engine import Engine  # noqa: E402


def drafts(source: str, dtype: str, contexts: list[np.ndarray], k: int) -> list[list[int]]:
    length = max(len(c) for c in contexts)
    engine = Engine.load(source, EngineConfig(max_seq_len=length + k, dtype=dtype, max_draft_tokens=k))
    return [engine.draft(context, k) for context in contexts]


def accepted(draft: list[int], reference: list[int]) -> int:
    return next((i for i, (a, b) in enumerate(zip(draft, reference, strict=True)) if a != b), len(draft))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="bench-cpu", help="preset or checkpoint directory")
    parser.add_argument("--fp8", default="", help="comma-separated FP8 exports of the same model")
    parser.add_argument("--contexts", type=int, default=32)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    reference_engine = Engine.load(args.model, EngineConfig(max_seq_len=args.length + args.k))
    vocab = reference_engine.loaded.config.vocab_size
    del reference_engine
    contexts = [rng.integers(0, vocab, args.length) for _ in range(args.contexts)]
    reference = drafts(args.model, "float32", contexts, args.k)
    variants = {"bfloat16": (args.model, "bfloat16")}
    variants |= {f"fp8 {Path(d).name} (bf16)": (d, "bfloat16") for d in filter(None, args.fp8.split(","))}
    print(f"{args.model}: {args.contexts} contexts of {args.length} tokens, k = {args.k}, against fp32")
    print("| variant | mean accepted of k | all k equal | first token equal |")
    print("|---|---|---|---|")
    for name, (source, dtype) in variants.items():
        ours = drafts(source, dtype, contexts, args.k)
        kept = [accepted(d, r) for d, r in zip(ours, reference, strict=True)]
        whole = sum(n == args.k for n in kept) / len(kept)
        first = sum(d[0] == r[0] for d, r in zip(ours, reference, strict=True)) / len(kept)
        print(f"| {name} | {statistics.mean(kept):.1f} | {whole:.0%} | {first:.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
