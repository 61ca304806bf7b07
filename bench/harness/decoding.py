"""A transformers target decoding greedily, alone (the reference) and with drafts from a drafter server
(drafter/integrations/transformers_generate.py, through drafter.client), and the servers it drafts from:
--url's, or for a pair (the testbed's, the real one) servers started on its drafter, told the target's
measured verify time.
The decoding loop bench/acceptance.py measures, and bench/ahead.py and bench/suffix/oracle.py reuse.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from pathlib import Path

import torch

import drafter.integrations.target
from bench.harness.prompts import WARMUP_PROMPT_LEN, WARMUP_SEED, BenchError, random_prompts
from drafter.client import DraftClient, TransportError
from drafter.integrations.transformers_generate import SpeculationStats, speculative_decoding

# transformers imports torchao, whose CPU-only import chatter is not the user's concern.
for noisy in ("torchao", "torch.utils._pytree"):
    logging.getLogger(noisy).setLevel(logging.ERROR)

DRAFT_TIMEOUT_S = 60  # a benchmark waits for every draft; a target would not (drafter.client's policy)
PAIR_DRAFTERS = {  # a pair's drafters (the testbed's, the real pair's), by the name --drafter gives them
    "weight-only": "drafter-fp8-weight-only",
    "dynamic": "drafter-fp8-dynamic",
    "bf16": "drafter",
}


def server_info(client: DraftClient) -> dict:
    """/info once the server is ready; every failure becomes a BenchError naming the server."""
    try:
        ready = client.get("/health/ready", timeout_s=DRAFT_TIMEOUT_S)
        if ready.status != 200:
            raise BenchError(f"the drafter at {client.url} is not ready: {ready.content[:200]!r}")
        return client.info()
    except TransportError as error:
        raise BenchError(f"cannot reach the drafter at {client.url}: {error}") from None


@torch.inference_mode()
def target_greedy(model, prompt: list[int], max_new_tokens: int, stop_at_eos: bool = False) -> list[int]:
    """The reference: transformers' own greedy decoding, new tokens only."""
    return generate(model, prompt, max_new_tokens, stop_at_eos)


@torch.inference_mode()
def target_greedy_batch(model, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """`target_greedy` of every prompt (`max_new_tokens` each, no stop at EOS), all in one pass: on 2 AMD EPYC
    cores 16 prompts of the 1.5B target took 2.7x less time a prompt than one at a time (32 new tokens).
    Prompts are padded on the left, masked out; in fp32 an output equals its one-at-a-time greedy output but
    where two logits tie within rounding (tests/test_bench_adapt_sweep.py)."""
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=model.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device)
    out = model.generate(
        ids,
        attention_mask=mask,
        do_sample=False,
        max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens,
        pad_token_id=0,
    )
    return out[:, width:].tolist()


def speculative_greedy(
    model, client, prompt, max_new_tokens: int, stats: SpeculationStats, stop_at_eos: bool, source: str
):
    skipped = stats.num_skipped
    kwargs = dict(
        draft_client=client,
        num_draft_tokens=stats.num_draft_tokens,
        speculation_stats=stats,
        draft_source=source,
    )
    new = generate(model, prompt, max_new_tokens, stop_at_eos, custom_generate=speculative_decoding, **kwargs)
    if stats.num_skipped > skipped:
        raise BenchError(f"{stats.num_skipped - skipped} draft calls to {client.url} failed (see its log)")
    return new


def generate(model, prompt: list[int], max_new_tokens: int, stop_at_eos: bool, **kwargs) -> list[int]:
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        min_new_tokens=0 if stop_at_eos else max_new_tokens,
        **kwargs,
    )
    return out[0, len(prompt) :].tolist()


def load_target(directory: Path, device: str, dtype: str):
    try:
        return drafter.integrations.target.load_target(directory, device, dtype)
    except ValueError as error:
        raise BenchError(str(error)) from None


def timed(function, *args) -> tuple[list[int], float]:
    started = time.perf_counter()
    out = function(*args)
    return out, time.perf_counter() - started


