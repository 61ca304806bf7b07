"""How far any per-call choice between the model's draft and a suffix-led one could go on the testbed: the
target's greedy outputs replayed round by round, with a policy that knows each round's truth.

    python -m bench.suffix.oracle [--workload edit] [--k 8]

For each prompt of the workload, the target's greedy continuation is the truth. Each policy walks it in
rounds: it drafts for the context so far, keeps the drafts that match the truth plus the target's own
token, and goes on. `model`: the drafter model's k drafts (from a testbed server, `"source": "model"`).
`suffix`: the suffix draft (drafter.sessions.suffix_drafts, in this process, fed as a server feeds it: a
session's context after each call, earlier prompts' responses in the global index). `best of both`: per
round, whichever of the model's draft and the suffix draft continued by the model (what a hybrid call
sends when the suffix leads) keeps more tokens, chosen knowing the truth: no rule can choose better, so it
bounds what `"hybrid"` can reach with these two drafts. Prints tokens per round for each.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from bench.harness.decoding import drafter_url, load_target, target_greedy
from bench.harness.prompts import read_prompt_lines
from bench.testbed import PAIR
from drafter.client import DraftClient
from drafter.sessions.suffix_drafts import SuffixDrafts, SuffixRules

NEW_TOKENS = 128


def kept(drafts: list[int], truth: list[int]) -> int:
    """Drafts the target keeps plus its own token, as a round of speculative decoding adds them."""
    accepted = next((i for i, (d, t) in enumerate(zip(drafts, truth, strict=False)) if d != t), len(drafts))
    return min(accepted + 1, len(truth))


def replay(policy: str, prompts, truths, model_draft, k: int) -> float:
    store = SuffixDrafts(SuffixRules(), local_tokens=10**6, global_tokens=65536)
    rounds = total = 0
    for n, (prompt, truth) in enumerate(zip(prompts, truths, strict=True)):
        position = 0
        while position < len(truth):
            context = prompt + truth[:position]
            suffix = store.lookup(f"s{n}", np.asarray(context, dtype=np.int64), k, trusted=True).tokens
            store.update(f"s{n}", np.asarray(context, dtype=np.int64))  # indexed after the call, as served
            while store.work(budget_s=1.0):
                pass
            rest = truth[position:]
            if policy == "model":
                gained = kept(model_draft(context, k), rest)
            elif policy == "suffix":
                gained = kept(suffix, rest)
            else:
                led = suffix + (model_draft(context + suffix, k - len(suffix)) if 0 < len(suffix) < k else [])
                gained = max(kept(model_draft(context, k), rest), kept(led, rest) if suffix else 0)
            rounds, total, position = rounds + 1, total + gained, position + gained
    return total / rounds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="edit", choices=("code", "edit", "prose"))
    parser.add_argument("--k", type=int, default=8)
    args = parser.parse_args(argv)
    setup = argparse.Namespace(
        pair=PAIR,
        url=None,
        drafter="weight-only",
        device="cpu",
        max_new_tokens=NEW_TOKENS,
        api_key=None,
    )
    model = load_target(PAIR / "target", "cpu", "float32")
    prompts = [
        entry["tokens"] for _, entry in read_prompt_lines(PAIR / "workloads" / f"{args.workload}.jsonl")
    ]
    truths = [target_greedy(model, prompt, NEW_TOKENS) for prompt in prompts]
    with drafter_url(setup, model) as (url, _, _), DraftClient(url, timeout_s=60) as client:
        cache: dict = {}

        def model_draft(context: list[int], k: int) -> list[int]:
            key = (tuple(context), k)
            if key not in cache:
                cache[key] = client.draft(context, k, source="model").tokens
            return cache[key]

        print(f"{args.workload}, k = {args.k}, {len(prompts)} prompts, tokens per round:")
        for policy in ("model", "suffix", "best of both"):
            print(f"  {policy:>12}: {replay(policy, prompts, truths, model_draft, args.k):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
