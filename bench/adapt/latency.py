"""What `--adapt` costs a draft call while its trainer works, at 1 and 4 concurrent clients:

    python -m bench.adapt.latency [--testbed [DIR] | --realpair [DIR]] [--clients 1,4] [--out DIR]

The issue's bar: a call's p99 with the trainer at work stays within +10% of `--adapt` off. Why scripted
targets: a real target per client would take the cores the servers need on a small machine, and the calls,
not the target, are what is measured. Each client replays conversations whose target output is known (the
testbed target's greedy output on bench/adapt/stream.py's prompts, the domain its drafter never saw; with
`--realpair`, the real 1.5B target's on this project's Python, its drafter served as bench.adapt serves it): per
round a v2 `/draft` call (timed), the drafts checked against the known output as a greedy target would keep
them, then `--verify-ms` of sleep (the target's verify pass: the engine idles) and, after each
conversation, `--think-s` (a target between two conversations: the quiet spells the trainer works in,
drafter/server/adapt_work.py). So both servers get the same calls in the same order, and the adapting one's
trainer has new traffic throughout: both are fed a first pass of every conversation before anything is timed.

Servers run one at a time: the other is paused (SIGSTOP), so a trainer never takes a core from the server
being timed but its own. Per client count the order is off, on, off, on (`--repeats 2`), latencies pooled
per side, and the adapting server's /info counts what its trainer did meanwhile (training steps, scoring
time, swaps): a p99 measured while the trainer did nothing would prove nothing, and the report says so.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from pathlib import Path

import torch

from bench.adapt.args import REALPAIR_DIR, REALPAIR_RUN, shown
from bench.adapt.run import server_flags, servers
from bench.adapt.stream import code_stream_prompts, stream_prompts
from bench.harness.decoding import PAIR_DRAFTERS, load_target, target_greedy
from bench.harness.machine import describe
from bench.harness.prompts import BenchError
from bench.harness.report import percentiles, publish
from bench.realpair.benchmark import check_fetched
from bench.testbed import PAIR
from drafter.client import DraftClient

COUNTERS = (
    "training_steps",
    "training_seconds",
    "scoring_seconds",
    "swaps",
    "rejected_candidates",
    "rollbacks",
)


def client_counts(text: str) -> tuple[int, ...]:
    counts = tuple(int(n) for n in text.split(","))
    if min(counts) < 1:
        raise argparse.ArgumentTypeError("client counts must be positive")
    return counts


# Each pair's defaults. The real pair (a 1.5B target, ~0.5 s a verify on 2 cores): its drafter served as
# bench.adapt --realpair serves it, and think time long enough for the trainer to start (its quiet spell is
# twice the target's longest round, drafter/server/adapt_work.py) and be met mid-step by the next call.
TESTBED = {"num_draft_tokens": 8, "prompts": 24, "max_new_tokens": 96, "verify_ms": 20.0, "think_s": 0.3,
           "repeats": 2, "target_threads": 1, "dtype": "float32", "adapt_rank": 0}  # fmt: skip
REALPAIR = {**TESTBED, "num_draft_tokens": REALPAIR_RUN["num_draft_tokens"], "prompts": 12,
            "max_new_tokens": 48, "verify_ms": 500.0, "think_s": 4.0, "repeats": 1,
            "target_threads": REALPAIR_RUN["target_threads"], "dtype": REALPAIR_RUN["dtype"],
            "adapt_rank": REALPAIR_RUN["adapt_rank"]}  # fmt: skip


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    pairs = parser.add_mutually_exclusive_group()
    pairs.add_argument("--testbed", nargs="?", const=PAIR, type=Path, metavar="DIR",
                       help="the testbed pair's directory [the committed pair; the default pair]")  # fmt: skip
    pairs.add_argument("--realpair", nargs="?", const=REALPAIR_DIR, type=Path, metavar="DIR",
                       help=f"the real pair's directory [{shown(REALPAIR_DIR)}]")  # fmt: skip
    parser.add_argument("--clients", type=client_counts, default=(1, 4), help="client counts [1,4]")
    parser.add_argument("--prompts", type=int, help="conversations per pass [24; real pair 12]")
    parser.add_argument("--max-new-tokens", type=int, help="per conversation [96; real pair 48]")
    parser.add_argument("--verify-ms", type=float, help="the target's pass per round [20; real pair 500]")
    parser.add_argument("--think-s", type=float, help="between conversations [0.3; real pair 4]")
    parser.add_argument("--repeats", type=int, help="off/on passes per client count [2; real pair 1]")
    parser.add_argument("--out", type=Path, help="write report.json and report.md here")
    args = parser.parse_args(argv)
    args.pair = "realpair" if args.realpair else "testbed"
    args.directory = args.realpair or args.testbed or PAIR
    for key, value in (REALPAIR if args.realpair else TESTBED).items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if min(args.prompts, args.max_new_tokens, args.repeats) < 1 or min(args.verify_ms, args.think_s) < 0:
        parser.error("--prompts, --max-new-tokens and --repeats must be positive, the times not negative")
    return args


def converse(client: DraftClient, name: str, prompt: list[int], output: list[int], args) -> list[float]:
    """One conversation as a greedy target with a known output holds it; each call's ms."""
    context, done, call_ms = list(prompt), 0, []
    with client.session(name) as session:
        while done < len(output):
            began = time.perf_counter()
            drafts = session.draft(context, args.num_draft_tokens)
            call_ms.append((time.perf_counter() - began) * 1e3)
            if drafts.skipped is not None:
                raise BenchError(f"a draft call was not answered ({drafts.skipped})")
            kept = 0
            while (
                kept < len(drafts.tokens)
                and done + kept < len(output)
                and drafts.tokens[kept] == output[done + kept]
            ):
                kept += 1
            step = min(kept + 1, len(output) - done)  # the kept drafts, then the target's own token
            context += output[done : done + step]
            done += step
            time.sleep(args.verify_ms / 1e3)
    return call_ms


