"""The peer table: what a vLLM user compares before adopting drafter. Per workload and concurrency, vLLM CPU
engines (bench/vllm_target/target.py, from the vLLM venv) speculate each way (bench/vllm_target/peer_modes.py):

- `alone`: no speculation;
- `drafter-fp8`, `drafter-bf16`: drafter as vLLM's proposer, the server drafting from the model at vLLM's k,
  serving the pair's drafter as its FP8 (weight-only) export or unquantized (served in float32 on the CPU);
- `drafter-fp8-hybrid`: the same with `--draft-source hybrid` (the suffix index's draft when it beats the
  model's); `drafter-fp8-auto`: model drafts, the proposer asking for `"auto"`, the server told the target's
  costs as vLLM alone measured them at that concurrency: its step (seconds / decode steps of alone's run) and,
  given two concurrencies or more, what each more token in a step adds (the slope of alone's step time from
  the fewest rows to the most), so alone runs first;
- `draft_model`: vLLM's in-process `draft_model` with the same drafter, unquantized;
- `ngram`: vLLM's prompt lookup (2-5 grams).

On the testbed pair (bench/testbed/, the default) or the real pair (`--realpair [DIR]`: Qwen2.5-Coder-1.5B-
Instruct verifying drafts of Qwen2.5-Coder-0.5B-Instruct, bench/realpair/'s prompts under the target's chat
template, a row ending at `<|im_end|>` or --max-tokens); bench/vllm_target/peer_pairs.py has each pair's
defaults. At concurrency N a workload's first N prompts go to one `generate`, greedy, so N requests are in
flight (fewer as rows end). One engine serves every concurrency (max_num_seqs the largest): starting one
costs minutes. Before measuring, every prompt the table runs goes through the engine for a few tokens, and
again after each server start, so the prompts' prefill is cached (in vLLM and in a drafter server) for every
mode and concurrency alike: the figures are decoding's. The best of --repeats runs is kept. The target runs in
float32 by default: in bfloat16 vLLM's greedy outputs depend on the batch's shape (the real pair's outputs
at 1 and 4 rows part within 48 tokens on half the prompts), so a verify pass of k + 1 tokens would part
from alone's without any fault of the drafts. Reported: target tokens/s, the ratio to alone at the same concurrency, accepted tokens per step (vLLM's
mean acceptance length, 1 + accepted / drafts over the steps that had drafts), the share of the run vLLM spent
waiting in drafter's `propose`, a projected GPU speedup (bench/vllm_target/peer_table.py: these acceptance
figures at H100 costs for the pair's shapes), and whether the outputs equal alone's token for token.

    .venv/bin/python -m bench.vllm_target.peers --out out/vllm-peers                          # testbed
    .venv/bin/python -m bench.vllm_target.peers --realpair --out out/vllm-peers-realpair      # real pair
    .venv/bin/python -m bench.vllm_target.peers --realpair --quick --out out/vllm-peers-quick
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.harness.prompts import BenchError
from bench.harness.server import ServerProcess, free_port
from bench.realpair.benchmark import DEFAULT_DIR
from bench.vllm_target.driver import VllmTarget, vllm_available, vllm_python
from bench.vllm_target.peer_modes import MODES, SERVER_ARGS, Mode, TargetCosts, server_args
from bench.vllm_target.peer_pairs import PeerPair, realpair, testbed
from bench.vllm_target.peer_table import run_row, table

WARMUP_TOKENS = 8
SERVER_START_S = 300  # loading and warming the real drafter on a busy 2-core machine


def engine_options(mode: Mode, pair: PeerPair, args, port: int, stats: Path) -> dict:
    options = dict(k=args.k, max_num_seqs=max(args.concurrency), max_model_len=2048, dtype=args.dtype)
    if args.kv_cache_gb:
        options["kv_cache_gb"] = args.kv_cache_gb
    if pair.defaults.max_num_batched_tokens:
        options["max_num_batched_tokens"] = pair.defaults.max_num_batched_tokens
    if pair.defaults.enforce_eager:
        options["enforce_eager"] = True
    if mode.speculation == "drafter":
        options |= {"drafter_url": f"http://127.0.0.1:{port}", "stats_path": stats,
                    "drafter_timeout_s": args.drafter_timeout_s}  # fmt: skip
        return options | {"num_draft_tokens": "auto"} if mode.auto else options
    if mode.speculation == "draft_model":
        return options | {"draft_model": pair.directory / "drafter"}
    return options


def measure_engine(modes: list[Mode], pair: PeerPair, args, prompts: dict, costs: dict) -> dict:
    """One engine for modes set up alike (peer_modes.Mode.engine_key) and, for drafter's modes, one server
    at a time behind its proposer, on one port: {mode: {concurrency: {workload: row}}}, or {mode: {"error"}}
    for a mode that failed (a method vLLM's CPU build refuses: reported, not fatal)."""
    port, stats = free_port(), Path(tempfile.mkdtemp(prefix="vllm-peers-")) / "stats.json"
    results = {}
    try:
        with VllmTarget(
            pair.target, modes[0].speculation, **engine_options(modes[0], pair, args, port, stats)
        ) as vllm:
            print(f"{modes[0].speculation} engine up in {vllm.ready['startup_s']:.0f} s", file=sys.stderr)
            for mode in modes:
                try:
                    results[mode.name] = measure_mode(mode, vllm, pair, args, prompts, costs, port)
                except (RuntimeError, TimeoutError, ValueError) as error:
                    results[mode.name] = failure(error)
    except RuntimeError as error:
        results |= {mode.name: failure(error) for mode in modes if mode.name not in results}
    return results


def measure_mode(mode: Mode, vllm: VllmTarget, pair: PeerPair, args, prompts: dict, costs: dict, port: int):
    """Every (concurrency, workload) of one mode, after a warmup; a drafter mode's server restarts when its
    flags change (auto's costs differ by concurrency), and the warmup runs again."""
    rows, server, flags = {}, None, None
    if mode.speculation != "drafter":
        warm_up(vllm, prompts, args, pair)
    try:
        for concurrency in args.concurrency:
            if mode.speculation == "drafter":
                wanted = server_args(mode, args.k, costs.get(concurrency))
                if wanted != flags:
                    if server is not None:
                        server.close()
                    server, flags = start_server(mode, pair, port, wanted), wanted
                    warm_up(vllm, prompts, args, pair)  # the proposer (re)connects, off the clock
            print(f"{mode.name}: {concurrency} in flight", file=sys.stderr)
            rows[concurrency] = {}
            for workload, batch in prompts.items():
                rows[concurrency][workload] = row = best_run(vllm, batch[:concurrency], args, pair)
                if row["proposer_skipped"]:  # steps that went without drafter's drafts: say so at once
                    print(f"  {workload}: calls skipped {row['proposer_skipped']}", file=sys.stderr)
                if mode.auto:  # what "auto" had learned by the end of this workload's run
                    row["auto_policy"] = server_policy(server)
    finally:
        if server is not None:
            server.close()
    return rows


def start_server(mode: Mode, pair: PeerPair, port: int, flags: list[str]) -> ServerProcess:
    args = [f"--model={pair.directory / mode.served}", *SERVER_ARGS, *pair.defaults.server_args]
    args += [f"--port={port}", *flags]
    server = ServerProcess(args, timeout_s=SERVER_START_S)
    try:
        server.wait_ready()
    except BaseException:
        server.close()
        raise
    return server


def server_policy(server: ServerProcess) -> dict:
    """The server's draft-length policy as /info shows it: the target's costs it learned, its own."""
    return httpx.get(f"{server.url}/info", timeout=30).json()["draft_length_policy"]


def warm_up(vllm: VllmTarget, prompts: dict, args, pair: PeerPair) -> None:
    """Every prompt the table will run, a few tokens each: first-call costs and the prompts' prefill stay out
    of the figures (vLLM's prefix cache, and a drafter server's, then hold them), the same for every mode
    and concurrency, whichever ran before on the engine; and a proposer (re)connects to its server."""
    batch = [prompt for workload in prompts.values() for prompt in workload]
    vllm.generate(batch, WARMUP_TOKENS, list(pair.stop_token_ids))


def best_run(vllm: VllmTarget, batch: list[list[int]], args, pair: PeerPair) -> dict:
    runs = [vllm.generate(batch, args.max_tokens, list(pair.stop_token_ids)) for _ in range(args.repeats)]
    return run_row(min(runs, key=lambda run: run["seconds"]))


def failure(error: Exception) -> dict:
    return {"error": str(error).splitlines()[0] + " " + last_error_line(str(error))}


def last_error_line(log: str) -> str:
    lines = [line for line in log.splitlines() if "Error" in line]
    return lines[-1].strip()[-300:] if lines else ""


def target_costs(alone: dict) -> dict[int, TargetCosts]:
    """vLLM alone's step at each concurrency (its runs' seconds over their decode steps, a step per token of
    the longest row), and what each more row's token adds to a step: the slope from the fewest rows to the
    most, the same for every concurrency; None with one concurrency."""
    step_ms = {}
    for concurrency, by_workload in alone.items():
        steps = sum(max(map(len, row["outputs"])) for row in by_workload.values())
        step_ms[concurrency] = 1e3 * sum(row["seconds"] for row in by_workload.values()) / steps
    fewest, most = min(step_ms), max(step_ms)
    slope = max((step_ms[most] - step_ms[fewest]) / (most - fewest), 0.0) if most > fewest else None
    return {concurrency: TargetCosts(ms, slope) for concurrency, ms in step_ms.items()}


def engine_groups(modes: list[Mode]) -> list[list[Mode]]:
    """Modes by engine, in the order they were given (alone's first)."""
    groups: dict[tuple, list[Mode]] = {}
    for mode in modes:
        groups.setdefault(mode.engine_key, []).append(mode)
    return list(groups.values())


def measure(pair: PeerPair, args, prompts: dict) -> tuple[dict, dict]:
    """Every mode's results, in the order given, and the target costs told to "auto"."""
    results, costs = {}, {}
    for group in engine_groups([MODES[name] for name in args.modes]):
        results |= measure_engine(group, pair, args, prompts, costs)
        if group[0].name == "alone" and "error" not in results["alone"]:
            costs = target_costs(results["alone"])
    return {name: results[name] for name in args.modes}, costs


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--realpair",
        nargs="?",
        type=Path,
        const=DEFAULT_DIR,
        help="the real pair's directory, as `python -m bench.realpair fetch` leaves it [build/realpair]",
    )
    parser.add_argument("--quick", action="store_true", help="--realpair: fewer tokens and concurrencies")
    parser.add_argument("--workloads", help="comma-separated, of the pair's [all]")
    parser.add_argument("--modes", help=f"comma-separated, of {', '.join(MODES)} [the pair's]")
    parser.add_argument("--concurrency", help="comma-separated requests in flight, e.g. 1,4,8 [the pair's]")
    parser.add_argument("--k", type=int, help="num_speculative_tokens [testbed 8, real pair 4]")
    parser.add_argument(
        "--max-tokens", type=int, help="new tokens per prompt, at most [testbed 128, real pair 64]"
    )
    parser.add_argument(
        "--repeats", type=int, help="runs per cell; the fastest is reported [testbed 2, real pair 1]"
    )
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), help="the vLLM target's [float32]")
    parser.add_argument("--kv-cache-gb", type=float, help="vLLM's KV cache [testbed vLLM's, real pair 1]")
    parser.add_argument(
        "--drafter-timeout-s", type=float, help="the most a step waits for drafts [testbed 0.5, real pair 5]"
    )
    parser.add_argument("--out", type=Path, help="write report.json and report.md here")
    args = parser.parse_args(argv)
    if args.quick and not args.realpair:
        parser.error("--quick is --realpair's: give --realpair")
    if not vllm_available():
        parser.error(f"no vLLM venv at {vllm_python()}: run bash bench/vllm_target/install.sh")
    try:
        pair = realpair(args.realpair) if args.realpair else testbed()
    except BenchError as error:
        parser.error(str(error))
    fill_defaults(parser, args, pair)
    return args, pair


