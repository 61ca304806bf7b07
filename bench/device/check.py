"""One command for a CUDA machine with no network: test, export and measure the drafter in stages, in a budget.

    bash bench/device/check.sh --out DIR               # CUDA, with the device kit (bench/device/kit.py)
    python -m bench.device.check --out DIR             # CUDA, where the packages are installed
    python -m bench.device.check --smoke --out DIR     # CPU: the tiny preset, a minute (the suite runs it)

Stages, in this order, each in a process of its own (bench/device/stages.py) under a deadline that the
whole run's budget (`--budget-s`, 450 s: the check must end within 8 minutes of one H200, cold compiles
included) caps, so no stage can overrun it: a stage that would is stopped, and what it measured so far is
kept. A stage that fails or is stopped is recorded with why; the next one still runs.
1. the fast GPU tests (`tests/test_gpu.py`, `tests/test_gpu_fp8.py`: `-x`, JUnit XML and the whole log
   into DIR, kept when stopped);
2. the production path first: export the `qwen3-0.6b-random` preset (Qwen3-0.6B's shape, random weights)
   to weight-only FP8, then flex + torch.compile + CUDA graphs in-process, then the same over HTTP;
3. the comparisons: sdpa in-process, FP8 dynamic (exported then) on flex, sdpa over HTTP, and last the
   real-shape GPU tests (several compiled engines).
Every engine stage measures growing conversations at 2k, 8k and 32k context, k = 4 and 16, 1 and 4
clients: per-call p50/p90/p99, ms per decode step and the bandwidth floor; per engine its warmup and
capture time, fallbacks, graphs, kernels per replayed step, recompiles after warmup and peak memory; per
server what a call costs beyond the engine and a health round trip. One inductor cache (build/inductor,
the suite's) serves every stage and the tests. `device_check.json` and `device_check.md` are rewritten after
every stage; `device_check.png` at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from bench.device.plan import Stage, plan
from bench.device.report import markdown, plot
from bench.harness import machine
from bench.harness.server import REPO

WRITE_RESERVE_S = 10  # kept back from every deadline, for the reports


class Budget:
    """Wall-clock budget of the whole check; a stage that would not fit is skipped and its reason kept."""

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
    parser.add_argument("--out", required=True, help="directory for the JSON, Markdown table, logs and plot")
    parser.add_argument(
        "--work",
        type=Path,
        default=REPO / "build" / "device-check",
        help="checkpoints and stage files [build/device-check]",
    )
    parser.add_argument("--smoke", action="store_true", help="tiny preset on CPU, about a minute")
    parser.add_argument("--budget-s", type=float, default=450, help="wall-clock budget of the run [450]")
    parser.add_argument("--stages", help="run only these stages (comma-separated names, as the report lists)")
    parser.add_argument("--fail-stage", help=argparse.SUPPRESS)  # the check's own test: this stage raises
    args = parser.parse_args(argv)
    args.device = "cpu" if args.smoke else "cuda"
    if not args.smoke and not torch.cuda.is_available():
        parser.error("the device check needs CUDA; on a CPU run it with --smoke")
    return args


def run_stage(stage: Stage, out: Path, work: Path, timeout_s: float) -> dict:
    """Run one stage in its own process until it ends or its deadline; its record and result."""
    log_path = out / "stages.log"
    started = time.perf_counter()
    with open(log_path, "a") as log:
        log.write(f"\n===== {stage.name} (deadline {timeout_s:.0f} s)\n")
        log.flush()
        if stage.kind == "pytest":
            command = [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-x",
                "-p",
                "no:cacheprovider",
                *stage.spec["paths"],
            ]
            command += ["--junitxml", str(out / stage.spec["junit"])]
        else:
            spec_path = work / "stages" / f"{stage.slug}.spec.json"
            spec_path.write_text(json.dumps(stage.spec))
            command = [sys.executable, "-m", "bench.device.stages", str(spec_path)]
        # A process group of its own: a stage stopped at its deadline takes its children (a server it
        # spawned, pytest's) with it, so none holds the GPU or a port into the next stage.
        process = subprocess.Popen(
            command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            returncode = process.wait(timeout=timeout_s)
            status = "ok" if returncode == 0 else f"failed (exit {returncode})"
        except subprocess.TimeoutExpired:
            status = f"stopped at its deadline ({timeout_s:.0f} s)"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    record = {"stage": stage.name, "status": status, "seconds": round(time.perf_counter() - started, 1)}
    result = {}
    if stage.kind == "pytest":
        record["summary"] = pytest_summary(log_path)
    elif Path(stage.spec["result"]).exists():
        result = json.loads(Path(stage.spec["result"]).read_text())
    if status != "ok":
        record["log_tail"] = log_path.read_text(errors="replace")[-2000:]
    return record | {"result": result}


def pytest_summary(log_path: Path) -> str:
    lines = [line for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][-300:] if lines else ""


def write_reports(out: Path, result: dict, after: str) -> None:
    (out / "device_check.json").write_text(json.dumps(result, indent=1, default=str))
    (out / "device_check.md").write_text(markdown(result) + "\n")
    print(f"wrote device_check.json after stage {after}", flush=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    budget, out = Budget(args.budget_s), Path(args.out).resolve()
    work = args.work.resolve()
    out.mkdir(parents=True, exist_ok=True)
    (work / "stages").mkdir(parents=True, exist_ok=True)
    for stale in (work / "stages").iterdir():  # an earlier run's results must not pass for this one's
        stale.unlink()
    (out / "stages.log").write_text("")
    # One inductor cache for every stage and the tests (tests/conftest.py's default), so nothing compiles twice.
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(REPO / "build" / "inductor"))
    bandwidth = machine.measure_bandwidth(args.device)
    result = {
        "machine": machine.describe(args.device),
        "args": vars(args),
        "bandwidth_bytes_per_s": bandwidth,
        "stages": [],
        "results": [],
        "engines": {},
        "skipped": budget.skipped,
    }
    stages = plan(args, work, bandwidth)
    if args.stages:
        wanted = set(args.stages.split(","))
        stages = [s for s in stages if s.name in wanted]
    write_reports(out, result, "none (the plan)")
    failed = False
    for stage in stages:
        if not budget.allows(stage.name, stage.min_s + WRITE_RESERVE_S):
            continue
        timeout = min(stage.max_s, budget.left() - WRITE_RESERVE_S)
        print(f"stage {stage.name} (up to {timeout:.0f} s) ...", flush=True)
        record = run_stage(stage, out, work, timeout)
        stage_result = record.pop("result")
        result["stages"].append(record)
        result["results"] += stage_result.get("rows", [])
        if stage.kind == "engine":
            result["engines"][stage.name] = stage_result.get("facts", {})
        elif stage.kind == "export":
            result.setdefault("exports", {})[stage.name] = stage_result.get("facts", {})
        failed |= record["status"] != "ok"
        print(f"  {record['status']} in {record['seconds']} s", flush=True)
        write_reports(out, result, stage.name)
    if budget.skipped:  # the stages the budget no longer held come after the last stage that ran
        write_reports(out, result, "the end (skipped stages listed)")
    if result["results"]:
        plot(
            result["results"],
            out / "device_check.png",
            f"{stages[0].spec.get('model', '')} on {result['machine']['device_name']}",
        )
    print(markdown(result))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
