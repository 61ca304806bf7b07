"""Our engine against the oracle: transformers' Qwen3ForCausalLM on the same weights, fp32 on CPU."""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.engine import Engine
from tests.oracle import HF_CONFIGS, fresh_forward, hf_greedy

CONTEXT_LENGTHS = [1, 2, 7, 64, 333]


def engine_for(directory, **overrides) -> Engine:
    config = dict(max_seq_len=1024, max_batch_size=4, prefill_chunk=512, min_kv_bucket=64)
    return Engine.load(str(directory), EngineConfig(**(config | overrides)))


def our_logits(engine: Engine, tokens: list[int]) -> torch.Tensor:
    """[len(tokens), vocab] logits of one full forward pass over fresh pages."""
    return engine.model.logits(fresh_forward(engine, tokens))[0]


@pytest.mark.parametrize("name", list(HF_CONFIGS))
def test_engine_logits_match_transformers(hf_checkpoint, name):
    model, directory = hf_checkpoint(name)
    engine = engine_for(directory)
    tokens = torch.randint(
        0, model.config.vocab_size, (200,), generator=torch.Generator().manual_seed(1)
    ).tolist()
    with torch.no_grad():
        expected = model(torch.tensor([tokens])).logits[0]
    torch.testing.assert_close(our_logits(engine, tokens), expected, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("name", list(HF_CONFIGS))
def test_engine_draft_equals_transformers_generate(hf_checkpoint, name):
    model, directory = hf_checkpoint(name)
    engine = engine_for(directory)
    generator = torch.Generator().manual_seed(2)
    for n in CONTEXT_LENGTHS:
        tokens = torch.randint(0, model.config.vocab_size, (n,), generator=generator).tolist()
        ours = engine.draft(tokens, 12)
        assert ours == hf_greedy(model, tokens, 12), f"context length {n}"
        assert len(set(ours)) > 1 or n == 1, "degenerate drafts prove nothing; widen the init"


def test_engine_chunked_prefill_equals_transformers(hf_checkpoint):
    model, directory = hf_checkpoint("gqa4-tied-odd")
    engine = engine_for(directory, prefill_chunk=32)
    tokens = torch.randint(
        0, model.config.vocab_size, (700,), generator=torch.Generator().manual_seed(3)
    ).tolist()
    calls = []
    engine.model.register_forward_pre_hook(lambda module, args: calls.append(tuple(args[0].shape)))
    assert engine.draft(tokens, 8) == hf_greedy(model, tokens, 8)
    prefill_calls = [shape for shape in calls if shape[1] > 1]
    assert len(prefill_calls) == -(-699 // 32), "a 700-token context takes ceil(699 / 32) chunks"


def test_engine_decode_steps_feed_one_token_each(hf_checkpoint):
    """The KV cache is really used: after the prefill, each draft token costs one position, not the context."""
    _, directory = hf_checkpoint()
    engine = engine_for(directory)
    seen = []
    engine.model.register_forward_pre_hook(lambda module, args: seen.append(args[1].tolist()))
    engine.draft(list(range(100)), 6)
    prefill, *steps = seen
    assert prefill == [list(range(99))]
    assert steps == [[[99 + i]] for i in range(6)]


def test_engine_float32_and_bfloat16_both_serve(hf_checkpoint):
    model, directory = hf_checkpoint()
    engine = engine_for(directory, dtype="bfloat16")
    assert engine.model.model.embed_tokens.weight.dtype == torch.bfloat16
    draft = engine.draft(list(range(50)), 8)
    assert len(draft) == 8 and all(0 <= t < model.config.vocab_size for t in draft)
