"""FP8 drafts never depend on batch companions or padding: a request drafted alone and among 7 random
companions gets the same tokens, in both quantization modes (fp32 activations on CPU). fp8-dynamic scales
each activation row by itself (engine/model/fp8.py); one amax over the batch would fail this."""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.engine import Engine
from engine.requests import DraftRequest
from tests.export_helpers import MODES

CONFIG = dict(max_seq_len=256, max_batch_size=8, max_draft_tokens=8, min_kv_bucket=128)


def alone_and_among_companions(served: Engine, seed: int) -> tuple[list[list[int]], list[list[int]]]:
    generator = torch.Generator().manual_seed(seed)
    vocab = served.loaded.config.vocab_size

    def random_request(max_len: int) -> DraftRequest:
        n = int(torch.randint(1, max_len, (1,), generator=generator))
        return DraftRequest(torch.randint(0, vocab, (n,), generator=generator).tolist(), 8)

    probes = [random_request(200) for _ in range(3)]
    alone = []
    for probe in probes:
        served.reset_cache()
        alone.append(served.draft_batch([probe])[0].tokens)
    among = []
    for probe in probes:
        served.reset_cache()
        # Companions with contexts far longer and shorter, so prefill pads and chunking differ too.
        batch = [random_request(240) for _ in range(7)]
        batch.insert(int(torch.randint(0, 8, (1,), generator=generator)), probe)
        among.append(
            next(r.tokens for r, q in zip(served.draft_batch(batch), batch, strict=True) if q is probe)
        )
    return alone, among


@pytest.mark.parametrize("mode", MODES)
def test_fp8_drafts_alone_equal_drafts_among_companions(exported, mode, one_thread):
    directory, _ = exported[mode]
    served = Engine.load(str(directory), EngineConfig(**CONFIG))
    alone, among = alone_and_among_companions(served, seed=11)
    assert alone == among


@pytest.mark.slow
def test_compiled_fp8_drafts_alone_equal_drafts_among_companions_and_eager(exported):
    """Compiled: the probe alone runs in the 1-row bucket, with companions in the 8-row bucket."""
    for mode in MODES:
        directory, _ = exported[mode]
        config = EngineConfig(**CONFIG, batch_buckets=(1, 8), compile=True, kv_cache_tokens=8192)
        compiled = Engine.load(str(directory), config)
        assert compiled.warmup()["fallbacks"] == []
        alone, among = alone_and_among_companions(compiled, seed=12)
        assert alone == among
        eager = Engine.load(str(directory), EngineConfig(**CONFIG))
        assert alone_and_among_companions(eager, seed=12)[0] == alone