def one_pass(url: str, conversations: list[tuple], clients: int, args, tag: str) -> list[float]:
    """Every conversation once, shared among `clients` threads; every call's ms."""
    shares = [conversations[i::clients] for i in range(clients)]
    results: list[list[float]] = [[] for _ in range(clients)]
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            with DraftClient(url, timeout_s=60) as client:
                for number, (prompt, output) in enumerate(shares[index]):
                    results[index] += converse(client, f"{tag}-{index}-{number}", prompt, output, args)
                    time.sleep(args.think_s)
        except BaseException as error:  # noqa: BLE001 - reported once the threads are joined
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise BenchError(f"a client failed: {errors[0]}")
    return [ms for share in results for ms in share]


def trainer_counts(client: DraftClient) -> dict:
    adaptation = client.info()["adaptation"]
    return {key: adaptation[key] for key in COUNTERS}


def run(args) -> dict:
    drafter_dir = args.directory / PAIR_DRAFTERS["weight-only"]
    if args.pair == "realpair":
        check_fetched(args.directory, drafter_dir.name)
        prompts, source = code_stream_prompts(args.prompts, args.directory / "target" / "tokenizer.json")
    else:
        prompts, source = stream_prompts(args.prompts, args.max_new_tokens)
    torch.set_num_threads(args.target_threads)
    target = load_target(args.directory / "target", "cpu", "float32")
    conversations = [(p["tokens"], target_greedy(target, p["tokens"], args.max_new_tokens)) for p in prompts]
    del target
    flags = server_flags(drafter_dir, args.dtype)
    rows, started = [], time.monotonic()
    with servers(flags, args.adapt_rank) as (off_client, on, on_client):
        urls = {"off": off_client.url, "on": on_client.url}
        on.signal(signal.SIGSTOP)  # paused whenever the other is timed
        paused = True
        # The fixed server's first traffic untimed too, as the adapting one's is below: a server learns the
        # target's costs from it (drafting ahead's plans), and on the real pair an untaught fixed server
        # drafted every call in the engine (p50 697 ms against 12 ms from the taught one's branches).
        one_pass(urls["off"], conversations, args.clients[0], args, "feed")
        for clients in args.clients:
            latencies: dict[str, list[float]] = {"off": [], "on": []}
            trainer = dict.fromkeys(COUNTERS, 0)
            for repeat in range(args.repeats):
                for side in ("off", "on"):
                    if side == "on" and paused:
                        on.signal(signal.SIGCONT)
                        paused = False
                        if clients == args.clients[0] and repeat == 0:  # the trainer's first traffic
                            one_pass(urls["on"], conversations, clients, args, "feed")
                    before = trainer_counts(on_client) if side == "on" else None
                    tag = f"{side}-{clients}-{repeat}"
                    latencies[side] += one_pass(urls[side], conversations, clients, args, tag)
                    if side == "on":
                        after = trainer_counts(on_client)
                        for key in COUNTERS:
                            trainer[key] += after[key] - before[key]
                        on.signal(signal.SIGSTOP)
                        paused = True
            off, on_ms = percentiles(latencies["off"]), percentiles(latencies["on"])
            rows.append({
                "clients": clients,
                "calls": len(latencies["on"]),
                "off": off,
                "on": on_ms,
                "p50_ratio": on_ms["p50"] / off["p50"],
                "p99_ratio": on_ms["p99"] / off["p99"],
                "trainer_while_timed": trainer,
            })  # fmt: skip
        if paused:
            on.signal(signal.SIGCONT)
        adaptation = on_client.info()["adaptation"]
    return {
        "rows": rows,
        "adaptation": adaptation,
        "config": {
            "pair": shown(args.directory),
            "pair_kind": args.pair,
            "drafter": shown(drafter_dir),
            "dtype": args.dtype,
            "adapt_rank": args.adapt_rank,
            "stream": source,
            "prompts": len(conversations),
            "max_new_tokens": args.max_new_tokens,
            "num_draft_tokens": args.num_draft_tokens,
            "verify_ms": args.verify_ms,
            "think_s": args.think_s,
            "repeats": args.repeats,
            "wall_s": time.monotonic() - started,
        },
        "machine": describe("cpu"),
    }


