"""The device check's stages, each run in a process of its own by bench/device/check.py:

    python -m bench.device.stages SPEC.json

SPEC names the stage (`export`, `engine`), its parameters and the file its result goes to. An `engine`
stage measures one checkpoint on one path, in-process or over HTTP, and rewrites its result file after
every case, so a stage the check stops at its deadline still leaves every row it measured. Each row names
the fallbacks its engine took and the graphs it captured, so a figure from a path that silently served
eager is never mistaken for the production path. A process per stage also gives each engine its own peak
memory and leaves no state behind for the next.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import torch

from bench.harness import call_cost, machine, report, runners
from bench.harness.server import ServerProcess
from bench.harness.workload import conversations
from drafter.scheduling.batcher import CONTENTION_COOL_DOWN_S
from engine.config import EngineConfig
from engine.engine import DTYPES, Engine
from engine.model.loader import load_model
from engine.requests import DraftRequest

OVERHEAD_CONTEXTS = (128, 2048)  # bench/overhead.py's, within the server's context
OVERHEAD_FIELDS = ("context_len", "health_ms", "excess_ms", "engine_ms", "wall_ms")


class Result:
    """A stage's result file, rewritten whole after every change (a killed stage leaves a valid one)."""

    def __init__(self, path: str):
        self.path, self.data = Path(path), {"rows": [], "facts": {}}

    def save(self) -> None:
        partial = self.path.with_suffix(".partial")
        partial.write_text(json.dumps(self.data, indent=1, default=str))
        partial.replace(self.path)


def export_stage(spec: dict, result: Result) -> None:
    from export.__main__ import run_export

    started = time.perf_counter()
    # From the preset's name, not a written copy: the export then records that its weights are random.
    exported = run_export(spec["model"], Path(spec["checkpoint"]), spec["mode"], force=True)
    result.data["facts"] = {
        "seconds": time.perf_counter() - started,
        "report": {k: v for k, v in exported.items() if not isinstance(v, dict | list)},
    }


def case_name(case: dict) -> str:
    return f"ctx={case['context_len']} k={case['num_draft_tokens']} c={case['concurrency']}"


def floor_of(spec: dict):
    """case -> the bandwidth floor of its answer (the drafts asked for), and the vocabulary size, read from
    the checkpoint loaded as is on the CPU (an engine's CPU linears are packed, not countable)."""
    loaded = load_model(spec["checkpoint"], DTYPES[spec["engine"]["dtype"]], "cpu")
    weights = machine.weight_bytes(loaded.model)
    kv = machine.kv_bytes_per_position(loaded.config, DTYPES[spec["engine"]["dtype"]].itemsize)

    def floor(case):
        k, context, batch = case["num_draft_tokens"], case["context_len"], case["concurrency"]
        return machine.floor_ms(weights, kv, spec["bandwidth"], context, k, batch)

    return floor, loaded.config.vocab_size


def kernels_per_replay(engine: Engine) -> float | None:
    """CUDA kernels one replay of the largest-tier, batch-1 graph launches, per step."""
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


