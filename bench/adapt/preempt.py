"""What a request waits for while the adaptation cycle works (`--adapt`): the time from its arrival to the
engine being free again, by the kind of work it found under way.

    python -m bench.adapt.preempt [--model DIR] [--dtype bfloat16] [--rank 8] [--seconds 240] [--threads 2] \
        [--out DIR]

The cycle is the server's own (drafter/server/adapt_work.py builds it the same way) on the real pair's served
drafter, its buffer fed with this project's Python as traffic (bench/adapt/stream.py; what a target emitted
does not change how long the work takes). It runs as the server runs it, `work(stop)` on an idle engine,
and a request "arrives" at a random moment 0-3 s (`--latest-arrival`) into each run: `stop()` turns true then, and the wait is
the time until `work` returns. So that every kind of work is met often in a few minutes, a candidate is
made every 4 steps and every one is swapped in (its score does not matter here). The kinds: a training step
(`train`), a held-out example scored (`score`), a candidate made (`making_s`), the scorer loading a version
(`scoring_s`), a swap's pieces or commit (`swap_s`). Default model: the real pair's served drafter
(Qwen2.5-Coder-0.5B FP8 weight-only, as `python -m bench.realpair fetch` leaves it).
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch

from bench.adapt.args import REALPAIR_RUN, add_model_argument
from bench.adapt.stream import code_stream_prompts
from bench.harness.machine import describe
from bench.harness.report import publish
from bench.realpair.benchmark import DEFAULT_DIR
from drafter.adaptation.cycle import Cycle
from drafter.server.adapt_work import build_cycle
from engine.config import EngineConfig
from engine.engine import DTYPES, Engine
from engine.model.errors import LoadError

K = REALPAIR_RUN["num_draft_tokens"]
EMITTED = 64  # target tokens a prompt's conversation emitted, as bench.adapt --realpair decodes
BUFFER_TOKENS = 1 << 16  # the server's default buffer


def feed(cycle: Cycle, prompts: list[dict]) -> None:
    """Each prompt as a conversation whose target emitted its last EMITTED tokens, K - 1 drafts kept a round."""
    for prompt in prompts:
        tokens = np.asarray(prompt["tokens"])
        last_len = len(tokens) - EMITTED
        while last_len < len(tokens):
            cycle.buffer.add(prompt["name"], tokens[: last_len + K], last_len, K - 1, K)
            last_len += K


def kind_under_way(cycle: Cycle) -> str:
    return cycle.making[0] if cycle.making is not None else cycle.phase


class Arrival:
    """A request arriving at `at` (perf_counter seconds): `stop()` for the cycle, noting the work it found."""

    def __init__(self, cycle: Cycle, at: float):
        self.cycle, self.at, self.found = cycle, at, None

    def stop(self) -> bool:
        if time.perf_counter() < self.at:
            return False
        if self.found is None:
            self.found = kind_under_way(self.cycle)
        return True


def measure(cycle: Cycle, seconds: float, latest_arrival_s: float, seed: int) -> list[dict]:
    """Runs of `cycle.work` until `seconds` have passed, each stopped at a random moment: per run, the kind
    of work the stop found and the wait."""
    rng, waits = random.Random(seed), []
    ends = time.perf_counter() + seconds
    while time.perf_counter() < ends:
        if not cycle.has_work():  # a round starts only once new traffic came in: as if it had
            cycle.tokens_at_round = -cycle.settings.min_train_tokens
        arrival = Arrival(cycle, time.perf_counter() + rng.uniform(0.0, latest_arrival_s))
        cycle.work(arrival.stop)
        returned = time.perf_counter()
        if arrival.found is not None:  # else the work returned before the request came (a decision)
            waits.append({"kind": arrival.found, "wait_s": returned - arrival.at})
    return waits


def summary(waits: list[dict]) -> list[dict]:
    rows = []
    for kind in sorted({w["kind"] for w in waits}) + ["all"]:
        seconds = np.array([w["wait_s"] for w in waits if kind in ("all", w["kind"])])
        rows.append(
            {
                "kind": kind,
                "n": len(seconds),
                "p50_ms": 1e3 * float(np.percentile(seconds, 50)),
                "p99_ms": 1e3 * float(np.percentile(seconds, 99)),
                "max_ms": 1e3 * float(seconds.max()),
            }
        )
    return rows


def markdown(report: dict) -> str:
    config = report["config"]
    lines = [
        f"{config['model']} ({config['dtype']}, rank {config['rank']}, {config['threads']} threads, "
        f"{report['machine']['cpu']}): what a request arriving during the cycle's work waits for.",
        "",
        "| work under way | requests | wait p50, ms | p99, ms | max, ms |",
        "|---|---|---|---|---|",
    ]
    for row in report["summary"]:
        lines.append(
            f"| {row['kind']} | {row['n']} | {row['p50_ms']:.1f} | {row['p99_ms']:.1f} | {row['max_ms']:.1f} |"
        )
    counters = report["cycle"]
    lines += [
        "",
        f"The cycle meanwhile: {counters['training_steps']} steps, {counters['swaps']} swaps, "
        f"{counters['rejected_candidates']} candidates rejected.",
    ]
    return "\n".join(lines) + "\n"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_argument(parser)
    parser.add_argument("--tokenizer", type=Path, default=DEFAULT_DIR / "target" / "tokenizer.json",
                        help="the traffic's tokenizer [the real pair's]")  # fmt: skip
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=REALPAIR_RUN["dtype"], help="served dtype")
    parser.add_argument("--rank", type=int, default=REALPAIR_RUN["adapt_rank"], help="adapter rank, 0: all")
    parser.add_argument("--prompts", type=int, default=20, help="conversations of traffic [20]")
    parser.add_argument("--seconds", type=float, default=240.0, help="how long the cycle runs [240]")
    parser.add_argument("--latest-arrival", type=float, default=3.0,
                        help="a request arrives 0 to this many seconds into a run [3: a real-pair step]")  # fmt: skip
    parser.add_argument("--threads", type=int, default=2, help="torch threads [2]")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write report.json and report.md here")
    args = parser.parse_args(argv)
    if min(args.threads, args.prompts) < 1 or args.rank < 0 or min(args.seconds, args.latest_arrival) <= 0:
        parser.error(
            "--threads and --prompts must be positive, --rank >= 0, --seconds and --latest-arrival > 0"
        )
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        engine = Engine.load(args.model, EngineConfig(device="cpu", dtype=args.dtype))
        prompts, _ = code_stream_prompts(args.prompts, args.tokenizer)
    except (LoadError, OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    cycle = build_cycle(engine, BUFFER_TOKENS, args.rank)
    every_one_in = {"margin": -1.0, "min_rounds": 0}  # every candidate swapped in, whatever its score
    cycle.settings = dataclasses.replace(cycle.settings, steps_per_candidate=4, **every_one_in)
    feed(cycle, prompts)
    waits = measure(cycle, args.seconds, args.latest_arrival, args.seed)
    report = {
        "summary": summary(waits),
        "waits": waits,
        "cycle": cycle.counters.describe(),
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "out"},
        "machine": describe("cpu"),
    }
    publish(report, markdown(report), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
