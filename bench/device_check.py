"""One command for a CUDA machine with no network: build, export, test and measure the drafter, in a budget.

    python bench/device_check.py --out DIR            # CUDA: the real-shape preset, 8-minute budget
    python bench/device_check.py --smoke --out DIR    # CPU: the tiny preset, seconds (CI runs it)

In order, each step only if the budget (`--budget-s`) still holds it, else recorded as skipped with why:
1. build the `qwen3-0.6b-random` preset (Qwen3-0.6B's shape, random weights) and export it to FP8 in both
   modes with `python -m export`'s code (no network: the preset is drawn from a seed); 2. run the `gpu` tests (`pytest -m gpu`); 3. for each FP8 mode
   (weight-only first), each attention path (`sdpa`, `flex`), in-process and then over HTTP (a spawned
   server): growing conversations at 2k, 8k and 32k context, k = 4 and 16, 1 and 4 clients, per-call
   p50/p90/p99, ms per decode step, the bandwidth floor; per engine its warmup and capture time, graph
   memory, kernels per graph replay (torch.profiler) and recompiles after warmup (must be 0); per server
   what a call costs beyond the engine and a health round trip (bench/overhead.py, one client, 128 and 2k).
Writes `device_check.json`, `device_check.md` and `device_check.png` into DIR and prints the table. The
cases are driven by bench/runners.py over bench/workload.py's conversations, as bench/latency.py's are.
"""

from __future__ import annotations

import argparse
import gc
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import torch

from bench import machine, overhead, report, runners
from bench.latency import conversations
from bench.server import REPO, ServerProcess
from bench.workload import longest_context
from drafter.batcher import CONTENTION_COOL_DOWN_S
from engine.config import EngineConfig
from engine.engine import DTYPES, Engine
from engine.loader import load_model
from engine.presets import PRESETS

PROFILES = {  # model, contexts, draft lengths, concurrency, measured calls per client and case
    "device": ("qwen3-0.6b-random", (2048, 8192, 32768), (4, 16), (1, 4), 20),
    "smoke": ("tiny", (96,), (4, 16), (1, 4), 2),
}
OVERHEAD_CONTEXTS = (128, 2048)  # bench/overhead.py's, within the server's context
OVERHEAD_FIELDS = ("context_len", "health_ms", "excess_ms", "engine_ms", "wall_ms")
MODES = ("weight-only", "dynamic")  # export modes, in the order they are measured
ATTENTION_PATHS = ("sdpa", "flex")


class Budget:
    """Wall-clock budget of the whole check; a step that would not fit is skipped and its reason kept."""

    def __init__(self, seconds: float):
        self.deadline = time.monotonic() + seconds
        self.skipped: list[str] = []

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def allows(self, what: str, needs_s: float) -> bool:
        if self.left() >= needs_s:
            return True
        self.skipped.append(f"{what}: needs ~{needs_s:.0f} s, {max(0.0, self.left()):.0f} s left")
        return False


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", required=True, help="directory for the JSON, Markdown table and plot")
    parser.add_argument("--smoke", action="store_true", help="tiny preset on CPU, seconds")
    parser.add_argument("--budget-s", type=float, default=480, help="wall-clock budget in seconds [480]")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    if args.smoke:
        # One thread: two spinning OpenMP threads on a busy 2-core CI machine make tiny matmuls 5-10x slower.
        args.device, args.measured_modes = "cpu", MODES[:1]
        torch.set_num_threads(1)
    elif not args.device.startswith("cuda"):
        parser.error("the device check needs CUDA; on a CPU run it with --smoke")
    else:
        args.measured_modes = MODES
    args.model, args.contexts, args.draft_lengths, args.concurrency, args.calls = PROFILES[
        "smoke" if args.smoke else "device"
    ]
    args.dtype = "float32" if args.smoke else "bfloat16"
    args.max_seq_len = longest_context(max(args.contexts), max(args.draft_lengths), args.calls)
    return args


def engine_config(args, attention: str) -> dict:
    """Sizes every engine of the check shares, in- and out-of-process: 4 longest conversations fit the pool."""
    per_position = machine.kv_bytes_per_position(PRESETS[args.model], DTYPES[args.dtype].itemsize)
    kv_gb = 4 * 2 * (args.max_seq_len + 16) * per_position / 2**30
    return dict(
        device=args.device, dtype=args.dtype, max_seq_len=args.max_seq_len, attention=attention,
        max_batch_size=max(args.concurrency), batch_buckets=args.concurrency,
        max_draft_tokens=max(args.draft_lengths), kv_cache_gb=round(kv_gb + 0.001, 3),
        compile=not args.smoke, cuda_graphs=not args.smoke,
    )  # fmt: skip


