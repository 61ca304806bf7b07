"""Quantize the decoder linears of a transformers Qwen3 or Qwen2 in place with torchao's float8 weight-only
config, with one scale per tensor (`PerTensor`) or one per output channel, i.e. weight row (`PerRow`).

Only the seven linears of each decoder layer are quantized (`self_attn.{q,k,v,o}_proj`,
`mlp.{gate,up,down}_proj`); embeddings, norms and lm_head are left alone, by an explicit filter and by
walking the decoder layers only. The weight quantization is the same in both modes: torchao's
`Float8DynamicActivationFloat8WeightConfig` refuses to run on machines without CUDA sm89+, and its weights
are those of `Float8WeightOnlyConfig` with the same granularity, so that config quantizes the weights and
the mode only decides the activation scheme written to `config.json`. Per-channel scales keep a row of
small weights out of fp8's subnormals when another row of the same linear holds an outlier (fp8 being a
float, only rows about 1000x or more below the largest lose precision to a shared scale).
"""

from __future__ import annotations

import logging

import torch
from torch import nn
from tqdm import tqdm

logging.getLogger("torchao").setLevel(logging.ERROR)  # its CUDA-only extensions do not load on CPU

from torchao.quantization import (  # noqa: E402
    Float8Tensor,
    Float8WeightOnlyConfig,
    PerRow,
    PerTensor,
    quantize_,
)

LINEAR_NAMES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
LINEAR_NAMES += ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
MODES = ("weight-only", "dynamic")
WEIGHT_SCALES = ("tensor", "channel")  # compressed-tensors' names of the weight strategies


def is_decoder_linear(module: nn.Module, fqn: str) -> bool:
    """torchao filter: a linear whose name, relative to a decoder layer, is one of the seven."""
    return isinstance(module, nn.Linear) and fqn in LINEAR_NAMES


def weight_config(weight_scales: str = "tensor") -> Float8WeightOnlyConfig:
    granularity = PerTensor() if weight_scales == "tensor" else PerRow()  # PerRow: a scale per output row
    return Float8WeightOnlyConfig(weight_dtype=torch.float8_e4m3fn, granularity=granularity)


def relative_error(original: torch.Tensor, approx: torch.Tensor) -> float:
    original, approx = original.float(), approx.float()
    return ((original - approx).norm() / original.norm().clamp(min=1e-30)).item()


def quantize_layers(model, weight_scales: str = "tensor", show_progress: bool = True) -> dict[str, float]:
    """Quantize every decoder linear of `model` (a Qwen3ForCausalLM or Qwen2ForCausalLM) in place with one
    scale per tensor or per channel (`weight_scales`); return each linear's relative weight error
    ‖W − fp8×scale‖ / ‖W‖ by full parameter name."""
    if weight_scales not in WEIGHT_SCALES:
        raise ValueError(f"unknown weight scales {weight_scales!r}; expected one of {WEIGHT_SCALES}")
    errors = {}
    layers = model.model.layers
    for index, layer in enumerate(tqdm(layers, desc="quantizing", unit="layer", disable=not show_progress)):
        originals = {name: layer.get_submodule(name).weight.detach().clone() for name in LINEAR_NAMES}
        quantize_(layer, weight_config(weight_scales), filter_fn=is_decoder_linear)
        for name, original in originals.items():
            weight = layer.get_submodule(name).weight
            if scales_of(weight) != weight_scales:
                raise RuntimeError(
                    f"torchao quantized {name} per {scales_of(weight)}, not per {weight_scales}"
                )
            errors[f"model.layers.{index}.{name}"] = relative_error(
                original, weight.dequantize(torch.float32)
            )
    return errors


def quantize_weight(weight: torch.Tensor, weight_scales: str = "tensor") -> tuple[torch.Tensor, torch.Tensor]:
    """One decoder linear's weight ([out, in], bf16 as the export reads its source) quantized by the same
    torchao config as `quantize_layers`: its fp8 bytes and float32 scale ([1], or [out, 1] per channel).
    For weights that are not in a transformers model (online adaptation's versions, export/versions.py)."""
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False, dtype=weight.dtype)
    linear.weight = nn.Parameter(weight.detach().clone(), requires_grad=False)
    quantize_(linear, weight_config(weight_scales))
    return fp8_parts(linear.weight)


def scales_of(weight: Float8Tensor) -> str:
    """The grain of a torchao float8 weight's scales, "tensor" or "channel", from the block each one covers."""
    out_features, in_features = weight.qdata.shape
    if list(weight.block_size) == [out_features, in_features]:
        return "tensor"
    if list(weight.block_size) == [1, in_features]:
        return "channel"
    raise ValueError(f"a float8 weight scaled per block of {list(weight.block_size)}, neither tensor nor row")


def fp8_parts(weight) -> tuple[torch.Tensor, torch.Tensor]:
    """A quantized weight's fp8 bytes ([out, in]) and its scale as float32 in compressed-tensors' shape for
    its grain: [1] per tensor, [out, 1] per channel."""
    if not isinstance(weight, Float8Tensor):
        raise TypeError(f"expected a torchao Float8Tensor, got {type(weight).__name__}")
    shape = (1,) if scales_of(weight) == "tensor" else (weight.qdata.shape[0], 1)
    return weight.qdata.contiguous(), weight.scale.reshape(shape).to(torch.float32)


def quantized_names(model) -> list[str]:
    return [f"model.layers.{i}.{name}" for i in range(len(model.model.layers)) for name in LINEAR_NAMES]
