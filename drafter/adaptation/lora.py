"""Low-rank adapters (LoRA) on the decoder linears of a transformers Qwen3 / Qwen2, merged into full weights
for every version: the trainer's alternative to fine-tuning all weights (drafter/adaptation/trainer.py).

Each of the seven linears of a layer gets `y = base(x) + (x Aᵀ) Bᵀ · alpha / rank`, A [rank, in] drawn small,
B [out, rank] zero, so training starts exactly at the base weights. Only A and B train: their gradients and
AdamW moments are rank × (in + out) per linear instead of in × out, and backward computes no gradient for a
base weight. A version is the base weights with `B A · alpha / rank` added (`merged_tensors`), which the
engine serves like any other weights.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from engine.model.fp8 import LINEAR_NAMES


class LoraLinear(nn.Module):
    def __init__(self, base: nn.Linear, rank: int, alpha: float, generator: torch.Generator):
        super().__init__()
        self.base, self.scale = base.requires_grad_(False), alpha / rank
        weight = base.weight
        a = torch.randn(rank, base.in_features, generator=generator) / base.in_features**0.5
        self.lora_a = nn.Parameter(a.to(weight.device, weight.dtype))  # [rank, in]
        self.lora_b = nn.Parameter(
            torch.zeros(base.out_features, rank, device=weight.device, dtype=weight.dtype)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., in] -> [..., out]
        return self.base(x) + (x @ self.lora_a.t()) @ self.lora_b.t() * self.scale

    def merged_weight(self) -> torch.Tensor:  # [out, in]
        return self.base.weight + (self.lora_b @ self.lora_a) * self.scale


def add_adapters(model: nn.Module, rank: int, alpha: float, seed: int = 0) -> list[nn.Parameter]:
    """Freeze `model` and put an adapter on every decoder linear; the adapters' parameters."""
    model.requires_grad_(False)
    generator = torch.Generator().manual_seed(seed)
    trained = []
    for layer in model.model.layers:
        for name in LINEAR_NAMES:
            parent_name, attribute = name.split(".")
            parent = getattr(layer, parent_name)
            adapter = LoraLinear(getattr(parent, attribute), rank, alpha, generator)
            setattr(parent, attribute, adapter)
            trained += [adapter.lora_a, adapter.lora_b]
    return trained


def merged_tensors(model: nn.Module, trained_only: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """`model`'s weights with every adapter merged in, under transformers' own names (copies, on the CPU),
    one tensor at a time; `trained_only`: the merged weights alone (every other tensor is frozen)."""
    for name, module in model.named_modules():
        if isinstance(module, LoraLinear):
            yield f"{name}.weight", module.merged_weight().detach().cpu()
            if module.base.bias is not None and not trained_only:
                yield f"{name}.bias", module.base.bias.detach().cpu().clone()
    if trained_only:
        return
    for name, tensor in model.state_dict().items():
        if ".lora_" in name or ".base." in name:
            continue
        yield name, tensor.detach().to("cpu", copy=True)
