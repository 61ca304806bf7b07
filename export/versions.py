"""A weights version as a checkpoint: online adaptation's new weights (docs/adaptation.md) as the tensors an
engine serves in its mode, made by the export's own code, and the directory that holds them.

`served_tensors` is what `python -m export` would write for these weights: in an FP8 mode each decoder
linear's weight quantized from bf16 (the export reads its source in bf16) by `export.quantize`, and every
other tensor in bf16; unquantized, every tensor in the served dtype. The engine swaps exactly these tensors in
(`Engine.swap_weights`) and `write_version` saves exactly these, so a saved version reproduces the drafts its
weights made: `--model` serves it, and transformers (with compressed-tensors for FP8) loads it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine.model.fp8 import LINEAR_NAMES, dequantize

# export.checkpoint and export.quantize import torchao (0.7 s): only when a version is quantized or written,
# so a server that imports this (drafter/server/adapt_work.py) starts as fast without --adapt.

EXPORT_MODES = {"fp8-weight-only": "weight-only", "fp8-dynamic": "dynamic"}  # served mode -> export mode
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16"}
QUANTIZED_SUFFIXES = tuple(f".{name}.weight" for name in LINEAR_NAMES)


def served_tensors(
    state: dict[str, torch.Tensor],
    quantization: str,
    dtype: torch.dtype,
    tied: bool,
    weight_scales: str = "tensor",
) -> dict[str, torch.Tensor]:
    """`state` (transformers' names, any float dtype) as a checkpoint of the served mode holds it:
    `quantization` is the engine's ("none", "fp8-weight-only", "fp8-dynamic"), `dtype` the unquantized
    served dtype, `tied` whether lm_head is the embedding (then it is not stored), `weight_scales` the FP8
    scales' grain ("tensor" or "channel", as the served checkpoint's)."""
    return dict(served_items(state.items(), quantization, dtype, tied, weight_scales))


def served_items(
    items: Iterable[tuple[str, torch.Tensor]],
    quantization: str,
    dtype: torch.dtype,
    tied: bool,
    weight_scales: str = "tensor",
) -> Iterator[tuple[str, torch.Tensor]]:
    """`served_tensors` one tensor at a time, as `items` come (a weight, then its scale): a server makes a
    version in pieces, a request able to come between two (drafter/adaptation/cycle.py)."""
    if quantization != "none" and quantization not in EXPORT_MODES:
        raise ValueError(f"unknown quantization {quantization!r}")
    if quantization != "none":
        from export.quantize import quantize_weight

    for name, tensor in items:
        if tied and name == "lm_head.weight":
            continue
        tensor = tensor.detach().cpu()
        if quantization == "none":
            yield name, tensor.to(dtype).contiguous()
        elif name.startswith("model.layers.") and name.endswith(QUANTIZED_SUFFIXES):
            weight, scale = quantize_weight(tensor.to(torch.bfloat16), weight_scales)
            yield name, weight
            yield name + "_scale", scale
        else:
            yield name, tensor.to(torch.bfloat16).contiguous()


def version_config(
    hf_config: dict, quantization: str, dtype: torch.dtype, weight_scales: str = "tensor"
) -> dict:
    """The config.json of a version: the served model's HF config, with the served mode's
    quantization_config (none when unquantized) and the dtype its unquantized tensors are stored in."""
    from export.checkpoint import quantization_config

    config = {key: value for key, value in hf_config.items() if key != "quantization_config"}
    stored = dtype if quantization == "none" else torch.bfloat16
    for key in [k for k in ("dtype", "torch_dtype") if k in config] or ["torch_dtype"]:
        config[key] = DTYPE_NAMES[stored]
    if quantization != "none":
        config["quantization_config"] = quantization_config(EXPORT_MODES[quantization], weight_scales)
    return config


def write_version(directory: str | Path, tensors: dict[str, torch.Tensor], config: dict) -> Path:
    """Write a version's checkpoint (config.json, model.safetensors) into `directory`, replacing one there:
    staged beside it and renamed into place, so a reader never sees half of one."""
    from export.staging import staged_directory

    directory = Path(directory)
    with staged_directory(directory, force=True) as staging:
        (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        save_file(tensors, str(staging / "model.safetensors"), metadata={"format": "pt"})
    return directory


def dense_state(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A version's tensors as transformers' unquantized fp32 state: each fp8 weight times its scale, exactly
    as the engine and compressed-tensors dequantize it (what the trainer starts from and the scorer runs)."""
    return dict(dense_items(tensors))


def dense_items(tensors: dict[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
    """`dense_state` one tensor at a time."""
    for name, tensor in tensors.items():
        if name.endswith(".weight_scale"):
            continue
        scale = tensors.get(name + "_scale")
        yield name, tensor.float() if scale is None else dequantize(tensor, scale, torch.float32)
