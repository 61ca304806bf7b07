"""The CPU's decode linears (engine/model/cpu_linears.py) compute what the modules they replace compute: plain and
packed, fp32 and bf16, one row to a prefill chunk, FP8 weight-only and dynamic; and the engine uses them."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from engine.config import EngineConfig
from engine.engine import Engine
from engine.model import cpu_gemv
from engine.model.cpu_fp8 import MAX_KERNEL_ROWS, CpuFP8Linear
from engine.model.cpu_linears import (
    CpuDynamicFP8Linear,
    CpuLinear,
    bf16_packing_supported,
    fp32_lm_head_kind,
    use_cpu_linears,
)
from engine.model.fp8 import FP8DynamicLinear, FP8Linear
from engine.model.loader import load_model
from tests.oracle import fresh_forward
from tests.test_fp8 import make_linear

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
DTYPES = [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
    not bf16_packing_supported(), reason="this CPU has no oneDNN bf16"))]  # fmt: skip


KINDS = [
    (torch.float32, "plain"), (torch.float32, "onednn"), (torch.float32, "mkl"), (torch.bfloat16, "plain"),
    pytest.param(torch.bfloat16, "onednn", marks=pytest.mark.skipif(
        not bf16_packing_supported(), reason="this CPU has no oneDNN bf16")),
]  # fmt: skip


@pytest.mark.parametrize(("dtype", "kind"), KINDS)
@pytest.mark.parametrize("rows", [1, 8, 300])  # MKL's packed weight serves one row; the rest the plain one
def test_cpu_linear_is_the_linear(dtype, kind, rows):
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 64, generator=generator).to(dtype)
    bias = torch.randn(96, generator=generator).to(dtype)
    x = torch.randn(2, rows, 64, generator=generator).to(dtype)
    linear = CpuLinear(weight, bias, kind)
    tolerance = TOLERANCE[dtype]
    torch.testing.assert_close(linear(x), F.linear(x, weight, bias), rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("weight_scales", ["tensor", "channel"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 9, MAX_KERNEL_ROWS + 1])  # float32: the kernel's passes, then a matmul
def test_fp8_weight_only_on_cpu_is_the_dequantized_product(dtype, bias, weight_scales, rows):
    fp8, _ = make_linear(FP8Linear, 64, 48, bias=bias, dtype=dtype, weight_scales=weight_scales)
    model = torch.nn.Sequential(copy.deepcopy(fp8))
    use_cpu_linears(model, dtype)
    # float32 reads the fp8 bytes as stored where this machine builds the kernel (tests/test_cpu_gemv.py)
    stored = dtype == torch.float32 and cpu_gemv.available()[0] is not None
    assert isinstance(model[0], CpuFP8Linear if stored else CpuLinear)
    x = torch.randn(rows, 64).to(dtype)
    tolerance = TOLERANCE[dtype]
    torch.testing.assert_close(model[0](x), fp8(x), rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("weight_scales", ["tensor", "channel"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(64, 48), (200, 24)])
def test_fp8_dynamic_on_cpu_is_scaled_mm_s_product(shape, bias, weight_scales):
    dynamic, _ = make_linear(FP8DynamicLinear, *shape, bias=bias, weight_scales=weight_scales)
    x = torch.randn(7, 3, shape[0])
    torch.testing.assert_close(CpuDynamicFP8Linear(dynamic)(x), dynamic(x), rtol=1e-5, atol=1e-5)


def test_engine_packs_every_linear_in_bf16_and_in_fp32_the_lm_head():
    fp32 = Engine.load("tiny", EngineConfig(max_seq_len=128, dtype="float32"))
    assert fp32.packed_linears == 1 and fp32.info()["cpu_packed_linears"] == 1
    assert fp32.model.lm_head.kind == fp32_lm_head_kind()
    assert isinstance(fp32.model.model.layers[0].mlp.up_proj, torch.nn.Linear)  # MKL's F.linear, as loaded
    if bf16_packing_supported():
        bf16 = Engine.load("tiny", EngineConfig(max_seq_len=128, dtype="bfloat16"))
        num_layers = len(bf16.model.model.layers)
        assert bf16.packed_linears == 7 * num_layers + 1  # q k v o gate up down, and the lm_head


@pytest.mark.parametrize("dtype", DTYPES)
def test_packing_leaves_the_model_s_logits_as_they_were(dtype):
    plain = load_model("tiny", dtype).model
    packed = copy.deepcopy(plain)
    use_cpu_linears(packed, dtype)
    hidden = torch.randn(3, plain.config.hidden_size).to(dtype)
    tolerance = 1e-4 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(packed.logits(hidden), plain.logits(hidden), rtol=tolerance, atol=tolerance)
    # a tied lm_head gets its own packed copy: the embedding keeps the plain table for row lookups
    assert packed.model.embed_tokens.weight.layout == torch.strided


@pytest.mark.parametrize("dtype", DTYPES)
def test_packed_qwen2_forward_is_the_unpacked_one(hf_checkpoint, monkeypatch, dtype, one_thread):
    """Qwen2's q/k/v carry biases into their packed linears: the whole forward, not only the lm_head, is
    the one the model computes as loaded."""
    _, directory = hf_checkpoint("qwen2-gqa2-tied")
    config = EngineConfig(max_seq_len=128, dtype="bfloat16" if dtype == torch.bfloat16 else "float32")
    packed = Engine.load(str(directory), config)
    assert packed.packed_linears == (7 * 2 + 1 if dtype == torch.bfloat16 else 1)
    assert packed.model.model.layers[0].self_attn.q_proj.bias.abs().sum() > 0
    monkeypatch.setattr("engine.engine.use_cpu_linears", lambda model, dtype: (0, None))
    plain = Engine.load(str(directory), config)
    assert isinstance(plain.model.model.layers[0].self_attn.q_proj, torch.nn.Linear)
    tokens = list(range(1, 60))
    ours, theirs = (e.model.logits(fresh_forward(e, tokens)[0]) for e in (packed, plain))
    tolerance = 1e-4 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(ours, theirs, rtol=tolerance, atol=tolerance)
    assert packed.draft(tokens, 8) == plain.draft(tokens, 8)
