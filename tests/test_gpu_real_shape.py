"""CUDA, real shape: Qwen3-0.6B's shape (the `qwen3-0.6b-random` preset) exported to FP8 in both modes,
served compiled and graph-captured as in production, against the same checkpoint served eagerly.

Marked `gpu`: skipped without CUDA. bf16 kernels of different shapes (a graph's padded bucket, another
batch size, another attention kernel) may round differently and flip a near-tie argmax, so agreement is
asserted as a rate and printed (pytest -s shows it); quantization itself never depends on the batch.
"""

from __future__ import annotations

import time

import pytest
import torch

from engine.config import EngineConfig
from engine.engine import Engine
from engine.requests import DraftRequest

pytestmark = pytest.mark.gpu

VOCAB = 151936
SIZES = dict(device="cuda", dtype="bfloat16", max_seq_len=2048, max_batch_size=4, batch_buckets=(1, 4))
SIZES |= dict(draft_length_tiers=(4, 16), kv_cache_gb=2.0)
MIN_AGREEMENT = 0.95  # of draft tokens; each disagreement is a bf16 near-tie, printed


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    from export.__main__ import run_export

    root = tmp_path_factory.mktemp("real-shape")
    directories = {}
    for mode in ("weight-only", "dynamic"):
        run_export("qwen3-0.6b-random", root / mode, mode)
        directories[mode] = str(root / mode)
    return directories


def served(directory: str, graphed: bool, **overrides) -> Engine:
    engine = Engine.load(
        directory, EngineConfig(**SIZES | dict(compile=graphed, cuda_graphs=graphed) | overrides)
    )
    report = engine.warmup()
    assert report["fallbacks"] == [], report
    return engine


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    pairs = [(x, y) for row_a, row_b in zip(a, b, strict=True) for x, y in zip(row_a, row_b, strict=True)]
    return sum(x == y for x, y in pairs) / len(pairs)


def conversation_drafts(engine: Engine, seed: int, rounds: int = 12) -> list[list[int]]:
    """One growing conversation: fully accepted rounds (and some rejected), crossing 64-position pages."""
    generator = torch.Generator().manual_seed(seed)
    context = torch.randint(0, VOCAB, (100,), generator=generator).tolist()
    drafts_seen = []
    for round_ in range(rounds):
        k = (4, 16, 7, 1)[round_ % 4]
        drafts = engine.draft(context, k, session=f"conv-{seed}")
        drafts_seen.append(drafts)
        accepted = k if round_ % 3 else int(torch.randint(0, k + 1, (1,), generator=generator))
        context = context + drafts[:accepted] + [int(torch.randint(0, VOCAB, (1,), generator=generator))]
    return drafts_seen


@pytest.mark.parametrize("mode", ["weight-only", "dynamic"])
def test_real_shape_fp8_graphed_drafts_agree_with_eager_over_growing_conversations(exports, mode):
    graphed, eager = served(exports[mode], True), served(exports[mode], False)
    rate = agreement(
        [d for seed in range(3) for d in conversation_drafts(graphed, seed)],
        [d for seed in range(3) for d in conversation_drafts(eager, seed)],
    )
    print(f"{mode}: graphed vs eager draft agreement {rate:.4f}")
    assert rate >= MIN_AGREEMENT
    assert graphed.recompiles.count == 0
    assert graphed.stats.tokens_prefilled < eager.stats.tokens_prefilled  # the step ahead at work


def test_real_shape_padded_batch_agrees_with_each_request_alone(exports):
    engine = served(exports["dynamic"], True)
    generator = torch.Generator().manual_seed(7)
    requests = [
        DraftRequest(torch.randint(0, VOCAB, (n,), generator=generator).tolist(), 16) for n in (90, 700, 1500)
    ]
    together = [r.tokens for r in engine.draft_batch(requests)]  # 3 rows in the 4-row bucket: one padded
    alone = []
    for request in requests:
        engine.reset_cache()
        alone.append(engine.draft_batch([request])[0].tokens)
    rate = agreement(together, alone)
    print(f"padded batch of 3 vs alone: agreement {rate:.4f}")
    assert rate >= MIN_AGREEMENT and engine.recompiles.count == 0


def test_real_shape_flex_and_sdpa_draft_alike(exports):
    flex = served(exports["weight-only"], True, attention="flex")
    sdpa = served(exports["weight-only"], True, attention="sdpa")
    rate = agreement(conversation_drafts(flex, 11), conversation_drafts(sdpa, 11))
    print(f"flex vs sdpa: agreement {rate:.4f}")
    assert rate >= MIN_AGREEMENT
    assert flex.recompiles.count == 0 and sdpa.recompiles.count == 0


def replay_ms(engine: Engine) -> float:
    steps = engine.decode_steps(16)
    engine.reset_buffers(engine.buffers[1])
    times = []
    for _ in range(30):
        torch.cuda.synchronize()
        start = time.perf_counter()
        engine.graphs.replay(1, engine.spans[0], steps)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1e3


def test_decode_step_time_does_not_grow_with_the_pool(exports):
    """A silent whole-pool copy or scan (e.g. of the block mask) would scale with the pool's size."""
    small = served(exports["weight-only"], True, attention="flex", kv_cache_gb=1.0)
    small_ms = replay_ms(small)
    del small
    large = served(exports["weight-only"], True, attention="flex", kv_cache_gb=32.0)
    large_ms = replay_ms(large)
    print(f"graph replay: {small_ms:.3f} ms with a 1 GB pool, {large_ms:.3f} ms with 32 GB")
    assert large_ms < 1.3 * small_ms


def test_memory_at_maximum_batch_and_context_stays_within_pool_weights_and_graphs(exports):
    sizes = dict(max_seq_len=32768, kv_cache_gb=16.0, attention="flex")
    engine = served(exports["weight-only"], True, **sizes)
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    generator = torch.Generator().manual_seed(3)
    requests = [
        DraftRequest(torch.randint(0, VOCAB, (32768 - 16,), generator=generator).tolist(), 16)
        for _ in range(4)
    ]
    results = engine.draft_batch(requests)
    assert all(len(r.tokens) == 16 for r in results)
    transient = torch.cuda.max_memory_allocated() - base
    print(f"transient memory of 4 x 32k prefill + decode: {transient / 2**30:.2f} GiB")
    assert transient < 4 * 2**30  # chunked prefill bounds activations whatever the context
