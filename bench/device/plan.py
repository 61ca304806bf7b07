"""What the device check runs, in order: production path first, comparisons after (bench/device/check.py).

A stage's `min_s` is the time it needs to be worth starting, `max_s` the most it may take (the run's
budget caps it further). The minimums and maximums are estimates for Qwen3-0.6B's shape on one H200 with
a cold inductor cache; every stage records its real duration in the report, to correct them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from bench.harness import machine
from bench.harness.workload import longest_context
from engine.engine import DTYPES
from engine.model.presets import PRESETS

PROFILES = {  # model, contexts, draft lengths, concurrency, measured calls per client and case
    "device": ("qwen3-0.6b-random", (2048, 8192, 32768), (4, 16), (1, 4), 20),
    "smoke": ("tiny", (96,), (8,), (1, 4), 2),  # every kind of stage and case, not every size
}
AHEAD_BRANCHES = (1, 4, 8, 16, 24)  # the ahead loop's batch sizes (its buckets: each one captured)
FAST_GPU_TESTS = ["tests/test_gpu.py", "tests/test_gpu_fp8.py"]
REAL_SHAPE_GPU_TESTS = ["tests/test_gpu_real_shape.py"]


@dataclass(frozen=True)
class Stage:
    name: str
    kind: str  # "pytest" | "export" | "engine"
    spec: dict = field(default_factory=dict)
    min_s: float = 10.0
    max_s: float = 120.0

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", self.name)


def engine_config(
    model: str, smoke: bool, contexts, draft_lengths, concurrency, calls, attention: str
) -> dict:
    """Sizes every engine of the check shares, in- and out-of-process: 4 longest conversations fit the pool."""
    dtype = "float32" if smoke else "bfloat16"
    max_seq_len = longest_context(max(contexts), max(draft_lengths), calls)
    per_position = machine.kv_bytes_per_position(PRESETS[model], DTYPES[dtype].itemsize)
    kv_gb = 4 * 2 * (max_seq_len + 16) * per_position / 2**30
    return dict(
        device="cpu" if smoke else "cuda", dtype=dtype, max_seq_len=max_seq_len, attention=attention,
        max_batch_size=max(concurrency), batch_buckets=tuple(concurrency),
        max_draft_tokens=max(draft_lengths), kv_cache_gb=round(kv_gb + 0.001, 3),
        compile=not smoke, cuda_graphs=not smoke,
    )  # fmt: skip


def plan(args, work: Path, bandwidth: float) -> list[Stage]:
    model, contexts, draft_lengths, concurrency, calls = PROFILES["smoke" if args.smoke else "device"]
    cases = [
        dict(pattern="growing", context_len=c, num_draft_tokens=k, concurrency=n)
        for c in contexts
        for k in draft_lengths
        for n in concurrency
    ]
    checkpoints = work / "checkpoints"

    def export(mode: str, max_s: float) -> Stage:
        spec = dict(model=model, mode=mode, checkpoint=str(checkpoints / f"fp8-{mode}"))
        return Stage(f"export fp8-{mode}", "export", spec, min_s=15, max_s=max_s)

    def engine(mode: str, attention: str, where: str, min_s: float, max_s: float) -> Stage:
        name = f"fp8-{mode} {attention} {where}"
        spec = dict(
            label=name, where=where, attention=attention, checkpoint=str(checkpoints / f"fp8-{mode}"),
            engine=engine_config(model, args.smoke, contexts, draft_lengths, concurrency, calls, attention),
            cases=cases, calls=calls, bandwidth=bandwidth, timeout_s=max_s, threads=1 if args.smoke else None,
        )  # fmt: skip
        return Stage(name, "engine", spec, min_s=min_s, max_s=max_s)

    def ahead(attention: str, min_s: float, max_s: float) -> Stage:
        """Drafting ahead's B-branch loop against batch 1 (one context, k = 8)."""
        context = min(contexts)
        config = engine_config(model, args.smoke, (context,), (8,), (1,), calls, attention)
        config |= dict(top_choices=4, max_batch_size=max(AHEAD_BRANCHES), batch_buckets=AHEAD_BRANCHES)
        # The session's conversation, and each branch's own pages: its partial page and what it drafts.
        positions = 2 * (config["max_seq_len"] + 16) + max(AHEAD_BRANCHES) * 3 * 64
        per_position = machine.kv_bytes_per_position(PRESETS[model], DTYPES[config["dtype"]].itemsize)
        config["kv_cache_gb"] = round(positions * per_position / 2**30 + 0.001, 3)
        name = f"fp8-weight-only {attention} ahead loop"
        spec = dict(
            label=name, where="ahead", checkpoint=str(checkpoints / "fp8-weight-only"), engine=config,
            context_len=context, num_draft_tokens=8, branches=AHEAD_BRANCHES, calls=calls,
            timeout_s=max_s, threads=1 if args.smoke else None,
        )  # fmt: skip
        return Stage(name, "engine", spec, min_s=min_s, max_s=max_s)

    def tests(name: str, paths: list[str], min_s: float, max_s: float) -> Stage:
        return Stage(name, "pytest", dict(paths=paths, junit=f"{name}.xml"), min_s=min_s, max_s=max_s)

    if args.smoke:  # CPU: every kind of stage, in the device's order, on the tiny preset, in seconds
        stages = [
            export("weight-only", 60),
            engine("weight-only", "flex", "in-process", 5, 120),
            engine("weight-only", "sdpa", "in-process", 5, 120),
            engine("weight-only", "sdpa", "http", 5, 120),
            ahead("sdpa", 5, 60),
        ]
    else:
        stages = [
            tests("gpu-tests", FAST_GPU_TESTS, 30, 120),
            export("weight-only", 120),
            engine("weight-only", "flex", "in-process", 60, 180),
            engine("weight-only", "flex", "http", 60, 150),
            engine("weight-only", "sdpa", "in-process", 60, 150),
            export("dynamic", 90),
            engine("dynamic", "flex", "in-process", 60, 150),
            engine("weight-only", "sdpa", "http", 60, 150),
            ahead("flex", 45, 120),
            tests("gpu-tests-real-shape", REAL_SHAPE_GPU_TESTS, 60, 240),
        ]
    for i, stage in enumerate(stages):
        stage.spec.update(name=stage.name, kind=stage.kind, fail=stage.name == args.fail_stage)
        if stage.kind != "pytest":
            stage.spec["result"] = str(work / "stages" / f"{i:02d}-{stage.slug}.json")
    return stages
