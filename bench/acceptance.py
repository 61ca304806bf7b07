"""The end-to-end benchmark: a transformers target decodes greedily, once alone and once per k with drafts
from a running drafter server (drafter/integrations/transformers_generate.py, through drafter.client), on
each workload; it reports the target's tokens/s both ways (the speedup), tokens per round, acceptance by
position, the share of wall time spent waiting for drafts, whether the outputs are identical (lossless),
and the same rounds replayed on *projected* GPUs (bench/harness/projection.py, bench/harness/gpu_floors.py).

    python -m bench.acceptance --testbed [--drafter weight-only|dynamic|bf16] [--out DIR]
    python -m bench.acceptance --realpair [DIR] [--quick] [--drafter weight-only|dynamic|bf16] [--out DIR]
    python -m bench.acceptance --target DIR --url http://127.0.0.1:8000 [--prompts FILE ...] [--json OUT]

`--testbed` takes the committed pair (bench/testbed/): its target, its workloads, and a server it starts on
the drafter's FP8 weight-only export, told the target's measured verify time (what `"auto"` weighs k
against). `--realpair` does the same with the real pair (Qwen2.5-Coder-1.5B-Instruct verifying drafts of
Qwen2.5-Coder-0.5B-Instruct) that `python -m bench.realpair fetch` leaves in DIR (build/realpair/), on
bench/realpair/prompts.jsonl's code, prose and edit prompts under the target's chat template, decoding
greedily to `<|im_end|>`; its defaults are bench/realpair/benchmark.py's. `--num-draft-tokens` takes a
list, e.g. `2,4,8,16,auto`. Each `--prompts` file is a workload (named by its lines' "workload" field, else
the file's stem): JSONL of `{"tokens": [ids]}`, `{"text": ...}` (needs the target's tokenizer) or bare
lists of ids; without one, seeded random ids. `mean_accepted_tokens`, `acceptance_by_position` and
`rounds` are SpeculationStats' (a perfect drafter scores k + 1). Without --stop-at-eos (off by default, on for
--realpair) both paths decode through EOS (`min_new_tokens` masks it, as `generate` does). Exit 2 on bad
input, a pair not on disk or an unusable server (one line on stderr; a draft call the client had to skip
counts as unusable, since acceptance measured without drafts means nothing), 1 if any output differs.
"""

from __future__ import annotations

import json
import sys
from importlib import metadata

from tqdm import tqdm

from bench.acceptance_args import parse_args
from bench.acceptance_report import print_summary, result, summarize, write_outputs
from bench.harness.decoding import (
    DRAFT_TIMEOUT_S,
    drafter_url,
    server_info,
    speculative_greedy,
    target_greedy,
    timed,
)
from bench.harness.machine import describe
from bench.harness.prompts import (
    WARMUP_PROMPT_LEN,
    WARMUP_SEED,
    BenchError,
    load_prompts,
    random_prompts,
)
from bench.harness.refusals import ServerRefused
from bench.pair_choice import open_target
from drafter.client import DraftClient, DraftRequestError
from drafter.integrations.transformers_generate import AUTO, SpeculationStats


def check_server(args, info: dict, vocab_size: int) -> None:
    fixed = [k for k in args.num_draft_tokens if k != AUTO]
    if fixed and max(fixed) > info["max_draft_tokens"]:
        raise BenchError(
            f"--num-draft-tokens {max(fixed)}: the server drafts at most {info['max_draft_tokens']}"
        )
    if info["vocab_size"] != vocab_size:
        raise BenchError(
            f"the drafter's vocabulary ({info['vocab_size']}) is not the target's ({vocab_size}); "
            "speculative decoding needs one tokenizer"
        )
    if args.max_new_tokens > info["max_context"]:
        raise BenchError(
            f"--max-new-tokens {args.max_new_tokens} exceeds the server's max context {info['max_context']}"
        )


def measure_workload(args, model, connect, prompts, warmup, bar) -> list[dict]:
    """Target alone on every prompt, then with drafts for each source and k, each after an untimed warm-up
    and from the client `connect()` gives (for a pair, a fresh server each time: a server's global suffix
    index keeps every conversation's response, so a second run of the same prompts would draft from the
    first run's outputs)."""
    n, stop = args.max_new_tokens, args.stop_at_eos
    target_greedy(model, warmup, n, stop)
    reference, alone_s = [], 0.0
    for prompt in prompts:
        out, seconds = timed(target_greedy, model, prompt, n, stop)
        reference.append(out)
        alone_s += seconds
        bar.update()
    results = []
    for source in args.source:
        for k in args.num_draft_tokens:
            with connect() as client:
                results.append(
                    measure_run(args, model, client, prompts, warmup, bar, source, k, reference, alone_s)
                )
    return results


