"""CUDA: compiled FP8 weight-only linears read their fp8 weights in place at every decode batch size
(engine/model/fp8.py's multiply-reduce), instead of writing a bf16 copy of the weight each step."""

from __future__ import annotations

import pytest
import torch

from engine.model.fp8 import FP8_DTYPE, FP8Linear

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("weight_scales", ["tensor", "channel"])
@pytest.mark.parametrize("rows", [1, 2, 4, 8])
def test_compiled_fp8_weight_only_writes_no_bf16_weight_copy(rows, weight_scales):
    linear = FP8Linear(1024, 3072, device="cuda", weight_scales=weight_scales)  # Qwen3-0.6B's gate_proj
    linear.weight.data = (torch.randn(3072, 1024, device="cuda") * 100).clamp(-448, 448).to(FP8_DTYPE)
    linear.weight_scale.uniform_(0.005, 0.015)  # one value, or one per output row
    x = torch.randn(rows, 1, 1024, device="cuda", dtype=torch.bfloat16)
    compiled = torch.compile(linear, fullgraph=True)
    expected = linear(x)  # eager: the matmul on a dequantized copy
    torch.testing.assert_close(compiled(x), expected, rtol=2e-2, atol=2e-2)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    compiled(x)
    torch.cuda.synchronize()
    bf16_copy = 3072 * 1024 * 2
    assert torch.cuda.max_memory_allocated() - base < bf16_copy / 4
