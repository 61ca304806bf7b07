"""The adaptation benchmark (docs/adaptation.md): one stream of prompts from a domain the drafter was not
trained for, decoded greedily by a transformers target with drafts from two servers on the same drafter,
`--adapt` off and on, prompt by prompt in the same order, and tokens per round, the target's tokens/s and
the calls' latency compared over the stream, window by window.

    python -m bench.adapt [--testbed [DIR] | --realpair [DIR]] [--quick] [--out DIR]

On the testbed pair (its FP8 weight-only drafter, trained on the Python standard library) the stream is
this project's Markdown documentation (bench/adapt/stream.py). On the real pair (`--realpair`, as `python -m
bench.realpair fetch` leaves it) the stream is this project's own Python (`--roots`: drafter/, engine/ and
export/ unless told), function bodies to write, with defaults sized for its 1.5B target on 2 cores
(bench/adapt/args.py): the trainer trains rank-8 adapters (`--adapt-rank`), in 20 s of think time a
prompt, since its steps take seconds. Per prompt, in this order: the target alone (the reference every
output must equal, and the baseline tokens/s), then with drafts from the fixed drafter, then from the
adapting one, each a new v2 session (the calls that feed the adaptation buffer),
then `--think-s` of nothing: a target between two conversations. The trainer runs only on an idle server
after a quiet spell (drafter/server/adapt_work.py), and inside a conversation the target calls again within
milliseconds, so the think time is the trainer's time; it is the same for both servers. The adapting
server is paused (SIGSTOP) while the target alone and the fixed drafter's decodes are timed, so that its
trainer takes no core from them on a small machine; it is running during its own decode (a call that
arrives in a training step waits for it to stop, and that is in its latency) and the think time after.

Reported per window of `--window` prompts: tokens per round of each server and their ratio, the target's
tokens/s three ways; over the stream: when the ratio first reached the goal (1.3x) and how many target tokens
had been served by then, the windows below 0.98x, the outputs against the target alone (lossless), the
adapting server's /info `adaptation` at the end, the costs (a training step, a swap, the first call of a
prompt after a swap against the others, call p50/p99 of both), and the same rounds projected on a GPU
(bench/harness/projection.py). `--out` writes report.json, report.md and adapt.png. Exit 2 on bad input or
an unusable server, 1 if any output differs from the target alone's.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from importlib import metadata
from pathlib import Path

import torch
from tqdm import tqdm

from bench.adapt.args import parse_args, shown
from bench.adapt.report import print_summary, summarize, write_outputs
from bench.adapt.stream import code_stream_prompts, stream_prompts
from bench.harness.decoding import (
    DRAFT_TIMEOUT_S,
    PAIR_DRAFTERS,
    load_target,
    server_info,
    speculative_greedy,
    target_cost_flags,
    target_greedy,
    timed,
)
from bench.harness.gpu_floors import GPU_MODELS
from bench.harness.machine import describe
from bench.harness.prompts import WARMUP_PROMPT_LEN, WARMUP_SEED, BenchError, random_prompts
from bench.harness.refusals import ServerRefused
from bench.harness.server import ServerProcess
from bench.realpair.benchmark import check_fetched
from drafter.client import DraftClient, DraftRequestError
from drafter.integrations.transformers_generate import SpeculationStats
from drafter.sessions.draft_source import MODEL

# The adapting server's /info counters read before and after each think time. Its totals at the end also
# count the pauses that fell inside a step (a step's time is wall time), so a step's cost is read from these.
TRAINER_COUNTERS = (
    "training_steps",
    "training_seconds",
    "making_seconds",
    "scoring_seconds",
    "swaps",
    "rollbacks",
    "swap_seconds",
    "swap_commit_seconds",
)
GPU = {"testbed": GPU_MODELS["qwen3-8b"], "realpair": GPU_MODELS["qwen2.5-coder-1.5b"]}  # as bench.acceptance


def server_flags(drafter_dir: Path, dtype: str, *more: str) -> list[str]:
    """Both servers' flags (`servers` adds --adapt to one): the pair's drafter on the CPU in `dtype`. A
    benchmark waits for every draft: a call queued past the server's default 1 s (a busy machine, both
    servers alike) is dropped with a 504, and a skipped draft stops the stream (the first full run on a busy
    machine stopped on 2 skipped calls, its logs gone with its servers: most likely this)."""
    timeout = ["--request-timeout-s", str(DRAFT_TIMEOUT_S)]
    return ["--model", str(drafter_dir), "--device", "cpu", "--dtype", dtype, *timeout, *more]


@contextlib.contextmanager
def servers(flags: list[str], adapt_rank: int = 0):
    """The fixed drafter's server and the adapting one, the same flags but `--adapt`."""
    with (
        ServerProcess(flags, timeout_s=300) as off,
        ServerProcess([*flags, "--adapt", "--adapt-rank", str(adapt_rank)], timeout_s=300) as on,
        DraftClient(off.url, timeout_s=DRAFT_TIMEOUT_S) as off_client,
        DraftClient(on.url, timeout_s=DRAFT_TIMEOUT_S) as on_client,
    ):
        try:
            yield off_client, on, on_client
        except BenchError:  # a failed draft call: its server's log says why, and is deleted on close
            for name, server in (("off", off), ("on", on)):
                tail = "\n".join(server.log.splitlines()[-12:])
                print(f"--adapt {name} server ({server.url}), its log's last lines:\n{tail}", file=sys.stderr)
            raise


