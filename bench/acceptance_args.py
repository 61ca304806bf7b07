"""bench/acceptance.py's command line: its flags, and the defaults each pair (--testbed, --realpair) fills in
for those not given."""

from __future__ import annotations

import argparse
import importlib.util
import os
from dataclasses import replace
from pathlib import Path

import torch

from bench.harness.decoding import PAIR_DRAFTERS
from bench.harness.gpu_floors import GPU_MODELS
from bench.pair_choice import add_pair_arguments
from bench.realpair import benchmark as realpair
from drafter.integrations.transformers_generate import AUTO
from drafter.sessions.draft_source import MODEL, SOURCES


def draft_lengths(text: str) -> list[int | str]:
    lengths = []
    for word in text.split(","):
        word = word.strip()
        if word != AUTO and not (word.isdigit() and int(word) >= 1):
            raise argparse.ArgumentTypeError(
                f'expected positive integers or "auto", comma-separated, got {text!r}'
            )
        lengths.append(AUTO if word == AUTO else int(word))
    return lengths


def draft_sources(text: str) -> list[str]:
    sources = [word.strip() for word in text.split(",")]
    if not sources or any(source not in SOURCES for source in sources):
        raise argparse.ArgumentTypeError(
            f"expected some of {', '.join(SOURCES)}, comma-separated, got {text!r}"
        )
    return sources


def gpu_models(text: str) -> list[str]:
    names = [word.strip() for word in text.split(",")]
    if any(name not in GPU_MODELS for name in names):
        raise argparse.ArgumentTypeError(f"expected some of {', '.join(GPU_MODELS)}, got {text!r}")
    return names


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def parser_for(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_pair_arguments(parser, "--realpair: its quick prompts, 2 per kind")
    parser.add_argument(
        "--drafter", choices=PAIR_DRAFTERS, default="weight-only", help="the pair's drafter [weight-only]"
    )
    parser.add_argument("--target", type=Path, help="HF checkpoint directory of the target, or a preset")
    parser.add_argument("--url", help="base URL of a running drafter server [a pair: servers it starts]")
    parser.add_argument("--prompts", type=Path, action="append", help="a workload's JSONL (repeatable)")
    parser.add_argument("--json", type=Path, help="write the report here")
    parser.add_argument("--out", type=Path, help="write report.json, report.md and speedup.png here")
    parser.add_argument(
        "--max-new-tokens", type=positive, help="[64; --testbed: the recipe's; --realpair: 96, quick 64]"
    )
    parser.add_argument(
        "--num-draft-tokens",
        type=draft_lengths,
        help="e.g. 2,4,8,16,auto [8; --testbed: 2,4,8,16,auto; --realpair: 4,8,auto]",
    )
    parser.add_argument(
        "--source",
        type=draft_sources,
        help="draft sources to measure, e.g. model,suffix,hybrid (drafter.sessions.draft_source) "
        "[model; --realpair: model,hybrid]",
    )
    cuda = torch.cuda.is_available()
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if cuda else "cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), help="[bfloat16 on CUDA, float32 on CPU]")
    parser.add_argument("--api-key", help="bearer token for the server [DRAFTER_API_KEY]")
    parser.add_argument(
        "--stop-at-eos",
        action=argparse.BooleanOptionalAction,
        help="end a prompt at EOS, both paths [off; --realpair: on]",
    )
    parser.add_argument(
        "--gpu-model",
        type=gpu_models,
        help=f"projected GPU columns, of {', '.join(GPU_MODELS)} (bench/harness/gpu_floors.py) "
        "[qwen3-8b; --realpair: both]",
    )
    parser.add_argument("--gpu-verify-ms", type=float, help="replace the first GPU model's verify")
    parser.add_argument("--gpu-draft-step-ms", type=float, help="... its draft step")
    parser.add_argument("--gpu-draft-overhead-ms", type=float, help="... its overhead per draft call")
    return parser


def parse_args(argv, description: str):
    parser = parser_for(description)
    args = parser.parse_args(argv)
    if args.out and importlib.util.find_spec("matplotlib") is None:  # before the run, not after it
        parser.error("--out draws speedup.png with matplotlib: pip install -e '.[bench]'")
    if args.quick and not args.realpair:
        parser.error("--quick picks --realpair's quick prompts: give --realpair")
    args.pair = args.testbed or args.realpair  # where the drafters are, for servers it starts
    if args.testbed:
        from bench.testbed.recipe import FULL

        args.target = args.target or args.testbed / "target"
        args.prompts = args.prompts or sorted((args.testbed / "workloads").glob("*.jsonl"))
        args.max_new_tokens = args.max_new_tokens or FULL.workload_new_tokens
        args.num_draft_tokens = args.num_draft_tokens or [2, 4, 8, 16, AUTO]
    elif args.realpair:  # its workloads come from bench/realpair/prompts.jsonl unless --prompts are given
        args.target = args.target or args.realpair / realpair.TARGET
        quick = realpair.QUICK_MAX_NEW_TOKENS if args.quick else realpair.MAX_NEW_TOKENS
        args.max_new_tokens = args.max_new_tokens or quick
        args.num_draft_tokens = args.num_draft_tokens or list(realpair.NUM_DRAFT_TOKENS)
        args.source = args.source or list(realpair.SOURCES)
        args.stop_at_eos = True if args.stop_at_eos is None else args.stop_at_eos
        args.gpu_model = args.gpu_model or list(realpair.GPU_MODELS)
    elif args.target is None or args.url is None:
        parser.error("give --testbed, --realpair, or both --target and --url")
    args.max_new_tokens = args.max_new_tokens or 64
    args.num_draft_tokens = args.num_draft_tokens or [8]
    args.source = args.source or [MODEL]
    args.stop_at_eos = bool(args.stop_at_eos)
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    args.api_key = args.api_key or os.environ.get("DRAFTER_API_KEY")
    args.gpus = projected_gpus(args)
    return args


def projected_gpus(args) -> list:
    """The GPU models to project on, the first with any figure the command line gives in place of its own."""
    gpus = [GPU_MODELS[name] for name in args.gpu_model or ["qwen3-8b"]]
    given = {
        "verify_ms": args.gpu_verify_ms,
        "draft_step_ms": args.gpu_draft_step_ms,
        "draft_overhead_ms": args.gpu_draft_overhead_ms,
    }
    given = {field: value for field, value in given.items() if value is not None}
    if given:
        figures = ", ".join(f"{field} {value}" for field, value in given.items())
        gpus[0] = replace(
            gpus[0], **given, name=f"{gpus[0].name}, as given", basis=f"{gpus[0].basis} Given: {figures}."
        )
    return gpus
