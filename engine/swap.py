"""Swapping the served weights in place (online adaptation: docs/adaptation.md).

The new weights come as a checkpoint's tensors in the served layout (export/versions.py makes them with the
export's own quantization): they are checked and cast exactly as the loader checks and casts a checkpoint,
all of them before anything is written, then copied into the storage of the live parameters and buffers.
Compiled code and CUDA graphs hold those very tensors, so they stay valid and nothing recompiles. The CPU's
eager packed linears (engine/model/cpu_linears.py) hold derived copies instead (packed, dequantized); they
are rebuilt from the new weights the way loading builds them, which is safe because no compiled code runs
there. The KV cache is not this module's business: its keys and values are of the old weights, and the
engine drops them (`Engine.swap_weights`).
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import nn

from engine.model.cpu_linears import CpuDynamicFP8Linear, CpuLinear
from engine.model.fp8 import dequantize
from engine.model.loader import LoadedModel, build_empty, check_and_cast


def check_weights(
    loaded: LoadedModel, tensors: dict[str, torch.Tensor], dtype: torch.dtype, device
) -> dict[str, dict[str, torch.Tensor]]:
    """A checkpoint's `tensors` (the served layout) cast as the model holds them, by module; or LoadError if
    they do not fit the model (names, shapes, fp8 dtypes). Nothing is written."""
    # On the meta device: shapes and dtypes only (an FP8 scale per tensor or per channel, as loaded).
    expected = build_empty(loaded.config, loaded.quantization, loaded.weight_scales)
    by_module: dict[str, dict[str, torch.Tensor]] = defaultdict(dict)
    for name, tensor in check_and_cast(expected, dict(tensors), dtype, device).items():
        module, attribute = name.rsplit(".", 1)
        by_module[module][attribute] = tensor
    return by_module


def copy_in_place(
    loaded: LoadedModel, by_module: dict[str, dict[str, torch.Tensor]], dtype: torch.dtype
) -> None:
    """Copy checked tensors (`check_weights`) into `loaded.model`'s live weights."""
    model = loaded.model
    with torch.no_grad():
        for module, values in by_module.items():
            load_module(model.get_submodule(module), values, dtype)
        if loaded.config.tie_word_embeddings and isinstance(model.lm_head, CpuLinear):
            # A packed copy of the embedding: repack it from the new one.
            model.lm_head.load(model.model.embed_tokens.weight.detach(), None)


def load_module(module: nn.Module, values: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
    """One module's new tensors (`weight`, `weight_scale`, `bias`, ... as the checkpoint names them)."""
    if isinstance(module, CpuDynamicFP8Linear):
        module.load(values["weight"], values["weight_scale"], values.get("bias"))
    elif isinstance(module, CpuLinear):  # from an FP8Linear (a scale) or an nn.Linear (none)
        weight = values["weight"]
        if "weight_scale" in values:
            weight = dequantize(weight, values["weight_scale"], dtype)
        module.load(weight.to(dtype), values.get("bias"))
    else:
        for attribute, value in values.items():
            getattr(module, attribute).copy_(value)
