"""Which pair a benchmark decodes with, and its target opened for decoding: what bench/acceptance.py and
bench/ahead.py share, so that both choose, check and load a pair the same way.

- `add_pair_arguments`: `--testbed [DIR]` or `--realpair [DIR]` (one of them), and `--quick`;
- `open_target`: for the real pair, its fetch checked on disk and its chat tokenizer read before anything
  slow (a missing fetch fails in one line); the workloads read; the target loaded and, under a chat
  tokenizer, set to plain greedy decoding that stops at the chat's end (bench/realpair/benchmark.py).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.harness.decoding import PAIR_DRAFTERS, load_target
from bench.harness.prompts import read_prompt_lines
from bench.realpair import benchmark as realpair
from bench.testbed import PAIR


def add_pair_arguments(parser: argparse.ArgumentParser, quick_help: str) -> None:
    pair = parser.add_mutually_exclusive_group()
    pair.add_argument(
        "--testbed", nargs="?", const=PAIR, type=Path, metavar="DIR", help="the testbed pair's directory"
    )
    pair.add_argument(
        "--realpair",
        nargs="?",
        const=realpair.DEFAULT_DIR,
        type=Path,
        metavar="DIR",
        help=f"the real pair's directory, as `{realpair.FETCH}` leaves it [build/realpair]",
    )
    parser.add_argument("--quick", action="store_true", help=quick_help)


def read_workloads(args, tokenizer, quick_prompts: bool) -> dict[str, list] | None:
    """Workload name -> its prompt file's entries (--realpair without --prompts: its three kinds under the
    target's chat template, only the quick ones if `quick_prompts`), read before anything slow so that a typo
    fails at once."""
    if args.realpair and not args.prompts:
        return realpair.workload_entries(tokenizer, quick_prompts)
    if not args.prompts:
        return None
    workloads: dict[str, list] = {}
    for path in args.prompts:
        entries = read_prompt_lines(path)
        first = entries[0][1]
        name = first.get("workload") if isinstance(first, dict) else None
        workloads.setdefault(name if isinstance(name, str) else path.stem, []).extend(entries)
    return workloads


def open_target(args, quick_prompts: bool):
    """(the target model, its workloads as `read_workloads` gives them, its generation settings for the
    report), from `args`: realpair, drafter, target, prompts, device, dtype."""
    tokenizer = None
    if args.realpair:
        realpair.check_fetched(args.realpair, PAIR_DRAFTERS[args.drafter])
        tokenizer = realpair.chat_tokenizer(args.target)
    workloads = read_workloads(args, tokenizer, quick_prompts)
    model = load_target(args.target, args.device, args.dtype)
    generation = realpair.plain_greedy(model, tokenizer) if tokenizer else {"decoding": "greedy"}
    return model, workloads, generation