def markdown(report: dict) -> str:
    config, machine = report["config"], report["machine"]
    lines = [
        f"Drafter {config['drafter']} ({config.get('dtype', 'float32')}, --adapt-rank "
        f"{config.get('adapt_rank', 0)}, k = {config['num_draft_tokens']}, model drafts), {config['prompts']} "
        "conversations of up to "
        f"{config['max_new_tokens']} target tokens per pass, a {config['verify_ms']:.0f} ms verify per round, "
        f"{config['think_s']} s between conversations, {config['repeats']} off/on passes per client count; "
        f"{machine.get('cpu', '?')}, {machine.get('cpu_cores', '?')} cores; {config['wall_s'] / 60:.1f} min.",
        "",
        "| clients | calls per side | off p50 / p99 ms | on p50 / p99 ms | on / off p50 | on / off p99 | "
        "trainer while timed: steps, training s, scoring s, swaps |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        off, on, trainer = row["off"], row["on"], row["trainer_while_timed"]
        lines.append(
            f"| {row['clients']} | {row['calls']} | {off['p50']:.1f} / {off['p99']:.1f} | "
            f"{on['p50']:.1f} / {on['p99']:.1f} | {row['p50_ratio']:.2f} | **{row['p99_ratio']:.2f}** | "
            f"{trainer['training_steps']}, {trainer['training_seconds']:.1f}, {trainer['scoring_seconds']:.1f}, "
            f"{trainer['swaps']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        report = run(args)
    except (BenchError, OSError, RuntimeError, TimeoutError) as error:
        print(f"adapt_latency: error: {error}", file=sys.stderr)
        return 2
    publish(report, markdown(report), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