def decode(model, client, prompt: list[int], args) -> dict:
    """One prompt with drafts from `client`: its output, time and rounds."""
    stats = SpeculationStats(args.num_draft_tokens)
    out, seconds = timed(speculative_greedy, model, client, prompt, args.max_new_tokens, stats, False, MODEL)
    return {
        "output": out,
        "seconds": seconds,
        "rounds": stats.num_rounds,
        "kept": stats.num_kept,
        "round_log": stats.round_log,
        "draft_call_ms": stats.draft_call_ms,
    }


def stream(args, model, prompts, off_client, on, on_client) -> list[dict]:
    """Every prompt: the target alone, the fixed drafter (the adapting server paused), the adapting one,
    then the think time; what each did, and the adapting server's live version before its decode."""
    rows = []
    for prompt in tqdm(prompts, desc="adapt", unit="prompt", file=sys.stderr):
        on.signal(signal.SIGSTOP)
        try:
            reference, alone_s = timed(target_greedy, model, prompt["tokens"], args.max_new_tokens)
            off = decode(model, off_client, prompt["tokens"], args)
        finally:
            on.signal(signal.SIGCONT)
        version = on_client.info()["adaptation"]["version"]
        adapted = decode(model, on_client, prompt["tokens"], args)
        before = on_client.info()["adaptation"]
        time.sleep(args.think_s)
        after = on_client.info()["adaptation"]
        rows.append({
            "name": prompt["name"],
            "prompt_tokens": len(prompt["tokens"]),
            "new_tokens": len(reference),
            "alone_s": alone_s,
            "version_before": version,
            "trainer_in_think": {key: after[key] - before[key] for key in TRAINER_COUNTERS},
            **{side: {**run, "lossless": run.pop("output") == reference} for side, run in (("off", off), ("on", adapted))},
        })  # fmt: skip
    return rows


def run(args) -> dict:
    if args.pair == "realpair":
        check_fetched(args.directory, PAIR_DRAFTERS[args.drafter])
        tokenizer = args.directory / "target" / "tokenizer.json"
        prompts, source = code_stream_prompts(args.prompts, tokenizer, args.roots)
    else:
        prompts, source = stream_prompts(args.prompts, args.max_new_tokens)
    # One thread by default: the servers need cores too, and two spinning OpenMP threads on a busy 2-core
    # machine make every small matmul several times slower (tests/conftest.py's one_thread).
    torch.set_num_threads(args.target_threads)
    model = load_target(args.directory / "target", "cpu", "float32")
    [warmup] = random_prompts(model.config.vocab_size, WARMUP_PROMPT_LEN, (WARMUP_PROMPT_LEN,), WARMUP_SEED)
    cost_flags, verify_ms, token_ms = target_cost_flags(model, warmup, args)
    drafter_dir = args.directory / PAIR_DRAFTERS[args.drafter]
    flags = server_flags(drafter_dir, args.dtype, *cost_flags)
    print(f"drafter servers on {drafter_dir}, --adapt off and on", file=sys.stderr)
    started = time.monotonic()
    with servers(flags, args.adapt_rank) as (off_client, on, on_client):
        info = server_info(on_client)
        if "version" not in info["adaptation"]:  # {"enabled": false}
            raise BenchError(f"the server at {on_client.url} was started with --adapt but does not adapt")
        # Untimed warm-ups on random ids: their tokens reach the adapting server's buffer too, as
        # any first conversation's would.
        target_greedy(model, warmup, args.max_new_tokens)
        for client in (off_client, on_client):
            decode(model, client, warmup, args)
        rows = stream(args, model, prompts, off_client, on, on_client)
        adaptation = on_client.info()["adaptation"]
    return {
        "prompts": rows,
        "summary": summarize(rows, args.window, GPU[args.pair], args.think_s),
        "adaptation": adaptation,
        "config": {
            "pair": shown(args.directory),
            "pair_kind": args.pair,
            "adapt_rank": args.adapt_rank,
            "drafter": {
                **{key: info.get(key) for key in ("quantization", "device", "dtype")},
                "model": shown(drafter_dir),
            },
            "stream": source,
            "num_prompts": len(rows),
            "max_new_tokens": args.max_new_tokens,
            "num_draft_tokens": args.num_draft_tokens,
            "draft_source": MODEL,
            "think_s": args.think_s,
            "window_prompts": args.window,
            "quick": args.quick,
            "target": {
                "device": "cpu",
                "dtype": "float32",
                "threads": args.target_threads,
                "step_ms": verify_ms,
                "per_token_ms": token_ms,
            },  # fmt: skip
            "gpu_model": GPU[args.pair].as_dict(),
            "wall_s": time.monotonic() - started,
            "versions": {name: metadata.version(name) for name in ("torch", "transformers")},
        },
        "machine": describe("cpu"),
    }


def main(argv=None) -> int:
    args = parse_args(argv, __doc__)
    try:
        report = run(args)
    except DraftRequestError as error:
        print(f"adapt: error: {ServerRefused.from_client(error)}", file=sys.stderr)
        return 2
    except (
        BenchError,
        ValueError,
        OSError,
        RuntimeError,
        TimeoutError,
    ) as error:  # a server that did not start
        print(f"adapt: error: {error}", file=sys.stderr)
        return 2
    if args.out:
        write_outputs(report, args.out)
    print_summary(report)
    return 0 if report["summary"]["lossless"] else 1


if __name__ == "__main__":
    sys.exit(main())
