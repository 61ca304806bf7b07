"""bench/ahead.py's command line: the pair (--testbed, the default, or --realpair), and the defaults each
fills in for the flags not given.

The real pair's sizes are set by its target: Qwen2.5-Coder-1.5B in float32 decodes about 2.4 tokens/s on a
2-core CPU, and each prompt is decoded five times (alone, then per floor with --draft-ahead 0 and N), each
setting behind a fresh server (~10-20 s to start and warm). Its quick prompts (short answers, most ending at
`<|im_end|>` before the cap) are the only ones that fit: the default takes both of each kind at 64 new
tokens (about 20 minutes), `--quick` the first of each kind at 48 (about 8).

k = 3, the largest whose ahead loop fits in the verify the floor stands for: a loop drafts k tokens and takes
one step more for its choices (k + 1 steps), the server plans one only when it would end before the
session's next call, and this pair's H100 verify lasts 4.9 of its draft steps (bench/harness/gpu_floors.py).
At k = 4, the acceptance run's (bench/README.md: 3.5-4.6 tokens a round), a loop needs 5 steps against a
gap of 4.9 plus the client's few ms, so under that floor the server should find nearly every plan too slow,
rightly (not yet measured: `--num-draft-tokens 4` would). Not
auto: it weighs k against the verify time, which the floor changes, so k would change with the floor and
the settings would differ in more than drafting ahead.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.harness.gpu_floors import GPU_MODELS
from bench.harness.projection import GpuModel
from bench.pair_choice import add_pair_arguments
from bench.realpair import benchmark as realpair
from bench.testbed import PAIR
from drafter.integrations.transformers_generate import AUTO

AUTO_FLOOR = "auto"
WORKLOADS = "code,edit,prose"  # both pairs' workload names
TESTBED_K = 8
REALPAIR_PROMPTS, REALPAIR_NEW_TOKENS = 2, 64
QUICK_PROMPTS, QUICK_NEW_TOKENS = 1, 48
REALPAIR_FLOORS = f"0,{AUTO_FLOOR}"
REALPAIR_GPU = "qwen2.5-coder-1.5b"  # bench/harness/gpu_floors.py's model of this pair's shapes


def fitting_k(gpu: GpuModel) -> int:
    """The largest k whose ahead loop (k + 1 steps) fits in one of `gpu`'s verifies."""
    return max(1, int(gpu.verify_ms / gpu.draft_step_ms) - 1)


def floors(text: str) -> list[float | str]:
    """`0,auto,80`: verify floors in ms, or `auto`."""
    chosen = []
    for word in text.split(","):
        word = word.strip()
        try:
            chosen.append(AUTO_FLOOR if word == AUTO_FLOOR else float(word))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f'expected ms or "auto", comma-separated, got {text!r}'
            ) from None
        if chosen[-1] != AUTO_FLOOR and chosen[-1] < 0:
            raise argparse.ArgumentTypeError(f"a floor is at least 0 ms, got {word}")
    return chosen


def parse_args(argv, description: str):
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_pair_arguments(parser, "--realpair: its first quick prompt per kind, 48 new tokens (~8 min)")
    parser.add_argument("--branches", type=int, default=8, help="--draft-ahead of the 'on' runs [8]")
    parser.add_argument(
        "--num-draft-tokens", help="k, or auto [8; --realpair: 3, whose ahead loop fits in its GPU verify]"
    )
    parser.add_argument("--workloads", default=WORKLOADS, help=f"the pair's workloads to run [{WORKLOADS}]")
    parser.add_argument(
        "--max-prompts", type=int, help="first N prompts of each workload [all; --realpair: 2, quick 1]"
    )
    parser.add_argument("--max-new-tokens", type=int, help="[the recipe's; --realpair: 64, quick 48]")
    parser.add_argument(
        "--verify-floor-ms",
        type=floors,
        help="every verify pass lasts at least this, one run pair per floor: ms, or auto (the GPU's ratio "
        "of verify to draft step times the server's ahead step) [0; --realpair: 0,auto]",
    )
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args(argv)
    if args.quick and not args.realpair:
        parser.error("--quick picks --realpair's quick run: give --realpair")
    args.testbed = None if args.realpair else args.testbed or PAIR
    args.pair = args.realpair or args.testbed
    if args.realpair:
        args.gpu = GPU_MODELS[REALPAIR_GPU]
        args.num_draft_tokens = args.num_draft_tokens or str(fitting_k(args.gpu))
        quick = args.quick
        args.max_prompts = args.max_prompts or (QUICK_PROMPTS if quick else REALPAIR_PROMPTS)
        args.max_new_tokens = args.max_new_tokens or (QUICK_NEW_TOKENS if quick else REALPAIR_NEW_TOKENS)
        args.verify_floor_ms = args.verify_floor_ms or floors(REALPAIR_FLOORS)
    else:
        from bench.testbed.recipe import FULL

        args.num_draft_tokens = args.num_draft_tokens or str(TESTBED_K)
        args.max_new_tokens = args.max_new_tokens or FULL.workload_new_tokens
        args.verify_floor_ms = args.verify_floor_ms or [0.0]
        args.gpu = GpuModel()  # Qwen3-8B over Qwen3-0.6B FP8, the testbed's stand-in
    args.k = AUTO if args.num_draft_tokens == AUTO else int(args.num_draft_tokens)
    args.workloads = args.workloads.split(",")
    # What bench.pair_choice.open_target reads: the testbed's workload files, or the real pair's quick
    # prompts (short answers: the only ones whose five decodes fit the run); the FP8 weight-only drafter;
    # the target in float32 on the CPU (greedy and exact, so "lossless" means every token equal).
    args.drafter, args.device, args.dtype = "weight-only", "cpu", "float32"
    args.target = args.pair / realpair.TARGET
    args.prompts = sorted((args.testbed / "workloads").glob("*.jsonl")) if args.testbed else None
    return args
