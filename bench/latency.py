"""Per-call draft latency of our engine and server, against transformers on the same weights, in one run.

    python -m bench.latency --quick                      # tiny preset on CPU, 34 rows, 2-4 minutes
    python -m bench.latency --model bench-cpu            # CPU-sized body, the real 151936-token vocabulary
    python -m bench.latency --model DIR                  # CUDA: an FP8 export of Qwen3-0.6B

Variants: `eager`, `compiled` (torch.compile), `graphs` (compile + CUDA graphs) call the engine in-process;
`http` posts to a real server (spawned, or `--url`); `hf-generate` (per-request generate from scratch) and
`hf-reuse` (transformers with its KV cache kept across calls) are the baselines, single-client only.
The sweep varies one factor at a time around a centre case (1k context, k = 8, one client): context length,
draft length, concurrency. See bench/README.md for measured tables.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
from pathlib import Path

import torch
from tqdm import tqdm

from bench.harness import baselines, machine, report, runners
from bench.harness.refusals import exits_2_on_refusal
from bench.harness.server import ServerProcess
from bench.harness.workload import PATTERNS, conversations, longest_context
from engine.config import EngineConfig
from engine.engine import DTYPES, Engine
from engine.model.loader import load_model
from engine.model.presets import is_preset, write_preset

ENGINE_VARIANTS = {"eager": (False, False), "compiled": (True, False), "graphs": (True, True)}
VARIANTS = (*ENGINE_VARIANTS, "http", "hf-generate", "hf-reuse")
SWEEPS = {  # contexts, draft lengths, concurrency, calls per case
    "quick": ((128, 1024, 2048), (4, 8), (1, 4), 6),
    "cpu": ((128, 512, 1024, 2048, 4096), (1, 4, 8, 16), (1, 2, 4, 8), 10),
    "cuda": ((128, 512, 1024, 2048, 4096, 8192, 16384), (1, 4, 8, 16), (1, 2, 4, 8, 16, 32), 50),
}


def ints(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(","))


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sweep of the tiny preset on CPU")
    parser.add_argument(
        "--model", help="preset (tiny, bench-cpu) or checkpoint directory [tiny; bench-cpu on CPU]"
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", help="float32 or bfloat16 [bfloat16 on CUDA, float32 on CPU]")
    parser.add_argument(
        "--url", help="bench this running server for the http variant instead of spawning one"
    )
    parser.add_argument("--api-key", help="bearer token for --url")
    parser.add_argument("--variants", help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument(
        "--patterns", default=",".join(PATTERNS), help="growing, cold, shared (comma-separated)"
    )
    parser.add_argument("--attention", help="sdpa or flex for our variants [flex on CUDA, sdpa on CPU]")
    parser.add_argument("--contexts", type=ints, help="context lengths to sweep")
    parser.add_argument("--draft-lengths", type=ints, help="num_draft_tokens to sweep")
    parser.add_argument("--concurrency", type=ints, help="clients to sweep")
    parser.add_argument("--calls", type=int, help="measured calls per client and case")
    parser.add_argument("--bandwidth-gbs", type=float, help="memory bandwidth for the floor [measured]")
    parser.add_argument(
        "--server-flags",
        action="append",
        help="extra flags for the spawned server, e.g. '--draft-ahead=8'; given again, one more http variant "
        "(`http[FLAGS]`) on its own server, run side by side with the first: an A/B in one run",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="run every case this many times, the variants in turn each time (fresh conversations), and "
        "pool the calls: interleaving spreads a shared machine's noise over every variant alike [1]",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write results here")
    parser.add_argument("--plot", help="write a PNG of latency vs context length here")
    args = parser.parse_args(argv)
    sweep = "quick" if args.quick else "cuda" if args.device.startswith("cuda") else "cpu"
    contexts, draft_lengths, concurrency, calls = SWEEPS[sweep]
    args.contexts, args.draft_lengths = args.contexts or contexts, args.draft_lengths or draft_lengths
    args.concurrency, args.calls = args.concurrency or concurrency, args.calls or calls
    if args.quick:
        args.model, args.device = args.model or "tiny", "cpu"
    if not args.model:
        if args.device.startswith("cuda"):
            parser.error("on CUDA pass --model DIR, e.g. an export: python -m export Qwen/Qwen3-0.6B DIR")
        args.model = "bench-cpu"
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    args.attention = args.attention or ("flex" if args.device.startswith("cuda") else "sdpa")
    default = ["eager", "http", "hf-generate", "hf-reuse"]
    if args.device.startswith("cuda"):
        default[1:1] = ["compiled", "graphs"]
    args.variants = args.variants.split(",") if args.variants else default
    args.patterns = args.patterns.split(",")
    for name in args.variants:
        if name not in VARIANTS:
            parser.error(f"unknown variant {name!r}; choose from {', '.join(VARIANTS)}")
    args.server_flags = args.server_flags or [""]
    if "http" in args.variants:  # one http variant per server
        at = args.variants.index("http")
        args.variants[at : at + 1] = [http_name(flags, i) for i, flags in enumerate(args.server_flags)]
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if "graphs" in args.variants and not args.device.startswith("cuda"):
        parser.error("the graphs variant needs a CUDA device")
    if any(p not in PATTERNS for p in args.patterns):
        parser.error(f"--patterns takes {', '.join(PATTERNS)}")
    return args


def http_name(flags: str, index: int) -> str:
    """`http` for the first server, `http[FLAGS]` for each other (its flags set it apart)."""
    return "http" if index == 0 else f"http[{flags}]"


def sweep_cases(args) -> list[dict]:
    """One factor at a time around the centre: every context at the centre k, every k at the centre
    context, every concurrency at both centres."""
    ctx = 1024 if 1024 in args.contexts else args.contexts[len(args.contexts) // 2]
    k = 8 if 8 in args.draft_lengths else args.draft_lengths[-1]
    points = [(c, k, 1) for c in args.contexts] + [(ctx, d, 1) for d in args.draft_lengths]
    points += [(ctx, k, n) for n in args.concurrency]
    keys = dict.fromkeys(points)
    return [
        dict(pattern=p, context_len=c, num_draft_tokens=d, concurrency=n)
        for p in args.patterns
        for c, d, n in keys
    ]


def applies(variant: str, case: dict) -> bool:
    if case["pattern"] == "shared" and case["concurrency"] == 1:
        return False  # one client has no one to share with: that is `cold`
    if variant.startswith("hf-"):  # baselines serve one request at a time; reuse only matters when growing
        return case["concurrency"] == 1 and (variant == "hf-generate" or case["pattern"] == "growing")
    return True


def open_variant(name: str, args, sizes: dict, checkpoint: str):
    """(a function running one case → latencies, what to record about the variant, a closer)."""
    vocab, calls = sizes["vocab_size"], args.calls
    if name in ENGINE_VARIANTS:
        compile_, graphs = ENGINE_VARIANTS[name]
        config = EngineConfig(
            device=args.device, dtype=args.dtype, max_seq_len=sizes["max_seq_len"],
            max_batch_size=max(args.concurrency),
            max_draft_tokens=max(args.draft_lengths), compile=compile_, cuda_graphs=graphs,
            attention=args.attention,
            batch_buckets=tuple(args.concurrency),
        )  # fmt: skip
        gc.collect()
        before = machine.resident_bytes()
        engine = Engine.load(args.model, config)  # its weights, and its KV pool reserved (not yet touched)
        loaded = machine.resident_bytes()
        engine.warmup()
        if before is not None and loaded is not None:
            print(f"{name}: resident memory {before / 1e6:.0f} MB before load, {loaded / 1e6:.0f} MB after "
                  f"(+{(loaded - before) / 1e6:.0f} MB)", file=sys.stderr)  # fmt: skip
        run = lambda case, repeat: runners.run_lockstep(  # noqa: E731
            runners.engine_round(engine, f"{name}-r{repeat}"),
            conversations(case, vocab, args.seed + repeat),
            case["num_draft_tokens"],
            calls,
        )
        return run, engine.lifecycle.snapshot(), lambda: None
    if name.startswith("http"):
        server, flags = None, next(f for i, f in enumerate(args.server_flags) if http_name(f, i) == name)
        if args.url and flags:
            raise SystemExit("--server-flags are for spawned servers, not --url")
        if not args.url:
            # As many torch threads as the in-process variants, so http minus eager is the HTTP path's cost
            # (the server's own default leaves one core to HTTP; on a 2-core machine that halves compute).
            threads = [f"--num-threads={torch.get_num_threads()}"] if args.device == "cpu" else []
            server = ServerProcess([*threads,
                f"--model={args.model}", f"--device={args.device}", f"--dtype={args.dtype}",
                f"--max-seq-len={sizes['max_seq_len']}", f"--max-batch-size={max(args.concurrency)}",
                f"--attention={args.attention}", f"--max-draft-tokens={max(args.draft_lengths)}",
                f"--max-queue={4 * max(args.concurrency)}", "--request-timeout-s=120",
                *flags.split(),
            ], timeout_s=900).__enter__()  # fmt: skip
        url = args.url or server.url
        headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        run = lambda case, repeat: runners.run_http(  # noqa: E731
            url,
            conversations(case, vocab, args.seed + repeat),
            case["num_draft_tokens"],
            calls,
            headers,
            f"{name}-r{repeat}",
        )
        info = {"url": url, "spawned": server is not None, "server_flags": flags}
        return run, info, server.close if server else lambda: None
    model = baselines.load_hf_model(checkpoint, DTYPES[args.dtype], args.device)
    kind = baselines.HFGenerate if name == "hf-generate" else baselines.HFReuse

    def run(case, repeat):
        drafters = [kind(model) for _ in range(case["concurrency"])]
        convs = conversations(case, vocab, args.seed + repeat)
        return runners.run_lockstep(
            runners.sequential_round(drafters), convs, case["num_draft_tokens"], calls
        )

    return run, {"checkpoint": "same weights as the engine"}, lambda: None


@exits_2_on_refusal
def main(argv=None) -> int:
    args = parse_args(argv)
    cases = sweep_cases(args)
    loaded = load_model(args.model, DTYPES[args.dtype], args.device)
    weights = machine.served_weight_bytes(loaded, DTYPES[args.dtype], args.device)
    kv_per_position = machine.kv_bytes_per_position(loaded.config, DTYPES[args.dtype].itemsize)
    sizes = {
        "vocab_size": loaded.config.vocab_size,
        "max_seq_len": max(
            longest_context(c["context_len"], c["num_draft_tokens"], args.calls) for c in cases
        ),
    }
    del loaded
    measured = args.bandwidth_gbs is None
    bandwidth = machine.measure_bandwidth(args.device) if measured else args.bandwidth_gbs * 1e9
    # One run: each variant's cases together, each variant open only while it runs (GPU memory holds one
    # engine at a time). Repeats: the variants take turns case by case, so all are open at once.
    if args.repeats == 1:
        work = [(v, c) for v in args.variants for c in cases if applies(v, c)]
    else:
        work = [(v, c) for c in cases for v in args.variants if applies(v, c)]
    schedule = [(repeat, i) for repeat in range(args.repeats) for i in range(len(work))]
    last_use = {work[i][0]: n for n, (_, i) in enumerate(schedule)}
    latencies = {i: [] for i in range(len(work))}
    variants, opened = {}, {}  # variant -> (run, close) while open
    with tempfile.TemporaryDirectory(prefix="drafter-bench-") as scratch:
        checkpoint = write_preset(args.model, scratch) if is_preset(args.model) else args.model
        try:
            with tqdm(total=len(schedule), desc="latency", unit="case", file=sys.stderr) as progress:
                for n, (repeat, i) in enumerate(schedule):
                    variant, case = work[i]
                    if variant not in opened:
                        run, variants[variant], close = open_variant(variant, args, sizes, str(checkpoint))
                        opened[variant] = (run, close)
                        del run, close  # the only references left are in `opened`, so closing frees them
                    progress.set_postfix_str(f"{variant} {case['pattern']} ctx={case['context_len']}")
                    latencies[i] += opened[variant][0](case, repeat)
                    progress.update()
                    if n == last_use[variant]:
                        opened.pop(variant)[1]()
                        gc.collect()
                        if args.device.startswith("cuda"):
                            torch.cuda.empty_cache()
        finally:
            for _, close in opened.values():
                close()
    rows = []
    for i, (variant, case) in enumerate(work):
        floor = machine.floor_ms(
            weights, kv_per_position, bandwidth, case["context_len"], case["num_draft_tokens"],
            case["concurrency"],
        )  # fmt: skip
        step = machine.step_bytes(
            weights, kv_per_position, case["context_len"], case["num_draft_tokens"], case["concurrency"]
        )
        rows.append(
            report.summarize({"variant": variant, **case, "step_mb": step / 1e6}, latencies[i], floor)
        )
    report.add_ratios(rows)
    print(report.table(rows))
    print(f"\nfloor: {weights / 1e6:.1f} MB of weights + {kv_per_position} B of KV per position per step, "
          f"at {bandwidth / 1e9:.1f} GB/s ({'measured' if measured else 'given'})")  # fmt: skip
    config = {
        **{k: v for k, v in vars(args).items() if k not in ("api_key", "json", "plot")},
        "max_seq_len": sizes["max_seq_len"], "weight_bytes": weights, "kv_bytes_per_position": kv_per_position,
        "bandwidth_bytes_per_s": bandwidth, "bandwidth_measured": measured, "variants": variants,
    }  # fmt: skip
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"machine": machine.describe(args.device), "config": config, "results": rows}, indent=1
            )
        )
    if args.plot:
        report.plot(rows, args.plot, f"{args.model} on {args.device} ({args.dtype})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
