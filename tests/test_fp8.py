"""FP8 linears of the engine: the math of both forwards, the state-dict contract the loader checks,
what `config.json` quantization configs are accepted, and that the forwards compile with fullgraph."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from engine.model.errors import LoadError
from engine.model.fp8 import (
    FP8_DTYPE,
    FP8DynamicLinear,
    FP8Linear,
    FP8Scheme,
    quantization_from_config,
    quantize_per_row,
    servable_quantization,
    swap_fp8_linears,
)
from engine.model.presets import PRESETS
from engine.model.qwen3 import Qwen3
from export.checkpoint import quantization_config


def make_linear(
    cls, in_features=64, out_features=48, seed=0, bias=False, dtype=torch.float32, weight_scales="tensor"
):
    """An FP8 linear of a random weight quantized with `weight_scales` ("channel": each row's amax differs,
    so a scale applied to the wrong axis shows)."""
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(out_features, in_features, generator=generator) * 0.3
    amax = weight.abs().amax().reshape(1) if weight_scales == "tensor" else weight.abs().amax(1, keepdim=True)
    scale = amax / 448  # [1] or [out, 1]
    linear = cls(in_features, out_features, bias, weight_scales=weight_scales)
    linear.weight.data = (weight / scale).clamp(-448, 448).to(FP8_DTYPE)
    linear.weight_scale.copy_(scale)
    if bias:  # Qwen2's q/k/v: a bias in the activation dtype beside the fp8 weight, as the loader casts it
        linear.bias.data = torch.randn(out_features, generator=generator).to(dtype)
    return linear, weight


@pytest.mark.parametrize("weight_scales", ["tensor", "channel"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_weight_only_matches_dequantized_matmul(dtype, bias, weight_scales):
    linear, weight = make_linear(FP8Linear, bias=bias, dtype=dtype, weight_scales=weight_scales)
    x = torch.randn(2, 3, 64, dtype=dtype)
    expected = F.linear(x, (linear.weight.float() * linear.weight_scale).to(dtype), linear.bias)
    torch.testing.assert_close(linear(x), expected, rtol=0, atol=0)
    # each row scaled by its own scale: the dequantized weight is the original within fp8's rounding
    torch.testing.assert_close(linear.dequantized_weight(torch.float32), weight, rtol=2**-4, atol=1e-3)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_weight_only_multiply_reduce_is_the_matmuls_product(dtype, bias):
    """What compiled CUDA decode steps run (engine/model/fp8.py): the same product, only summed in another order."""
    linear, _ = make_linear(FP8Linear, bias=bias, dtype=dtype)
    x = torch.randn(2, 3, 64, dtype=dtype)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(linear.multiply_reduce(x), linear(x), rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("weight_scales", ["tensor", "channel"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(64, 48), (200, 24)])  # odd sizes too: CPU _scaled_mm takes them
def test_fp8_dynamic_matches_emulated_scaled_mm(shape, bias, weight_scales):
    linear, weight = make_linear(FP8DynamicLinear, *shape, bias=bias, weight_scales=weight_scales)
    x = torch.randn(5, shape[0])
    x_q, x_scale = quantize_per_row(x)
    emulated = F.linear(x_q.float() * x_scale, linear.weight.float() * linear.weight_scale, linear.bias)
    torch.testing.assert_close(linear(x), emulated, rtol=1e-5, atol=1e-5)
    # and within FP8 error (weights and activations, ~3% each) of the unquantized product
    exact = F.linear(x, weight, linear.bias)
    assert (linear(x) - exact).norm() / exact.norm() < 0.08


def test_fp8_activation_quantization_is_per_row_and_safe_on_zeros():
    x = torch.randn(4, 32) * torch.tensor([[0.01], [1.0], [7.0], [300.0]])
    x_q, scale = quantize_per_row(x)
    assert x_q.dtype == FP8_DTYPE and scale.shape == (4, 1) and scale.dtype == torch.float32
    assert torch.equal(x_q.float().abs().amax(dim=1), torch.full((4,), 448.0))  # each row uses the range
    alone, _ = quantize_per_row(x[1:2])
    assert torch.equal(alone.float(), x_q[1:2].float())  # a row's bytes do not depend on the others
    zero_q, _ = quantize_per_row(torch.zeros(3, 8))
    assert torch.equal(zero_q.float(), torch.zeros(3, 8))


@pytest.mark.parametrize("weight_scales", ["tensor", "channel"])
@pytest.mark.parametrize("family", ["qwen3", "qwen2"])
@pytest.mark.parametrize("quantization", ["fp8-weight-only", "fp8-dynamic"])
def test_fp8_swap_declares_the_checkpoint_layout(quantization, family, weight_scales):
    config = dataclasses.replace(PRESETS["tiny"], family=family)
    with torch.device("meta"):
        model = Qwen3(config)
    swap_fp8_linears(model, quantization, weight_scales)
    state = model.state_dict()
    linears = [n for n in state if n.endswith("_proj.weight")]
    assert len(linears) == 7 * config.num_hidden_layers
    for name in linears:
        assert state[name].dtype == FP8_DTYPE and state[name].is_meta
        scale = state[name.replace(".weight", ".weight_scale")]
        out_features = state[name].shape[0]
        assert scale.dtype == torch.float32
        assert scale.shape == ((1,) if weight_scales == "tensor" else (out_features, 1))  # compressed-tensors
    others = [n for n in state if not n.endswith(("_proj.weight", "_scale"))]
    assert all(state[n].dtype != FP8_DTYPE for n in others)
    assert state["model.layers.0.self_attn.k_proj.weight"].shape == (32, 64)  # [out, in]
    biases = {n for n in state if n.endswith(".bias")}  # Qwen2's q/k/v keep theirs
    assert biases == {
        f"model.layers.{n}.self_attn.{x}_proj.bias"
        for n in range(config.num_hidden_layers)
        for x in ("qkv" if family == "qwen2" else "")
    }
    for name in biases:  # not fp8: the loader casts it to the model's dtype
        assert state[name].dtype != FP8_DTYPE
        assert state[name].shape == state[name.replace(".bias", ".weight")].shape[:1]


def test_fp8_swap_refuses_unknown_kind():
    with torch.device("meta"):
        model = Qwen3(PRESETS["tiny"])
    with pytest.raises(LoadError, match="unknown quantization 'int4'"):
        swap_fp8_linears(model, "int4")
    with pytest.raises(LoadError, match="unknown weight scales 'group'"):
        swap_fp8_linears(model, "fp8-dynamic", "group")


@pytest.mark.parametrize("weight_scales", ["tensor", "channel"])
@pytest.mark.parametrize("mode", ["weight-only", "dynamic"])
def test_fp8_config_schemes_from_our_export(mode, weight_scales):
    scheme = quantization_from_config(quantization_config(mode, weight_scales))
    assert scheme == FP8Scheme(f"fp8-{mode}", weight_scales)


def mixed_scales() -> dict:
    """A second group with per-channel weights beside a per-tensor one."""
    group = quantization_config("weight-only", "channel")["config_groups"]["group_0"]
    return group | {"targets": ["Linear"]}


def edited(mode, edit):
    config = quantization_config(mode)
    edit(config, config["config_groups"]["group_0"])
    return config


@pytest.mark.parametrize(
    "config, message",
    [
        ({"quant_method": "gptq", "bits": 4}, "quant_method 'gptq'"),
        (edited("weight-only", lambda c, g: c.update(format="pack-quantized")), "format 'pack-quantized'"),
        (edited("weight-only", lambda c, g: g["weights"].update(type="int")), "type='int'"),
        (edited("weight-only", lambda c, g: g["weights"].update(strategy="group")), "strategy='group'"),
        (edited("dynamic", lambda c, g: g["weights"].update(strategy="block")), "strategy='block'"),
        (edited("weight-only", lambda c, g: g["weights"].update(num_bits=4)), "num_bits=4"),
        (edited("dynamic", lambda c, g: g["input_activations"].update(dynamic=False)), "dynamic=False"),
        (edited("dynamic", lambda c, g: g["input_activations"].update(strategy="token")), "strategy='token'"),
        (edited("weight-only", lambda c, g: c.update(config_groups={})), "no config_groups"),
        (edited("weight-only", lambda c, g: g.update(input_activations="fp8")), "is a str"),
        (edited("weight-only", lambda c, g: g.update(targets=["Embedding"])), "targets"),
        (edited("weight-only", lambda c, g: c["config_groups"].update(group_1=mixed_scales())), "mixes per-"),
    ],
)
def test_fp8_config_refuses_what_it_cannot_run(config, message):
    with pytest.raises(LoadError, match=message):
        quantization_from_config(config)


@pytest.mark.parametrize("weight_scales", ["tensor", "channel"])
def test_fp8_forwards_compile_fullgraph(weight_scales):
    torch._dynamo.reset()
    weight_only, _ = make_linear(FP8Linear, 64, 64, seed=1, weight_scales=weight_scales)
    dynamic, _ = make_linear(FP8DynamicLinear, 64, 64, seed=2, weight_scales=weight_scales)

    def both(x):
        return dynamic(weight_only(x))

    x = torch.randn(1, 3, 64)
    compiled = torch.compile(both, fullgraph=True, dynamic=False)
    torch.testing.assert_close(compiled(x), both(x), rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("weight_scales", ["tensor", "channel"])
@pytest.mark.parametrize("cls", [FP8Linear, FP8DynamicLinear])
def test_fp8_forward_has_no_host_sync_and_captures_into_a_cuda_graph(cls, weight_scales):
    linear, _ = make_linear(cls, 256, 128, weight_scales=weight_scales)
    linear = linear.cuda()
    x = torch.randn(4, 256, device="cuda", dtype=torch.bfloat16)
    torch.cuda.set_sync_debug_mode("error")
    try:
        expected = linear(x)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        linear(x)  # warm up off the default stream before capture
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph):
        out = linear(x)
    graph.replay()
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@pytest.mark.parametrize(
    "capability, served",
    [
        ((8, 0), "fp8-weight-only"),
        ((8, 6), "fp8-weight-only"),
        ((8, 9), "fp8-dynamic"),
        ((9, 0), "fp8-dynamic"),
    ],
)
def test_fp8_dynamic_below_sm89_serves_weight_only_and_says_why(monkeypatch, capability, served):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    quantization, why = servable_quantization("fp8-dynamic", "cuda")
    assert quantization == served
    assert (why is None) == (served == "fp8-dynamic")
    if why:
        assert f"sm{capability[0]}{capability[1]}" in why and "weight-only" in why
    assert servable_quantization("fp8-weight-only", "cuda") == ("fp8-weight-only", None)
    assert servable_quantization("fp8-dynamic", "cpu") == ("fp8-dynamic", None)  # _scaled_mm runs on CPU