def build_and_export(args, out: Path, budget: Budget) -> dict:
    from export.__main__ import run_export

    steps = {"checkpoints": {}}
    for mode in MODES:
        if not budget.allows(f"export {mode}", steps.get("export_seconds", 60)):
            continue
        started = time.perf_counter()
        destination = out / "checkpoints" / f"fp8-{mode}"
        # From the preset's name, not a written copy: the export then records that its weights are random.
        exported = run_export(args.model, destination, mode, force=True)
        steps["checkpoints"][mode] = str(destination)
        steps["export_seconds"] = time.perf_counter() - started  # the preset is built inside each export
        steps[f"export_{mode}_report"] = {k: v for k, v in exported.items() if not isinstance(v, dict | list)}
    return steps


def run_gpu_tests(args, budget: Budget) -> dict:
    if args.smoke or not torch.cuda.is_available():
        return {"skipped": "no CUDA device (smoke run)"}
    if not budget.allows("gpu tests", 60):
        return {"skipped": "budget"}
    started = time.perf_counter()
    command = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "tests"]
    try:
        done = subprocess.run(
            command, cwd=REPO, capture_output=True, text=True, timeout=max(60, budget.left() / 3)
        )
        outcome = {"returncode": done.returncode, "tail": done.stdout[-3000:] + done.stderr[-1000:]}
    except subprocess.TimeoutExpired:
        outcome = {"returncode": None, "tail": "timed out (a third of the budget left)"}
    return outcome | {"seconds": time.perf_counter() - started}


def kernels_per_replay(engine: Engine) -> float | None:
    """CUDA kernels one replay of the largest-tier, batch-1, shortest-span graph launches, per step."""
    if engine.graphs is None:
        return None
    from torch.profiler import DeviceType, ProfilerActivity, profile

    steps, span = engine.decode_steps(engine.config.max_draft_tokens), engine.spans[0]
    engine.reset_buffers(engine.buffers[1])
    with profile(activities=[ProfilerActivity.CUDA]) as profiler:
        engine.graphs.replay(1, span, steps)
        torch.cuda.synchronize()
    kernels = [e for e in profiler.events() if e.device_type == DeviceType.CUDA]
    return len(kernels) / steps


def cases(args) -> list[dict]:
    return [
        dict(pattern="growing", context_len=c, num_draft_tokens=k, concurrency=n)
        for c in args.contexts
        for k in args.draft_lengths
        for n in args.concurrency
    ]


def measure(args, label: str, run, budget: Budget, floors, case_s: list[float]) -> list[dict]:
    rows = []
    for case in cases(args):
        name = f"{label} ctx={case['context_len']} k={case['num_draft_tokens']} c={case['concurrency']}"
        if not budget.allows(name, 1.5 * max(case_s[-1:], default=1.0)):
            continue
        started = time.perf_counter()
        latencies, extra = run(case)
        rows.append(report.summarize({"variant": label, **case}, latencies, floors(case)) | extra)
        case_s.append(time.perf_counter() - started)
    return rows


def in_process(args, checkpoint: str, attention: str, budget, floors, case_s) -> tuple[list, dict]:
    engine = Engine.load(checkpoint, EngineConfig(**engine_config(args, attention)))
    snapshot = engine.warmup()

    def run(case):
        step_ms: list[float] = []
        convs = conversations(case, engine.loaded.config.vocab_size, seed=0)
        steps = engine.decode_steps(case["num_draft_tokens"])
        keep = lambda results: step_ms.append(results[0].decode_ms / steps)  # noqa: E731
        draft_round = runners.engine_round(engine, attention, on_results=keep)
        latencies = runners.run_lockstep(draft_round, convs, case["num_draft_tokens"], args.calls)
        return latencies, {"ms_per_step": float(np.median(step_ms[1:] or step_ms))}

    label = f"{Path(checkpoint).name} {attention} in-process"
    rows = measure(args, label, run, budget, floors, case_s)
    facts = {
        "stage_seconds": snapshot["stage_seconds"],
        "fallbacks": snapshot["fallbacks"],
        "captured": snapshot.get("captured"),
        "kernels_per_step": kernels_per_replay(engine),
        "recompiles_after_warmup": engine.recompiles.count,
        "peak_memory_bytes": torch.cuda.max_memory_allocated() if args.device.startswith("cuda") else None,
    }
    return rows, facts


