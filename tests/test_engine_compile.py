"""torch.compile of the decode step (CPU), and warmup as an observable, fail-soft phase."""

from __future__ import annotations

import pytest
import torch

import engine.compile
from engine.config import ConfigError, EngineConfig
from engine.engine import Engine
from engine.lifecycle import State
from engine.requests import DraftRequest
from tests.oracle import hf_greedy

# Two batch buckets and two attention spans (256, 496): a few graphs, so the cold compile stays near a minute.
SMALL = dict(max_seq_len=480, max_batch_size=2, batch_buckets=(1, 2), min_kv_bucket=256)


@pytest.mark.slow
def test_compiled_step_equals_eager_and_transformers_without_recompiles(hf_checkpoint):
    model, directory = hf_checkpoint("gqa2-untied")
    compiled = Engine.load(str(directory), EngineConfig(**SMALL, compile=True))
    eager = Engine.load(str(directory), EngineConfig(**SMALL))
    report = compiled.warmup()
    assert report["state"] == "ready" and report["fallbacks"] == []
    assert "compiling" in report["stage_seconds"]
    generator = torch.Generator().manual_seed(5)
    torch._dynamo.config.error_on_recompile = True
    try:
        for n in (1, 9, 224, 300, 460):
            a = torch.randint(0, 512, (n,), generator=generator).tolist()
            b = torch.randint(0, 512, (n // 2 + 1,), generator=generator).tolist()
            assert compiled.draft(a, 16) == eager.draft(a, 16) == hf_greedy(model, a, 16)
            pair = compiled.draft_batch([DraftRequest(a, 3), DraftRequest(b, 16)])
            assert [r.tokens for r in pair] == [eager.draft(a, 3), eager.draft(b, 16)]
        assert compiled.recompiles.count == 0
    finally:
        torch._dynamo.config.error_on_recompile = False


def test_warmup_without_compile_goes_straight_to_ready():
    engine = Engine.load("tiny", EngineConfig())
    assert engine.lifecycle.state is State.LOADING
    report = engine.warmup()
    assert report["state"] == "ready"
    assert set(report["stage_seconds"]) == {"loading"}
    assert engine.lifecycle.ready


def test_warmup_falls_back_to_eager_when_compile_fails(monkeypatch):
    def broken(step, num_shapes, **options):
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(engine.compile, "compiled", broken)
    served = Engine.load("tiny", EngineConfig(compile=True))
    report = served.warmup()
    assert report["state"] == "ready"
    assert report["fallbacks"] and "torch.compile failed" in report["fallbacks"][0]
    assert served.draft([1, 2, 3], 4) == Engine.load("tiny", EngineConfig()).draft([1, 2, 3], 4)


def test_warmup_that_cannot_run_reports_failed_with_the_reason(monkeypatch):
    served = Engine.load("tiny", EngineConfig())

    def broken():
        raise RuntimeError("device lost")

    monkeypatch.setattr(served, "run_warmup_draft", broken)
    with pytest.raises(RuntimeError):
        served.warmup()
    assert served.lifecycle.state is State.FAILED
    assert "device lost" in served.lifecycle.snapshot()["reason"]


def test_cuda_graphs_need_a_cuda_device():
    with pytest.raises(ConfigError, match="CUDA"):
        EngineConfig(device="cpu", cuda_graphs=True)


def test_buckets_and_spans_cover_every_request():
    config = EngineConfig(max_seq_len=1000, max_batch_size=6, batch_buckets=(1, 2, 4, 8))
    assert config.buckets == (1, 2, 4, 6)
    assert config.kv_buckets == (256, 512, 1016) and config.cache_len == 1016


def test_recompile_guard_counts_only_its_own_engines_loops():
    """Dynamo's callbacks are process-wide and every engine's step is `greedy_step`: a second engine
    compiling on the same thread is not a recompile of the first. Traced with dynamo's eager backend
    (the guard sees dynamo's compiles whatever the backend), so it takes seconds."""
    config = EngineConfig(
        max_seq_len=200, max_batch_size=1, batch_buckets=(1,), max_draft_tokens=4, compile=True
    )
    first, second = Engine.load("tiny", config), Engine.load("tiny", config)
    first.compile(backend="eager")
    first.recompiles.arm()
    second.compile(backend="eager")  # new cache entries for the same code, on this thread
    second.recompiles.arm()
    second.run_warmup_draft()
    assert (first.recompiles.count, second.recompiles.count) == (0, 0)
    buffers = first.buffers[1]
    first.reset_buffers(buffers)
    span = first.spans[0]  # a one-row view where warmup passed none: a real recompile, of the first only
    first.run_decode(buffers, 2, span, view=slice(0, span))
    assert (first.recompiles.count, second.recompiles.count) == (1, 0)
    first.recompiles.disarm()
    second.recompiles.disarm()


@pytest.mark.slow
def test_compiled_qwen2_step_equals_transformers_without_recompiles(hf_checkpoint):
    """The Qwen2 family compiled (q/k/v biases, no q/k norm inside the graph); one bucket and one span keep
    the cold compile short."""
    model, directory = hf_checkpoint("qwen2-gqa2-tied")
    # Dynamo's cache of the one compiled step is process-wide: earlier tests' Qwen3 engines (q/k norms where
    # Qwen2 has none) already fill it toward the recompile limit. A server process serves one model.
    torch._dynamo.reset()
    config = EngineConfig(
        max_seq_len=200, max_batch_size=1, batch_buckets=(1,), min_kv_bucket=256, compile=True
    )
    compiled = Engine.load(str(directory), config)
    report = compiled.warmup()
    assert report["state"] == "ready" and report["fallbacks"] == [], report
    generator = torch.Generator().manual_seed(6)
    torch._dynamo.config.error_on_recompile = True
    try:
        for n in (1, 37, 180):
            context = torch.randint(0, 512, (n,), generator=generator).tolist()
            assert compiled.draft(context, 16) == hf_greedy(model, context, 16)
        assert compiled.recompiles.count == 0
    finally:
        torch._dynamo.config.error_on_recompile = False
