"""Linears for decoding on the CPU near the memory-bandwidth floor.

A decode step multiplies one row per conversation by every weight matrix, so it is memory-bound: its speed
is how fast the weights stream from memory, on every core. Measured on this project's 2-core Intel Xeon
(AVX-512 and AMX, bench/README.md), rows = 1, bf16: torch's `F.linear` reads 8-16 GB/s, while oneDNN with
its weight prepacked into its blocked layout (`torch.ops.mkldnn`, what inductor's CPU freezing uses) reads
28-36 GB/s, 1.4-2.5x faster at every shape, prefill's 512 rows included. In fp32 on that Intel CPU, MKL
(behind `F.linear`) already reads at the floor: the packed kernel loses on the decoder's small matrices
(19 vs 10 us) and made the whole bench-cpu decode 2-3% slower, though it halves the lm_head at a batch of 8.
On AMD EPYC the lm_head's fp32 matrix-vector product in MKL was measured on one core (1 and 2 threads timed
the same), where oneDNN's kernels thread on any x86 (not measured here: no AMD machine was at hand). So:

- bfloat16 (where oneDNN supports it): every linear, the lm_head included, is packed;
- float32: the lm_head is packed on CPUs that are not Intel's; everything else stays `F.linear`;
- FP8 weight-only checkpoints: the weight is dequantized once, here, exactly as `FP8Linear.forward` does on
  every call (fp8 → fp32 × scale → compute dtype), then treated as above. The CPU has no fp8 matmul that
  beats that: upcasting each weight on every call made FP8 2x slower than fp32;
- FP8 dynamic checkpoints: the same product as `_scaled_mm` (fp8 × fp8, fp32 accumulation, both scales
  after), as an fp32 matmul of the fp8 values (exact in fp32) then the scales: torch's CPU `_scaled_mm`
  made a bench-cpu call 6-8x slower than bf16.

The engine uses these in eager mode only: inductor cannot lower an opaque oneDNN weight passed as a graph
input, and compiled CPU code is no faster here (bench/README.md). The packed copy replaces the module's weight; a tied lm_head gets its own copy (the embedding keeps the
plain table for its row lookups), so each step still reads every weight byte once.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from engine.fp8 import FP8DynamicLinear, FP8Linear, quantize_per_row


class CpuLinear(nn.Module):
    """y = x @ weightᵀ (+ bias) with a weight fixed at load: oneDNN-packed, or a plain dense tensor."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, packed: bool):
        super().__init__()
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.packed = packed
        # An opaque oneDNN tensor, not a parameter: state dicts and .to() never see it.
        self.weight_ = torch.ops.mkldnn._reorder_linear_weight(weight, 1) if packed else weight
        self.bias = bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight_, self.bias, "none", [], "")
        return F.linear(x, self.weight_, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed={self.packed}"


class CpuDynamicFP8Linear(nn.Module):
    """`FP8DynamicLinear`'s product (engine/fp8.py) on the CPU: each row quantized to fp8 with its own
    scale, multiplied by the fp8 weight with fp32 accumulation, then scaled; in fp32 kernels."""

    def __init__(self, linear: FP8DynamicLinear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight_ = linear.weight.detach().to(torch.float32)  # fp8 values, exact in fp32
        self.weight_scale = linear.weight_scale.detach()
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_q, x_scale = quantize_per_row(x.reshape(-1, self.in_features))  # [tokens, in], [tokens, 1]
        out = (F.linear(x_q.to(torch.float32), self.weight_) * (x_scale * self.weight_scale)).to(x.dtype)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)


def bf16_packing_supported() -> bool:
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


@functools.cache
def intel_cpu() -> bool:
    """MKL's own vendor: its fp32 kernels take their fast, threaded paths there."""
    try:
        with open("/proc/cpuinfo") as info:
            return any(line.startswith("vendor_id") and "GenuineIntel" in line for line in info)
    except OSError:
        return False


def pack_fp32_lm_head() -> bool:
    return not intel_cpu()


def use_cpu_linears(model: nn.Module, dtype: torch.dtype) -> int:
    """Swap `model`'s linears (on the CPU, weights in `dtype`) for CpuLinears; returns how many were packed."""
    if not torch.backends.mkldnn.is_available():
        return 0
    pack_all = dtype == torch.bfloat16 and bf16_packing_supported()
    lm_head = getattr(model, "lm_head", None)
    pack_lm_head = pack_all or (dtype == torch.float32 and pack_fp32_lm_head())
    packed = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, FP8DynamicLinear):
                setattr(parent, name, CpuDynamicFP8Linear(child))
                continue
            pack = pack_all or (pack_lm_head and child is lm_head)
            if isinstance(child, FP8Linear):
                weight = child.dequantized_weight(dtype)
            elif isinstance(child, nn.Linear) and pack:
                weight = child.weight.detach()
            else:
                continue  # a plain linear that stays plain keeps its module
            bias = None if child.bias is None else child.bias.detach().to(dtype)
            setattr(parent, name, CpuLinear(weight.to(dtype), bias, pack))
            packed += pack
    return packed
