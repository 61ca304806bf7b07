"""The acceptance benchmark: a transformers target decodes greedily with drafts from a running drafter server
(drafter/integrations/transformers_generate.py, through drafter.client), and we measure the tokens each round gains, the speed against target-only greedy
decoding on the same prompts, and that the two outputs agree token for token (lossless).

    python bench/acceptance.py --target DIR --url http://127.0.0.1:8000 [--prompts FILE] [--json OUT]

The JSON report's `mean_accepted_tokens`, `acceptance_by_position` and `rounds` are defined by
`SpeculationStats` in drafter/integrations/transformers_generate.py (a perfect drafter scores k + 1). Prompts are JSONL, one `{"tokens": [ids]}`,
`{"text": "..."}` (needs the target's tokenizer) or bare list of ids per line; without a file, seeded random
ids. Without --stop-at-eos both paths decode through EOS (`min_new_tokens` masks it, as `generate` does).
Exit 2 on bad input or an unusable server (one line on stderr; a draft call the client had to skip counts
as unusable, since acceptance measured without drafts means nothing), 1 if the outputs differ.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

import drafter.integrations.target
from bench.prompts import (
    WARMUP_PROMPT_LEN,
    WARMUP_SEED,
    BenchError,
    load_prompts,
    random_prompts,
    read_prompt_lines,
)
from bench.refusals import ServerRefused
from drafter.client import DraftClient, DraftRequestError, TransportError
from drafter.integrations.transformers_generate import SpeculationStats, speculative_decoding

# transformers imports torchao, whose CPU-only import chatter is not the user's concern.
for noisy in ("torchao", "torch.utils._pytree"):
    logging.getLogger(noisy).setLevel(logging.ERROR)


DRAFT_TIMEOUT_S = 60  # a benchmark waits for every draft; a target would not (drafter.client's policy)


def server_info(client: DraftClient) -> dict:
    """/info once the server is ready; every failure becomes a BenchError naming the server."""
    try:
        ready = client.get("/health/ready", timeout_s=DRAFT_TIMEOUT_S)
        if ready.status != 200:
            raise BenchError(f"the drafter at {client.url} is not ready: {ready.content[:200]!r}")
        return client.info()
    except TransportError as error:
        raise BenchError(f"cannot reach the drafter at {client.url}: {error}") from None


@torch.inference_mode()
def target_greedy(model, prompt: list[int], max_new_tokens: int, stop_at_eos: bool = False) -> list[int]:
    """The reference: transformers' own greedy decoding, new tokens only."""
    return generate(model, prompt, max_new_tokens, stop_at_eos)


def speculative_greedy(
    model,
    client: DraftClient,
    prompt: list[int],
    max_new_tokens: int,
    stats: SpeculationStats,
    stop_at_eos: bool,
) -> list[int]:
    skipped = stats.num_skipped
    kwargs = dict(draft_client=client, num_draft_tokens=stats.num_draft_tokens, speculation_stats=stats)
    new = generate(model, prompt, max_new_tokens, stop_at_eos, custom_generate=speculative_decoding, **kwargs)
    if stats.num_skipped > skipped:
        raise BenchError(f"{stats.num_skipped - skipped} draft calls to {client.url} failed (see its log)")
    return new


def generate(model, prompt: list[int], max_new_tokens: int, stop_at_eos: bool, **kwargs) -> list[int]:
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        min_new_tokens=0 if stop_at_eos else max_new_tokens,
        **kwargs,
    )
    return out[0, len(prompt) :].tolist()


def load_target(directory: Path, device: str, dtype: str):
    try:
        return drafter.integrations.target.load_target(directory, device, dtype)
    except ValueError as error:
        raise BenchError(str(error)) from None


def percentiles(values: list[float]) -> dict:
    if not values:
        return {"p50": None, "p99": None, "mean": None}
    p50, p99 = np.percentile(values, [50, 99])
    return {"p50": float(p50), "p99": float(p99), "mean": float(np.mean(values))}


def parse_args(argv):
    def positive(text: str) -> int:
        if not text.isdigit() or int(text) < 1:
            raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
        return int(text)

    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--target", required=True, type=Path, help="HF checkpoint directory of the target, or a preset"
    )
    parser.add_argument("--url", required=True, help="base URL of a running drafter server")
    parser.add_argument("--prompts", type=Path, help="JSONL: {'tokens': [...]}, {'text': ...} or [ids]")
    parser.add_argument("--json", type=Path, help="write the report here")
    parser.add_argument("--max-new-tokens", type=positive, default=64)
    parser.add_argument("--num-draft-tokens", type=positive, default=8)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if cuda else "cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), help="[bfloat16 on CUDA, float32 on CPU]")
    parser.add_argument("--api-key", help="bearer token for the server [DRAFTER_API_KEY]")
    parser.add_argument("--stop-at-eos", action="store_true", help="end a prompt at EOS (both paths)")
    args = parser.parse_args(argv)
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    args.api_key = args.api_key or os.environ.get("DRAFTER_API_KEY")
    return args


