"""Quantize the decoder linears of a transformers Qwen3 or Qwen2 in place with torchao's float8 per-tensor
config.

Only the seven linears of each decoder layer are quantized (`self_attn.{q,k,v,o}_proj`,
`mlp.{gate,up,down}_proj`); embeddings, norms and lm_head are left alone, by an explicit filter and by
walking the decoder layers only. The weight quantization is the same in both modes: torchao's
`Float8DynamicActivationFloat8WeightConfig` refuses to run on machines without CUDA sm89+, and its weights
are those of `Float8WeightOnlyConfig` with the same granularity, so that config quantizes the weights and
the mode only decides the activation scheme written to `config.json`.
"""

from __future__ import annotations

import logging

import torch
from torch import nn
from tqdm import tqdm

logging.getLogger("torchao").setLevel(logging.ERROR)  # its CUDA-only extensions do not load on CPU

from torchao.quantization import Float8Tensor, Float8WeightOnlyConfig, PerTensor, quantize_  # noqa: E402

LINEAR_NAMES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
LINEAR_NAMES += ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
MODES = ("weight-only", "dynamic")


def is_decoder_linear(module: nn.Module, fqn: str) -> bool:
    """torchao filter: a linear whose name, relative to a decoder layer, is one of the seven."""
    return isinstance(module, nn.Linear) and fqn in LINEAR_NAMES


def weight_config() -> Float8WeightOnlyConfig:
    return Float8WeightOnlyConfig(weight_dtype=torch.float8_e4m3fn, granularity=PerTensor())


def relative_error(original: torch.Tensor, approx: torch.Tensor) -> float:
    original, approx = original.float(), approx.float()
    return ((original - approx).norm() / original.norm().clamp(min=1e-30)).item()


def quantize_layers(model, show_progress: bool = True) -> dict[str, float]:
    """Quantize every decoder linear of `model` (a Qwen3ForCausalLM or Qwen2ForCausalLM) in place; return each linear's
    relative weight error ‖W − fp8×scale‖ / ‖W‖ by full parameter name."""
    errors = {}
    layers = model.model.layers
    for index, layer in enumerate(tqdm(layers, desc="quantizing", unit="layer", disable=not show_progress)):
        originals = {name: layer.get_submodule(name).weight.detach().clone() for name in LINEAR_NAMES}
        quantize_(layer, weight_config(), filter_fn=is_decoder_linear)
        for name, original in originals.items():
            weight = layer.get_submodule(name).weight
            qdata, scale = fp8_parts(weight)
            if scale.numel() != 1:
                raise RuntimeError(f"torchao returned a {list(scale.shape)} scale for {name}, not per-tensor")
            errors[f"model.layers.{index}.{name}"] = relative_error(
                original, weight.dequantize(torch.float32)
            )
    return errors


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoder linear's weight ([out, in], bf16 as the export reads its source) quantized by the same
    torchao config as `quantize_layers`: its fp8 bytes and float32 [1] scale. For weights that are not in a
    transformers model (online adaptation's versions, export/versions.py)."""
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False, dtype=weight.dtype)
    linear.weight = nn.Parameter(weight.detach().clone(), requires_grad=False)
    quantize_(linear, weight_config())
    return fp8_parts(linear.weight)


def fp8_parts(weight) -> tuple[torch.Tensor, torch.Tensor]:
    """A quantized weight's fp8 bytes ([out, in]) and its per-tensor scale as float32 [1]."""
    if not isinstance(weight, Float8Tensor):
        raise TypeError(f"expected a torchao Float8Tensor, got {type(weight).__name__}")
    return weight.qdata.contiguous(), weight.scale.reshape(1).to(torch.float32)


def quantized_names(model) -> list[str]:
    return [f"model.layers.{i}.{name}" for i in range(len(model.model.layers)) for name in LINEAR_NAMES]