def fill_defaults(parser, args, pair: PeerPair) -> None:
    """The pair's defaults (its quick ones with --quick) where a flag was not given, then the lists checked."""
    defaults = pair.quick if args.quick else pair.defaults
    args.modes = args.modes.split(",") if args.modes else list(defaults.modes)
    args.workloads = args.workloads.split(",") if args.workloads else list(pair.workloads)
    try:
        args.concurrency = [int(n) for n in args.concurrency.split(",")] if args.concurrency else None
    except ValueError:
        parser.error(f"--concurrency takes comma-separated integers, got {args.concurrency!r}")
    args.concurrency = args.concurrency or list(defaults.concurrency)
    for name in ("k", "max_tokens", "repeats", "dtype", "kv_cache_gb", "drafter_timeout_s"):
        if getattr(args, name) is None:
            setattr(args, name, getattr(defaults, name))
    unknown = [w for w in args.workloads if w not in pair.workloads] + [
        m for m in args.modes if m not in MODES
    ]
    if unknown:
        parser.error(f"unknown workloads or modes: {unknown}")
    if any(n < 1 for n in args.concurrency) or args.k < 1 or args.max_tokens < 1 or args.repeats < 1:
        parser.error("--concurrency, --k, --max-tokens and --repeats must be positive")
    args.concurrency = sorted(set(args.concurrency))
    if "alone" in args.modes:
        args.modes.remove("alone")
    args.modes.insert(0, "alone")  # first: the baseline of every ratio, the lossless check and auto's costs


def main(argv=None) -> int:
    args, pair = parse_args(argv)
    started = time.monotonic()
    prompts = {name: pair.prompts(name)[: max(args.concurrency)] for name in args.workloads}
    if short := [name for name, batch in prompts.items() if len(batch) < max(args.concurrency)]:
        print(f"peers: error: fewer prompts than {max(args.concurrency)} in {short}", file=sys.stderr)
        return 2
    results, costs = measure(pair, args, prompts)
    markdown = table(results, args.workloads, args.concurrency, pair.gpu, pair.bf16_step_factor)
    print(markdown)
    seconds = time.monotonic() - started
    print(f"{seconds / 60:.1f} min", file=sys.stderr)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        machine = f"{platform.machine()} {platform.processor() or ''}".strip()
        report = {
            "args": {name: str(value) for name, value in vars(args).items()},
            "pair": {"name": pair.name, "directory": str(pair.directory), **pair.notes},
            "gpu_model": pair.gpu.as_dict(),
            "target_costs_told_to_auto": {n: c.as_dict() for n, c in costs.items()},
            "machine": machine,
            "results": results,
            "seconds": seconds,
        }
        (args.out / "report.json").write_text(json.dumps(report, indent=1))
        (args.out / "report.md").write_text(markdown + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