def measure_run(args, model, client, prompts, warmup, bar, source, k, reference, alone_s) -> dict:
    """One source and k over the workload's prompts, after an untimed warm-up."""
    n, stop = args.max_new_tokens, args.stop_at_eos
    speculative_greedy(model, client, warmup, n, SpeculationStats(k), stop, source)
    stats, outputs, speculative_s = SpeculationStats(k), [], 0.0
    for prompt in prompts:
        out, seconds = timed(speculative_greedy, model, client, prompt, n, stats, stop, source)
        outputs.append(out)
        speculative_s += seconds
        bar.update()
    return {"source": source, **result(k, stats, outputs, reference, alone_s, speculative_s, args.gpus)}


def prepare(args, client: DraftClient, model, workloads):
    info = server_info(client)
    check_server(args, info, model.config.vocab_size)
    vocab_size = model.config.vocab_size
    if workloads is None:
        prompts = {"random": load_prompts(args, None, vocab_size, info["max_context"])}
    else:
        prompts = {
            name: load_prompts(args, entries, vocab_size, info["max_context"])
            for name, entries in workloads.items()
        }
    # Its own random ids (a prompt it shared would reach the server's cache warm), no longer than any prompt.
    shortest = min(len(p) for ps in prompts.values() for p in ps)
    [warmup] = random_prompts(vocab_size, shortest, (WARMUP_PROMPT_LEN,), WARMUP_SEED)
    return prompts, warmup, info


def run(args) -> dict:
    model, workloads, generation = open_target(args, args.quick)
    with (
        drafter_url(args, model) as (url, target_costs, connect),
        DraftClient(url, args.api_key, timeout_s=DRAFT_TIMEOUT_S) as client,
    ):
        prompts, warmup, info = prepare(args, client, model, workloads)
        total = sum(map(len, prompts.values())) * (1 + len(args.num_draft_tokens) * len(args.source))
        results = []
        with tqdm(total=total, desc="acceptance", unit="decode", file=sys.stderr) as bar:
            for workload, workload_prompts in prompts.items():
                bar.set_postfix(workload=workload)
                for row in measure_workload(args, model, connect, workload_prompts, warmup, bar):
                    results.append({"workload": workload, **row})
    return {
        "results": results,
        "summary": summarize(results),
        "lossless": all(r["lossless"] for r in results),
        "config": {
            "target": str(args.target),
            "url": url if args.url else f"started by --{'testbed' if args.testbed else 'realpair'}",
            "pair": args.pair and str(args.pair),
            "quick": args.quick,
            "num_draft_tokens": args.num_draft_tokens,
            "sources": args.source,
            "max_new_tokens": args.max_new_tokens,
            "stop_at_eos": args.stop_at_eos,
            "generation": generation,
            "device": args.device,
            "dtype": args.dtype,
            "num_prompts": {workload: len(p) for workload, p in prompts.items()},
            "target_costs_told_to_server": target_costs,
            "drafter": {
                key: info.get(key) for key in ("model", "quantization", "weight_scales", "device", "dtype")
            },
            "gpu_models": [gpu.as_dict() for gpu in args.gpus],
            "versions": {name: metadata.version(name) for name in ("torch", "transformers")},
        },
        "machine": describe(args.device),
    }


def main(argv=None) -> int:
    args = parse_args(argv, __doc__.split("\n\n")[0])
    try:
        report = run(args)
    except ValueError as error:  # a URL the client cannot use
        print(f"acceptance: error: {error}", file=sys.stderr)
        return 2
    except DraftRequestError as error:
        print(f"acceptance: error: {ServerRefused.from_client(error)}", file=sys.stderr)
        return 2
    except (BenchError, OSError) as error:
        print(f"acceptance: error: {error}", file=sys.stderr)
        return 2
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    if args.out:
        write_outputs(report, args.out)
    print_summary(report)
    return 0 if report["lossless"] else 1


if __name__ == "__main__":
    sys.exit(main())
