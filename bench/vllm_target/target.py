"""A vLLM target on the CPU, driven over stdin/stdout: one offline `LLM` engine per process, with speculation
off, drafter as its `custom_class` proposer, or one of vLLM's own methods. Run it with the vLLM venv's
Python (bench/vllm_target/install.sh makes one); bench/vllm_target/driver.py starts and drives it, by this
file's path (so it imports nothing of bench/), for the tests and bench/vllm_target/peers.py.

    .venv-vllm/bin/python bench/vllm_target/target.py --model DIR --speculation drafter --drafter-url URL --k 8

It prints `VLLM_TARGET {"ready": ...}` once the engine is up, then answers each JSON line on stdin,
`{"prompts": [[ids], ...], "max_tokens": [n, ...]}`, with one `VLLM_TARGET {...}` line: the outputs' token
ids, the seconds `generate` took, the change in vLLM's speculative-decoding counters and (drafter) in the
proposer's own counters. Greedy, no tokenizer. EOS is ignored, so every run generates exactly max_tokens,
unless the line names `"stop_token_ids": [ids]`: then a row ends at the first of them (a chat model's end of
turn) or at max_tokens.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

MARK = "VLLM_TARGET "
SPECULATIONS = ("none", "drafter", "draft_model", "ngram")
PROPOSER = "drafter.integrations.vllm_proposer.DrafterProposer"
SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts": "num_drafts",
    "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
    "vllm:generation_tokens": "num_generated_tokens",
}


def speculative_config(args) -> dict | None:
    if args.speculation == "none":
        return None
    config = {"num_speculative_tokens": args.k}
    if args.speculation == "drafter":
        return {**config, "method": "custom_class", "model": PROPOSER}
    if args.speculation == "draft_model":
        return {**config, "method": "draft_model", "model": args.draft_model}
    return {**config, "method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 5}


def counters(llm) -> dict:
    """vLLM's speculative counters (summed over engines) and acceptance per draft position."""
    values = dict.fromkeys(SPEC_COUNTERS.values(), 0)
    values["accepted_per_position"] = []
    for metric in llm.get_metrics():
        if metric.name in SPEC_COUNTERS:
            values[SPEC_COUNTERS[metric.name]] += metric.value
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            values["accepted_per_position"] = list(metric.values)
    return values


def difference(after: dict, before: dict) -> dict:
    change = {name: after[name] - before[name] for name in SPEC_COUNTERS.values()}
    after_per_position = after["accepted_per_position"]
    before_per_position = before["accepted_per_position"] or [0] * len(after_per_position)
    change["accepted_per_position"] = [
        a - b for a, b in zip(after_per_position, before_per_position, strict=True)
    ]
    return change


def proposer_counters(path: str | None) -> dict:
    """The proposer's counters (drafter/integrations/vllm_proposer.py writes them every step); none yet
    before its first step."""
    try:
        with open(path) as file:
            return json.load(file)
    except (TypeError, FileNotFoundError):
        return {"num_steps": 0, "propose_s": 0.0, "num_calls": 0, "num_draft_tokens": 0, "skipped": {}}


def proposer_difference(after: dict, before: dict) -> dict:
    change = {name: after[name] - before[name] for name in after if name != "skipped"}
    skipped = {reason: n - before["skipped"].get(reason, 0) for reason, n in after["skipped"].items()}
    change["skipped"] = {reason: n for reason, n in skipped.items() if n}
    return change


def stopping(command: dict) -> dict:
    """SamplingParams' stop settings for a command: its stop tokens, or none at all (not even the checkpoint's
    EOS, which vLLM reads from generation_config.json by itself)."""
    if command.get("stop_token_ids"):
        return {"stop_token_ids": command["stop_token_ids"]}
    return {"ignore_eos": True}


def say(message: dict) -> None:
    print(MARK + json.dumps(message), flush=True)


def serve(args) -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    started = time.perf_counter()
    drafter = {"url": args.drafter_url, "timeout_s": args.drafter_timeout_s}
    if args.stats_path:
        drafter["stats_path"] = args.stats_path
    if args.num_draft_tokens:
        drafter["num_draft_tokens"] = args.num_draft_tokens
    llm = LLM(
        model=args.model,
        skip_tokenizer_init=True,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        # On the CPU this is the share of the machine's memory the worker may hold, weights included: a
        # target of a few GB overdraws 0.1 and vLLM refuses to start, unless the KV cache's size is given.
        gpu_memory_utilization=0.1,
        kv_cache_memory_bytes=int(args.kv_cache_gb * 2**30) if args.kv_cache_gb else None,
        max_num_batched_tokens=args.max_num_batched_tokens,
        enforce_eager=args.enforce_eager,
        speculative_config=speculative_config(args),
        additional_config={"drafter": drafter} if args.speculation == "drafter" else {},
        disable_log_stats=False,  # get_metrics() reads the counters the stats loggers keep
        seed=0,
    )
    say({"ready": True, "startup_s": time.perf_counter() - started, "speculation": args.speculation})
    for line in sys.stdin:
        if not line.strip():
            continue
        command = json.loads(line)
        prompts = [TokensPrompt(prompt_token_ids=ids) for ids in command["prompts"]]
        params = [
            SamplingParams(max_tokens=n, temperature=0.0, detokenize=False, **stopping(command))
            for n in command["max_tokens"]
        ]
        before, proposer_before = counters(llm), proposer_counters(args.stats_path)
        started = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - started
        answer = {
            "outputs": [list(output.outputs[0].token_ids) for output in outputs],
            "seconds": seconds,
            "spec": difference(counters(llm), before),
        }
        if args.stats_path:
            answer["proposer"] = proposer_difference(proposer_counters(args.stats_path), proposer_before)
        say(answer)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True, help="the target: an HF directory")
    parser.add_argument("--speculation", choices=SPECULATIONS, default="none")
    parser.add_argument("--k", type=int, default=8, help="num_speculative_tokens")
    parser.add_argument(
        "--drafter-url", default="http://127.0.0.1:8000", help="--speculation drafter's server"
    )
    parser.add_argument(
        "--drafter-timeout-s", type=float, default=0.5, help="the most a step waits for drafts"
    )
    parser.add_argument("--stats-path", help="--speculation drafter: where the proposer writes its counters")
    parser.add_argument(
        "--num-draft-tokens", help="--speculation drafter: \"auto\" for the server's k [vLLM's --k]"
    )
    parser.add_argument("--draft-model", help="--speculation draft_model: the drafter's HF directory")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument(
        "--kv-cache-gb", type=float, help="the KV cache's size [vLLM's: from the memory share]"
    )
    parser.add_argument(
        "--max-num-batched-tokens",
        type=int,
        help="tokens one step may hold (prompts beyond it prefill in chunks); vLLM's start runs a step this "
        "size, which on a CPU takes a 1.5B target a minute at the default [vLLM's: 4096]",
    )
    parser.add_argument(
        "--enforce-eager",
        action="store_true",
        help="no torch.compile: the engine starts minutes sooner; a large target's step barely notices",
    )
    args = parser.parse_args(argv)
    if args.speculation == "draft_model" and not args.draft_model:
        parser.error("--speculation draft_model needs --draft-model DIR")
    serve(args)


if __name__ == "__main__":  # vLLM starts its engine in processes of its own: this guard is required
    main()
