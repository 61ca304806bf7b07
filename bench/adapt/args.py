"""bench/adapt/run.py's command line: the pair (the testbed, the default, or `--realpair`), and the defaults each
pair's run takes where a flag is not given: the testbed's sized for its tiny models, the real pair's for a
1.5B target on 2 cores."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.adapt.stream import CODE_ROOTS
from bench.harness.decoding import PAIR_DRAFTERS
from bench.harness.server import REPO
from bench.realpair.benchmark import DEFAULT_DIR as REALPAIR_DIR
from bench.testbed import PAIR
from drafter.integrations.transformers_generate import AUTO

TESTBED_RUN = {
    "num_draft_tokens": 8,
    "think_s": 1.0,
    "target_threads": 1,
    "adapt_rank": 0,
    "dtype": "float32",
}
FULL = {"prompts": 120, "max_new_tokens": 128, "window": 8}  # ~15k target tokens, 7-11 min on 2 busy cores
QUICK = {"prompts": 40, "max_new_tokens": 96, "window": 5}  # ~4k, ~2 min
# The real pair: its target decodes ~2.4 tokens/s (fp32, 2 threads), a drafter step ~0.2 s, a rank-8 adapter
# step ~3 s (docs/adaptation.md). One thread for the target would halve its speed; the servers are idle or
# paused while it decodes. The servers in bf16: in fp32 the adapting server's swaps (new packed linears beside
# the old, the trainer's merged weights) peaked past 13 GB beside the 1.5B target and were OOM-killed.
REALPAIR_RUN = {
    "num_draft_tokens": 4,
    "think_s": 20.0,
    "target_threads": 2,
    "adapt_rank": 8,
    "dtype": "bfloat16",
}
REALPAIR_FULL = {"prompts": 32, "max_new_tokens": 64, "window": 4}  # ~2k target tokens, ~1 h
REALPAIR_QUICK = {"prompts": 8, "max_new_tokens": 48, "window": 4}  # ~15 min


def num_draft_tokens(text: str) -> int | str:
    if text == AUTO or (text.isdigit() and int(text) >= 1):
        return text if text == AUTO else int(text)
    raise argparse.ArgumentTypeError(f'expected a positive integer or "auto", got {text!r}')


def shown(path: Path) -> str:
    """A path as a report shows it: relative to the checkout when inside it (the committed pair)."""
    path = path.resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def parse_args(argv, doc: str):
    """The arguments, each pair's defaults filled in; `doc`: bench/adapt/run.py's, for --help."""
    parser = argparse.ArgumentParser(
        description=doc.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    pairs = parser.add_mutually_exclusive_group()
    pairs.add_argument("--testbed", nargs="?", const=PAIR, type=Path, metavar="DIR",
                       help="the testbed pair's directory [the committed pair; the default pair]")  # fmt: skip
    pairs.add_argument("--realpair", nargs="?", const=REALPAIR_DIR, type=Path, metavar="DIR",
                       help=f"the real pair's directory [{shown(REALPAIR_DIR)}]")  # fmt: skip
    add_roots_argument(parser)
    parser.add_argument("--drafter", choices=PAIR_DRAFTERS, default="weight-only", help="[weight-only]")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK['prompts']} shorter prompts")
    parser.add_argument("--prompts", type=int, help=f"prompts in the stream [{FULL['prompts']}]")
    parser.add_argument("--max-new-tokens", type=int, help=f"per prompt [{FULL['max_new_tokens']}]")
    parser.add_argument("--window", type=int, help=f"prompts per window [{FULL['window']}]")
    parser.add_argument("--num-draft-tokens", type=num_draft_tokens, help="k, or auto [8; real pair 4]")
    parser.add_argument("--think-s", type=float, help="idle time after each prompt [1.0; real pair 20]")
    parser.add_argument("--target-threads", type=int, help="the target's torch threads [1; real pair 2]")
    parser.add_argument("--adapt-rank", type=int, help="the adapting server's --adapt-rank [0; real pair 8]")
    parser.add_argument(
        "--dtype", choices=("float32", "bfloat16"), help="both servers' [float32; real pair bfloat16]"
    )
    parser.add_argument("--out", type=Path, help="write report.json, report.md and adapt.png here")
    args = parser.parse_args(argv)
    args.pair = "realpair" if args.realpair else "testbed"
    args.directory = args.realpair or args.testbed or PAIR
    if args.realpair:
        defaults = {**REALPAIR_RUN, **(REALPAIR_QUICK if args.quick else REALPAIR_FULL)}
    else:
        defaults = {**TESTBED_RUN, **(QUICK if args.quick else FULL)}
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if min(args.prompts, args.max_new_tokens, args.window, args.target_threads) < 1 or args.think_s < 0:
        parser.error(
            "--prompts, --max-new-tokens, --window and --target-threads must be positive, --think-s not negative"
        )
    return args


def add_model_argument(parser: argparse.ArgumentParser) -> None:
    """--model for a benchmark that loads the drafter in its own process (bench.adapt.swap, .preempt)."""
    parser.add_argument(
        "--model",
        default=str(REALPAIR_DIR / PAIR_DRAFTERS["weight-only"]),
        help="a checkpoint directory or preset [the real pair's FP8 weight-only drafter]",
    )


def code_roots(text: str) -> tuple[str, ...]:
    roots = tuple(text.split(","))
    if missing := [root for root in roots if not (REPO / root).is_dir()]:
        raise argparse.ArgumentTypeError(f"no folder {', '.join(missing)} in this checkout")
    return roots


def add_roots_argument(parser: argparse.ArgumentParser) -> None:
    """--roots: the folders of this project whose Python the real pair's stream is cut from."""
    parser.add_argument(
        "--roots",
        type=code_roots,
        default=CODE_ROOTS,
        help=f"the real pair's stream: this project's folders to cut it from [{','.join(CODE_ROOTS)}]",
    )