def prepare(args, client: DraftClient):
    """The target, the prompts and a warm-up prompt, checked against the server's limits; the prompts
    file is read before anything slow so that a typo fails at once."""
    entries = read_prompt_lines(args.prompts) if args.prompts else None
    info = server_info(client)
    if args.num_draft_tokens > info["max_draft_tokens"]:
        raise BenchError(
            f"--num-draft-tokens {args.num_draft_tokens}: the server drafts at most {info['max_draft_tokens']}"
        )
    model = load_target(args.target, args.device, args.dtype)
    vocab_size = model.config.vocab_size
    if info["vocab_size"] != vocab_size:
        raise BenchError(
            f"the drafter's vocabulary ({info['vocab_size']}) is not the target's ({vocab_size}); "
            "speculative decoding needs one tokenizer"
        )
    if args.max_new_tokens > info["max_context"]:
        raise BenchError(
            f"--max-new-tokens {args.max_new_tokens} exceeds the server's max context {info['max_context']}"
        )
    prompts = load_prompts(args, entries, vocab_size, info["max_context"])
    # Its own random ids (a prompt it shared would reach the server's cache warm), no longer than any prompt.
    [warmup] = random_prompts(vocab_size, min(map(len, prompts)), (WARMUP_PROMPT_LEN,), WARMUP_SEED)
    return model, prompts, warmup, info


@dataclass
class Measured:
    stats: SpeculationStats
    outputs: list[list[int]]
    reference: list[list[int]]  # target-only
    target_s: float = 0.0
    speculative_s: float = 0.0


def measure(args, model, client: DraftClient, prompts, warmup) -> Measured:
    """Both paths on every prompt, each timed as a whole, after one untimed warm-up of each."""
    n, k, stop = args.max_new_tokens, args.num_draft_tokens, args.stop_at_eos

    target_greedy(model, warmup, n, stop)
    speculative_greedy(model, client, warmup, n, SpeculationStats(k), stop)
    measured = Measured(SpeculationStats(k), [], [])
    for prompt in tqdm(prompts, desc="acceptance", unit="prompt", file=sys.stderr):
        started = time.perf_counter()
        measured.reference.append(target_greedy(model, prompt, n, stop))
        measured.target_s += time.perf_counter() - started
        started = time.perf_counter()
        measured.outputs.append(speculative_greedy(model, client, prompt, n, measured.stats, stop))
        measured.speculative_s += time.perf_counter() - started
    return measured


def first_mismatch(output: list[int], reference: list[int]) -> int | None:
    if output == reference:
        return None
    shorter = min(len(output), len(reference))
    return next((i for i in range(shorter) if output[i] != reference[i]), shorter)


def build_report(args, info: dict, measured: Measured) -> dict:
    stats, outputs, reference = measured.stats, measured.outputs, measured.reference
    target_s, speculative_s = measured.target_s, measured.speculative_s
    mismatches = [first_mismatch(out, ref) for out, ref in zip(outputs, reference, strict=True)]
    return {
        "mean_accepted_tokens": stats.mean_accepted_tokens,
        "acceptance_by_position": stats.acceptance_by_position,
        "outputs": outputs,
        "target_only_outputs": reference,
        "lossless": all(m is None for m in mismatches),
        "first_mismatch": mismatches,
        "target_only_s": target_s,
        "speculative_s": speculative_s,
        "speedup": target_s / speculative_s,
        "rounds": stats.num_rounds,
        "draft_call_ms": percentiles(stats.draft_call_ms),
        "config": {
            "target": str(args.target),
            "url": args.url,
            "num_draft_tokens": args.num_draft_tokens,
            "max_new_tokens": args.max_new_tokens,
            "stop_at_eos": args.stop_at_eos,
            "device": args.device,
            "dtype": args.dtype,
            "num_prompts": len(outputs),
            "drafter": {key: info.get(key) for key in ("model", "quantization", "device", "dtype")},
            "versions": {name: metadata.version(name) for name in ("torch", "transformers")},
        },
    }


def print_summary(report: dict) -> None:
    k, calls = report["config"]["num_draft_tokens"], report["draft_call_ms"]
    by_position = " ".join("-" if a is None else f"{a:.2f}" for a in report["acceptance_by_position"])
    print(
        f"mean accepted tokens {report['mean_accepted_tokens']:.2f} per round, of at most {k + 1} "
        f"({report['rounds']} rounds); acceptance by draft position: {by_position}"
    )
    print(
        f"target-only {report['target_only_s']:.2f} s, speculative {report['speculative_s']:.2f} s: "
        f"speedup {report['speedup']:.2f}x"
    )
    if calls["p50"] is not None:
        print(
            f"/draft calls: p50 {calls['p50']:.1f} ms, p99 {calls['p99']:.1f} ms, mean {calls['mean']:.1f} ms"
        )
    differing = [
        f"prompt {i} at new token {m}" for i, m in enumerate(report["first_mismatch"]) if m is not None
    ]
    print("lossless: yes" if report["lossless"] else f"lossless: NO, output differs: {', '.join(differing)}")


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        client = DraftClient(args.url, args.api_key, timeout_s=DRAFT_TIMEOUT_S)
    except ValueError as error:  # a URL it cannot use
        print(f"acceptance: error: {error}", file=sys.stderr)
        return 2
    try:
        model, prompts, warmup, info = prepare(args, client)
        report = build_report(args, info, measure(args, model, client, prompts, warmup))
        if args.json:
            args.json.write_text(json.dumps(report, indent=1) + "\n")
    except DraftRequestError as error:
        print(f"acceptance: error: {ServerRefused.from_client(error)}", file=sys.stderr)
        return 2
    except (BenchError, OSError) as error:
        print(f"acceptance: error: {error}", file=sys.stderr)
        return 2
    finally:
        client.close()
    print_summary(report)
    return 0 if report["lossless"] else 1


if __name__ == "__main__":
    sys.exit(main())