def over_http(args, checkpoint: str, attention: str, budget, floors, case_s) -> tuple[list, dict]:
    cfg = engine_config(args, attention)
    flags = [f"--model={checkpoint}", f"--device={args.device}", f"--dtype={args.dtype}"]
    flags += [f"--attention={attention}", f"--max-seq-len={cfg['max_seq_len']}"]
    flags += [f"--max-batch-size={cfg['max_batch_size']}", f"--max-draft-tokens={cfg['max_draft_tokens']}"]
    flags += [f"--kv-cache-gb={cfg['kv_cache_gb']}", "--request-timeout-s=120", "--max-queue=64"]
    with ServerProcess(flags, timeout_s=max(30, budget.left())) as server:
        vocab = PRESETS[args.model].vocab_size

        def run(case):
            convs = conversations(case, vocab, seed=0)
            return runners.run_http(server.url, convs, case["num_draft_tokens"], args.calls, {}, "h"), {}

        rows = measure(args, f"{Path(checkpoint).name} {attention} http", run, budget, floors, case_s)
        found = re.search(r"^drafter_recompiles_total (\S+)$", httpx.get(f"{server.url}/metrics").text, re.M)
        # What a call costs beyond the engine and a health round trip, from a lone client (so a short draft
        # runs on the event loop: the path drafter/inline.py is for), k = 1 on a cached context.
        time.sleep(CONTENTION_COOL_DOWN_S)  # after the 4-client cases, the loop drafts again only then
        costs = []
        for length in sorted({min(n, cfg["max_seq_len"] - 2) for n in OVERHEAD_CONTEXTS}):
            tokens = overhead.context_tokens(length)
            costs += overhead.measure([server.url], tokens, 1, 10 * args.calls, 1, False)
        metrics = httpx.get(f"{server.url}/metrics").text
    inline = re.search(r"^drafter_inline_batches_total (\S+)$", metrics, re.MULTILINE)
    facts = {
        "recompiles_after_warmup": float(found[1]) if found else None,
        "overhead": [{k: row[k] for k in OVERHEAD_FIELDS} for row in costs],
        "inline_batches": float(inline[1]) if inline else None,
    }
    return rows, facts


COLUMNS = [("variant", "{}"), ("context_len", "{}"), ("num_draft_tokens", "{}"), ("concurrency", "{}"),
           ("p50_ms", "{:.2f}"), ("p90_ms", "{:.2f}"), ("p99_ms", "{:.2f}"), ("ms_per_step", "{:.3f}"),
           ("floor_ms", "{:.3f}"), ("floor_fraction", "{:.1%}")]  # fmt: skip


def markdown(rows: list[dict], engines: dict, skipped: list[str]) -> str:
    names = [report.HEADERS.get(name, name) for name, _ in COLUMNS]
    lines = ["| " + " | ".join(names) + " |", "|" + "---|" * len(names)]
    for row in rows:
        lines.append("| " + " | ".join(f.format(row[n]) if n in row else "" for n, f in COLUMNS) + " |")
    lines += ["", "| engine | warmup s | capture s | graph MB | kernels/step | recompiles |", "|---|---|---|---|---|---|"]  # fmt: skip
    for name, facts in engines.items():
        captured = facts.get("captured") or {}
        memory = captured.get("memory_bytes")
        cells = [name, f"{sum((facts.get('stage_seconds') or {}).values()):.1f}",
                 f"{captured['capture_seconds']:.1f}" if captured else "", f"{memory / 1e6:.0f}" if memory else "",
                 f"{facts['kernels_per_step']:.0f}" if facts.get("kernels_per_step") else "",
                 str(facts.get("recompiles_after_warmup"))]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "| engine | context | health RTT ms | excess ms | engine ms | draft wall ms | inline batches |",
              "|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, facts in engines.items():
        for row in facts.get("overhead", []):
            cells = [name, str(row["context_len"]), *(f"{row[k]:.3f}" for k in OVERHEAD_FIELDS[1:])]
            lines.append("| " + " | ".join([*cells, str(facts["inline_batches"])]) + " |")
    lines += [f"\nskipped: {why}" for why in skipped]
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    budget, out = Budget(args.budget_s), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"machine": machine.describe(args.device), "args": {k: v for k, v in vars(args).items()}}
    result["build"] = build_and_export(args, out, budget)
    result["gpu_tests"] = run_gpu_tests(args, budget)
    bandwidth = machine.measure_bandwidth(args.device)
    rows, engines, case_s = [], {}, []
    for mode, checkpoint in result["build"]["checkpoints"].items():
        if mode not in args.measured_modes:  # the smoke run exports both modes and measures one
            continue
        loaded = load_model(checkpoint, DTYPES[args.dtype], args.device)
        weights = machine.weight_bytes(loaded.model)
        kv = machine.kv_bytes_per_position(loaded.config, DTYPES[args.dtype].itemsize)
        del loaded

        def floors(case, weights=weights, kv=kv):
            steps = case["num_draft_tokens"]  # the drafts asked for: the physical floor of the answer
            return machine.floor_ms(weights, kv, bandwidth, case["context_len"], steps, case["concurrency"])

        for where, run in (("in-process", in_process), ("http", over_http)):
            for attention in ATTENTION_PATHS:
                name = f"fp8-{mode} {attention} {where}"
                if not budget.allows(name, 3 * max(case_s[-1:], default=5.0)):
                    continue
                measured, engines[name] = run(args, checkpoint, attention, budget, floors, case_s)
                rows += measured
                gc.collect()
                if args.device.startswith("cuda"):
                    torch.cuda.empty_cache()
    result |= {"bandwidth_bytes_per_s": bandwidth, "results": rows, "engines": engines}
    result["skipped"] = budget.skipped
    table = markdown(rows, engines, budget.skipped)
    (out / "device_check.json").write_text(json.dumps(result, indent=1, default=str))
    (out / "device_check.md").write_text(table + "\n")
    if rows:
        report.plot(
            rows, str(out / "device_check.png"), f"{args.model} on {result['machine']['device_name']}"
        )
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