def in_process(spec: dict, result: Result, device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    floor, vocab = floor_of(spec)
    engine = Engine.load(spec["checkpoint"], EngineConfig(**spec["engine"]))
    snapshot = engine.warmup()
    facts = result.data["facts"]
    facts |= {
        "stage_seconds": snapshot["stage_seconds"],
        "fallbacks": snapshot["fallbacks"],
        "captured": snapshot.get("captured"),
        "kernels_per_step": kernels_per_replay(engine),
    }
    result.save()  # warmup's facts survive even if no case finishes
    tags = {
        "fallbacks": snapshot["fallbacks"],
        "num_graphs": (snapshot.get("captured") or {}).get("num_graphs", 0),
    }
    for case in spec["cases"]:
        step_ms: list[float] = []
        convs = conversations(case, vocab, seed=0)
        keep = lambda results, step_ms=step_ms: step_ms.append(results[0].decode_ms / results[0].num_steps)  # noqa: E731
        draft_round = runners.engine_round(engine, spec["attention"], on_results=keep)
        latencies = runners.run_lockstep(draft_round, convs, case["num_draft_tokens"], spec["calls"])
        row = report.summarize({"variant": spec["label"], **case}, latencies, floor(case))
        result.data["rows"].append(row | tags | {"ms_per_step": float(np.median(step_ms[1:] or step_ms))})
        facts["recompiles_after_warmup"] = engine.recompiles.count
        if device.startswith("cuda"):
            facts["peak_memory_bytes"] = torch.cuda.max_memory_allocated()
        result.save()
        print(f"  {spec['label']} {case_name(case)}: p50 {row['p50_ms']:.2f} ms", flush=True)


def ahead_loop(spec: dict, result: Result, device: str) -> None:
    """Drafting ahead's decode loop (engine/ahead.py): one session's B branches drafted together, against a
    batch-1 draft of the same k on the same engine, for each B: what B predicted outcomes cost over one."""
    engine = Engine.load(spec["checkpoint"], EngineConfig(**spec["engine"]))
    snapshot = engine.warmup()
    facts = result.data["facts"]
    facts |= {"stage_seconds": snapshot["stage_seconds"], "fallbacks": snapshot["fallbacks"]}
    facts |= {"captured": snapshot.get("captured"), "ahead_loop": []}
    vocab = engine.loaded.config.vocab_size
    k, calls = spec["num_draft_tokens"], spec["calls"]
    context = np.random.default_rng(0).integers(0, vocab, spec["context_len"]).tolist()

    def timed(fn) -> float:
        started = time.perf_counter()
        fn()
        engine.sync()
        return (time.perf_counter() - started) * 1e3

    first = engine.draft_batch([DraftRequest(context, k, "s", choices=True)])[0]
    outcomes = [  # (a, b): every accepted count, each choice there
        context + first.tokens[:a] + [token] for rank in range(4) for a in range(k + 1)
        for token, _ in first.choices[a][rank : rank + 1]
    ]  # fmt: skip
    one = [DraftRequest(context, k, "s", choices=True)]  # the same steps as a branch's loop
    single = [timed(lambda: engine.draft_batch(one)) for _ in range(calls)]
    for count in spec["branches"]:
        requests = [DraftRequest(c, k, choices=True) for c in outcomes[:count]]
        if engine.draft_ahead("s", requests) is None:  # also this batch size's first, unmeasured run
            raise RuntimeError(f"{count} branches did not fit the KV cache")
        loops = [timed(lambda requests=requests: engine.draft_ahead("s", requests)) for _ in range(calls)]
        row = {
            "branches": count,
            "p50_ms": float(np.median(loops)),
            "batch1_p50_ms": float(np.median(single)),
        }
        row["ratio"] = row["p50_ms"] / row["batch1_p50_ms"]
        facts["ahead_loop"].append(row)
        facts["recompiles_after_warmup"] = engine.recompiles.count
        result.save()
        print(f"  ahead loop B={count}: p50 {row['p50_ms']:.2f} ms ({row['ratio']:.2f}x batch 1)", flush=True)


def over_http(spec: dict, result: Result, device: str) -> None:
    floor, vocab = floor_of(spec)
    cfg = spec["engine"]
    flags = [f"--model={spec['checkpoint']}", f"--device={device}", f"--dtype={cfg['dtype']}"]
    flags += [f"--attention={cfg['attention']}", f"--max-seq-len={cfg['max_seq_len']}"]
    flags += [f"--max-batch-size={cfg['max_batch_size']}", f"--max-draft-tokens={cfg['max_draft_tokens']}"]
    flags += [f"--kv-cache-gb={cfg['kv_cache_gb']}", "--request-timeout-s=120", "--max-queue=64"]
    flags += [] if cfg["compile"] else ["--no-compile"]
    flags += [] if cfg["cuda_graphs"] else ["--no-cuda-graphs"]
    facts = result.data["facts"]
    with ServerProcess(flags, timeout_s=spec["timeout_s"]) as server:
        lifecycle = httpx.get(f"{server.url}/info").json()["lifecycle"]
        facts |= {k: lifecycle.get(k) for k in ("stage_seconds", "fallbacks", "captured")}
        result.save()
        tags = {
            "fallbacks": lifecycle["fallbacks"],
            "num_graphs": (lifecycle["captured"] or {}).get("num_graphs", 0),
        }
        for case in spec["cases"]:
            convs = conversations(case, vocab, seed=0)
            latencies = runners.run_http(server.url, convs, case["num_draft_tokens"], spec["calls"], {}, "h")
            row = report.summarize({"variant": spec["label"], **case}, latencies, floor(case))
            result.data["rows"].append(row | tags)
            result.save()
            print(f"  {spec['label']} {case_name(case)}: p50 {row['p50_ms']:.2f} ms", flush=True)
        found = re.search(r"^drafter_recompiles_total (\S+)$", httpx.get(f"{server.url}/metrics").text, re.M)
        facts["recompiles_after_warmup"] = float(found[1]) if found else None
        # What a call costs beyond the engine and a health round trip, from a lone client (so a short draft
        # runs on the event loop: the path drafter/scheduling/inline.py is for), k = 1 on a cached context.
        time.sleep(CONTENTION_COOL_DOWN_S)  # after the 4-client cases, the loop drafts again only then
        costs = []
        for length in sorted({min(n, cfg["max_seq_len"] - 2) for n in OVERHEAD_CONTEXTS}):
            costs += call_cost.measure(
                [server.url], call_cost.context_tokens(length), 1, 10 * spec["calls"], 1, False
            )
        facts["overhead"] = [{k: row[k] for k in OVERHEAD_FIELDS} for row in costs]
        metrics = httpx.get(f"{server.url}/metrics").text
    inline = re.search(r"^drafter_inline_batches_total (\S+)$", metrics, re.MULTILINE)
    facts["inline_batches"] = float(inline[1]) if inline else None
    result.save()


def main(argv=None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    spec = json.loads(Path((argv or sys.argv[1:])[0]).read_text())
    result = Result(spec["result"])
    result.save()
    if spec.get("fail"):  # the check's own test: a stage that raises must not sink the others
        raise RuntimeError(f"stage {spec['name']} asked to fail (--fail-stage)")
    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    device = spec["engine"]["device"] if "engine" in spec else "cpu"
    if spec["kind"] == "export":
        export_stage(spec, result)
    elif spec["where"] == "in-process":
        in_process(spec, result, device)
    elif spec["where"] == "ahead":
        ahead_loop(spec, result, device)
    else:
        over_http(spec, result, device)
    result.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
