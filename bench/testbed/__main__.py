"""`python -m bench.testbed build [--out DIR] [--miniature]`: builds the testbed pair (26 minutes on a
2-core AMD EPYC; the miniature takes seconds). `python -m bench.testbed check [DIR]`: the pair on disk matches
its recipe (exit 1 with the reason if not)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

# Before torch/torchao are imported: their CPU-only import chatter is not the user's concern.
for noisy in ("torchao", "torch.utils._pytree"):
    logging.getLogger(noisy).setLevel(logging.ERROR)

from bench.testbed.build import PAIR, MismatchError, build, check, main_log  # noqa: E402
from bench.testbed.recipe import FULL, MINIATURE  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.testbed", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    build_parser = commands.add_parser("build", help="build the pair (replaces DIR when done)")
    build_parser.add_argument("--out", type=Path, default=PAIR, help=f"destination [{PAIR}]")
    build_parser.add_argument("--miniature", action="store_true", help="the suite's seconds-long recipe")
    check_parser = commands.add_parser("check", help="the pair matches the recipe and its manifest")
    check_parser.add_argument("directory", type=Path, nargs="?", default=PAIR)
    check_parser.add_argument("--miniature", action="store_true")
    args = parser.parse_args(argv)
    recipe = MINIATURE if args.miniature else FULL
    main_log()
    if args.command == "build":
        build(recipe, args.out)
        print((args.out / "report.md").read_text())
        return 0
    try:
        manifest = check(recipe, args.directory)
    except MismatchError as error:
        print(f"testbed: {error}", file=sys.stderr)
        return 1
    print(f"{args.directory}: recipe {manifest['recipe_key']}, {len(manifest['files'])} files match")
    return 0


if __name__ == "__main__":
    sys.exit(main())
