"""CUDA-only paths: the captured k-step loop replays the eager loop exactly, without host syncs.

Marked `gpu`: skipped on machines without CUDA (conftest), run on a GPU host with `pytest -m gpu`.
"""

from __future__ import annotations

import threading

import pytest
import torch

from engine.config import EngineConfig
from engine.engine import Engine
from engine.requests import DraftRequest

pytestmark = pytest.mark.gpu

BUCKETS = (1, 2, 4, 8)


def cuda_engine(**overrides) -> Engine:
    config = (
        dict(
            device="cuda",
            dtype="float32",
            max_seq_len=2048,
            max_batch_size=8,
            batch_buckets=BUCKETS,
            min_kv_bucket=256,
        )
        | overrides
    )
    return Engine.load("tiny", EngineConfig(**config))


def requests_for(batch: int, seed: int) -> list[DraftRequest]:
    generator = torch.Generator().manual_seed(seed)
    return [
        DraftRequest(torch.randint(0, 1024, (int(n),), generator=generator).tolist(), int(k))
        for n, k in zip(
            torch.randint(1, 1500, (batch,), generator=generator),
            torch.randint(1, 17, (batch,), generator=generator),
            strict=True,
        )
    ]


@pytest.fixture(scope="module")
def pair():
    graphed = cuda_engine(cuda_graphs=True)
    report = graphed.warmup()
    assert report["state"] == "ready" and report["fallbacks"] == [], report
    return graphed, cuda_engine()


@pytest.mark.parametrize("batch", [1, 2, 3, 4, 5, 8])  # 3 and 5 run padded in the 4 and 8 buckets
def test_graph_replay_equals_eager_for_every_bucket(pair, batch):
    graphed, eager = pair
    requests = requests_for(batch, seed=batch)
    assert [r.tokens for r in graphed.draft_batch(requests)] == [
        r.tokens for r in eager.draft_batch(requests)
    ]


def test_graphs_cover_every_bucket_and_span(pair):
    graphed, _ = pair
    captured = graphed.lifecycle.captured
    assert captured["batch_buckets"] == list(BUCKETS)
    assert captured["draft_length_tiers"] == [4, 8, 16]
    assert captured["num_graphs"] == len(BUCKETS) * len(graphed.config.kv_buckets) * 3


def test_graph_replay_has_no_host_sync(pair):
    graphed, _ = pair
    buffers = graphed.buffers[4]
    buffers.fill([1, 2, 3], [10, 20, 30], [[0], [0], [0]])  # three rows on the scratch page
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        graphed.graphs.replay(4, graphed.config.kv_buckets[0], graphed.decode_steps(16))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


def test_graphs_captured_on_one_thread_replay_alike_on_another(pair):
    """The server loads and captures on its engine thread, and may draft a lone short request on the event
    loop's thread (drafter/scheduling/inline.py): a replay from another thread must draft the same."""
    _, eager = pair
    built: list[Engine] = []

    def build() -> None:
        engine = cuda_engine(cuda_graphs=True, batch_buckets=(1, 2))
        engine.warmup()
        built.append(engine)

    worker = threading.Thread(target=build)
    worker.start()
    worker.join()
    [graphed] = built
    assert graphed.graphs is not None and graphed.lifecycle.fallbacks == [], graphed.lifecycle.fallbacks
    for seed in (31, 32):
        requests = requests_for(1, seed=seed)
        assert [r.tokens for r in graphed.draft_batch(requests)] == [
            r.tokens for r in eager.draft_batch(requests)
        ]


@pytest.mark.parametrize("attention", ["flex", "sdpa"])  # flex: the CUDA default, the production path
def test_compiled_graphs_equal_eager_in_bfloat16(attention):
    graphed = cuda_engine(
        dtype="bfloat16",
        compile=True,
        cuda_graphs=True,
        max_seq_len=1024,
        batch_buckets=(1, 4),
        attention=attention,
    )
    report = graphed.warmup()
    # compiled and captured, not fallen back to eager (which would draft alike, only slower)
    assert report["fallbacks"] == [] and graphed.graphs is not None and graphed.static_shapes, report
    eager = cuda_engine(dtype="bfloat16", max_seq_len=1024, attention=attention)
    requests = [DraftRequest(list(range(1, 300)), 16), DraftRequest([5] * 40, 8), DraftRequest([7], 16)]
    ours = [r.tokens for r in graphed.draft_batch(requests)]
    reference = [r.tokens for r in eager.draft_batch(requests)]
    agree = sum(a == b for x, y in zip(ours, reference, strict=True) for a, b in zip(x, y, strict=True))
    assert agree >= 0.9 * sum(len(x) for x in ours), "bf16 kernels differ slightly; drafts must still agree"


def test_prefill_runs_on_the_memory_efficient_sdpa_kernel():
    """A masked GQA call would take the math kernel (fp32 scores over every key); keys expanded to the query
    heads let the memory-efficient kernel run it: restricted to that kernel, prefill must still run."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    served = cuda_engine(dtype="bfloat16")
    context = list(range(1, 700))
    expected = served.draft(context, 4)
    served.reset_cache()
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
        assert served.draft(context, 4) == expected


@pytest.mark.parametrize("source", ["plain", "fp8-dynamic"])
def test_qwen2_compiled_graphs_equal_eager_in_bfloat16(hf_checkpoint, tmp_path, source):
    """The Qwen2 family on the production path (bf16, FlexAttention, torch.compile, CUDA graphs): q/k/v biases
    and no q/k norm inside the captured graphs, from a plain checkpoint and from its fp8-dynamic export (the
    bias added to `_scaled_mm`'s product; sm89+, else served weight-only, which the report says)."""
    from export.__main__ import run_export

    _, directory = hf_checkpoint("qwen2-gqa2-tied")  # every size a multiple of 16: cuBLAS fp8 runs it
    if source != "plain":
        run_export(str(directory), tmp_path / "fp8", "dynamic")
        directory = tmp_path / "fp8"
    config = dict(device="cuda", dtype="bfloat16", max_seq_len=1024, max_batch_size=4, batch_buckets=(1, 4))
    config |= dict(attention="flex")
    graphed = Engine.load(str(directory), EngineConfig(**config, compile=True, cuda_graphs=True))
    report = graphed.warmup()
    assert not [f for f in report["fallbacks"] if "torch.compile" in f or "CUDA graph" in f], report
    assert graphed.graphs is not None and graphed.static_shapes, report
    eager = Engine.load(str(directory), EngineConfig(**config))
    requests = [DraftRequest(list(range(1, 300)), 16), DraftRequest([5] * 40, 8), DraftRequest([7], 16)]
    ours = [r.tokens for r in graphed.draft_batch(requests)]
    reference = [r.tokens for r in eager.draft_batch(requests)]
    agree = sum(a == b for x, y in zip(ours, reference, strict=True) for a, b in zip(x, y, strict=True))
    assert agree >= 0.9 * sum(len(x) for x in ours), "bf16 kernels differ slightly; drafts must still agree"