def verify_ms_per_token(model, warmup: list[int], args) -> float:
    """The target's greedy decode, ms per token (after one untimed run): what `"auto"` weighs k against."""
    target_greedy(model, warmup, args.max_new_tokens, False)
    _, seconds = timed(target_greedy, model, warmup, args.max_new_tokens, False)
    return 1e3 * seconds / args.max_new_tokens


@torch.inference_mode()
def verify_ms_per_extra_token(model, prompt: list[int], k: int = 8, repeats: int = 3) -> float:
    """What each more token in the target's verify pass costs, in ms: the fastest of a few passes of k + 1
    tokens against one token, over the same cached prompt. ~0 where the pass is memory-bound (a GPU); on a
    CPU the tokens cost compute, and `"auto"` must know it (--target-verify-ms-per-token)."""
    from transformers import DynamicCache

    ids = torch.tensor([prompt], device=model.device)
    cache = DynamicCache(config=model.config)
    model(input_ids=ids[:, :-1], cache=cache, use_cache=True)  # the prompt less the tokens passed below

    def fastest_ms(num_tokens: int) -> float:
        times = []
        for _ in range(repeats):
            drop = cache.get_seq_length() - (len(prompt) - num_tokens)  # back to the prefix before them
            if drop > 0:
                cache.crop(-drop)
            started = time.perf_counter()
            model(input_ids=ids[:, -num_tokens:], cache=cache, use_cache=True, logits_to_keep=num_tokens)
            times.append(time.perf_counter() - started)
        return 1e3 * min(times)

    return max(fastest_ms(k + 1) - fastest_ms(1), 0.0) / k


def target_cost_flags(model, warmup: list[int], args) -> tuple[list[str], float, float]:
    """The server flags that tell `"auto"` the target's costs, measured here, and the two figures."""
    step_ms = verify_ms_per_token(model, warmup, args)
    token_ms = verify_ms_per_extra_token(model, warmup)
    flags = ["--target-verify-ms", f"{step_ms:.3f}", "--target-verify-ms-per-token", f"{token_ms:.3f}"]
    return flags, step_ms, token_ms


@contextlib.contextmanager
def started_server(flags: list[str]):
    """A drafter server with these flags, stopped after."""
    from bench.harness.server import ServerProcess

    server = ServerProcess(flags, timeout_s=300)
    try:
        url = server.wait_ready()
    except (RuntimeError, TimeoutError) as error:
        server.close()
        raise BenchError(f"the drafter server did not start: {error}") from None
    try:
        yield url
    finally:
        server.close()


def pair_server_flags(pair: Path, drafter: str, device: str, cost_flags: list[str]) -> list[str]:
    """A server's flags for a pair's drafter (a PAIR_DRAFTERS name), told the target's costs (`cost_flags`:
    target_cost_flags's, or a --target-verify-ms alone)."""
    model_dir = pair / PAIR_DRAFTERS[drafter]
    return ["--model", str(model_dir), "--device", device, *cost_flags]


@contextlib.contextmanager
def drafter_url(args, model):
    """The server to use, the verify time it was told, and `connect()`, a client for one run: --url's server,
    or for a pair (`args.pair`: --testbed's or --realpair's directory) servers on its drafter, a fresh one
    per run (see bench/acceptance.py's measure_workload)."""
    if args.url:
        yield args.url, None, lambda: DraftClient(args.url, args.api_key, timeout_s=DRAFT_TIMEOUT_S)
        return
    [warmup] = random_prompts(model.config.vocab_size, WARMUP_PROMPT_LEN, (WARMUP_PROMPT_LEN,), WARMUP_SEED)
    cost_flags, verify_ms, token_ms = target_cost_flags(model, warmup, args)
    flags = pair_server_flags(args.pair, args.drafter, args.device, cost_flags)
    print(
        f"drafter servers on {flags[1]} (target step {verify_ms:.2f} ms, {token_ms:.2f} ms per more token "
        "verified)",
        file=sys.stderr,
    )

    @contextlib.contextmanager
    def connect():
        with (
            started_server(flags) as url,
            DraftClient(url, args.api_key, timeout_s=DRAFT_TIMEOUT_S) as client,
        ):
            yield client

    with started_server(flags) as url:
        yield url, {"step_ms": verify_ms, "per_token_ms": token_ms}, connect
