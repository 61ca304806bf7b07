"""Linears for decoding on the CPU near the memory-bandwidth floor.

A decode step multiplies one row per conversation by every weight matrix, so it is memory-bound: its speed
is how fast the weights stream from memory, on every core. Candidates, measured on this project's 2-core
Intel Xeon (AVX-512, AVX512-BF16 and AMX; bench/README.md), one row unless said:

- bf16: torch's `F.linear` reads 8-16 GB/s; oneDNN with its weight prepacked into its blocked layout
  (`torch.ops.mkldnn`, what inductor's CPU freezing uses) reads 28-36 GB/s, 1.4-2.5x faster at every
  shape, prefill's 512 rows included (lm_head 151936 x 512: 9.7 -> 4.3 ms); `torch.mv` 5.0 ms; inductor
  with frozen weights 5.1 ms. oneDNN packed wins.
- fp32: MKL (behind `F.linear`) already threads and streams; oneDNN's packed kernel loses on the small
  matrices (19 vs 10 us) and ties on the lm_head; MKL's own packed GEMM (`torch.ops.mkl`, used only at the
  row count it was packed for, else the plain weight) ties on the small ones and takes the lm_head from
  11.4 to 9.4 ms, a bench-cpu decode 1.09x faster (1.00x on Qwen3-0.6B's shape, whose lm_head is a smaller
  share). On AMD EPYC, MKL's fp32 lm_head product was measured on one core (the issue that started this;
  no AMD machine was at hand here), where oneDNN's kernels thread on any x86.

So: bf16 (where oneDNN supports it) packs every linear with oneDNN; fp32 packs only the lm_head, with MKL
on Intel CPUs and oneDNN on others, the decoder's linears staying MKL's `F.linear`. The lm_head's packed
copy is extra memory (the tied embedding keeps its plain table for row lookups: +311 MB on bench-cpu in
fp32, +622 MB on Qwen3-0.6B); each step still reads every weight byte once.

- FP8 weight-only checkpoints, float32 compute: each linear keeps its one-byte weights and scale, read
  through engine/model/cpu_gemv.py's kernel, and the LM head the bf16 the export stored
  (engine/model/cpu_fp8.py). Where the kernel cannot be built (no compiler, no AVX2), and in bf16, the weight is dequantized once,
  here, exactly as `FP8Linear.forward` does on every call (fp8 → fp32 × scale → compute dtype), then
  treated as above: the CPU has no fp8 product in torch that beats that (upcasting each weight on every
  call made FP8 4.5x slower than bf16);
- FP8 dynamic checkpoints: the same product as `_scaled_mm` (fp8 × fp8, fp32 accumulation, both scales
  after: the row's activation scale and the weight's, per tensor or per output channel), as an fp32 matmul of the fp8 values (exact in fp32) then the scales: torch's CPU `_scaled_mm`
  made a bench-cpu call 5-8x slower than bf16.

The engine uses these in eager mode only: inductor cannot lower an opaque packed weight passed as a graph
input, and compiled CPU code is no faster here (bench/README.md).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from engine.model import cpu_gemv
from engine.model.cpu_fp8 import CpuBf16Head, CpuFP8Linear, PackedFP8Linear, hold_embedding_as_bf16
from engine.model.fp8 import FP8DynamicLinear, FP8Linear, quantize_per_row


class CpuLinear(nn.Module):
    """y = x @ weightᵀ (+ bias) with a weight fixed at load, computed by `kind`: "plain" (`F.linear`),
    "onednn" (oneDNN-packed) or "mkl" (MKL-packed for one row; other row counts use the plain weight)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, kind: str = "plain"):
        super().__init__()
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.kind = kind
        self.load(weight, bias)

    def load(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        """Take (and pack) `weight` [out, in] and `bias`."""
        self.install(self.pack(weight, bias))

    def pack(self, weight: torch.Tensor, bias: torch.Tensor | None) -> dict[str, torch.Tensor | None]:
        """What `forward` reads for `weight` and `bias`, made aside: at construction, and when the engine swaps
        its weights (engine/swap.py packs the new ones while the old still serve; eager only, so no compiled
        code holds the old tensors)."""
        # Packed weights are opaque tensors, not parameters: state dicts and .to() never see them.
        attributes = {"weight_": weight, "bias": bias}
        if self.kind == "onednn":
            attributes["weight_"] = torch.ops.mkldnn._reorder_linear_weight(weight, 1)
        elif self.kind == "mkl":
            attributes["packed"] = torch.ops.mkl._mkl_reorder_linear_weight(weight, 1)
        return attributes

    def install(self, attributes: dict[str, torch.Tensor | None]) -> None:
        for name, value in attributes.items():
            setattr(self, name, value)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "onednn":
            return torch.ops.mkldnn._linear_pointwise(x, self.weight_, self.bias, "none", [], "")
        if self.kind == "mkl":
            rows = x.reshape(-1, self.in_features)
            out = torch.ops.mkl._mkl_linear(rows, self.packed, self.weight_, self.bias, 1)
            return out.reshape(*x.shape[:-1], self.out_features)
        return F.linear(x, self.weight_, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, kind={self.kind}"


class CpuDynamicFP8Linear(PackedFP8Linear):
    """`FP8DynamicLinear`'s product (engine/model/fp8.py) on the CPU: each row quantized to fp8 with its own
    scale, multiplied by the fp8 weight with fp32 accumulation, then scaled; in fp32 kernels."""

    def pack(
        self, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None
    ) -> dict[str, torch.Tensor | None]:
        """What `forward` reads for an fp8 `weight` [out, in], its float32 scale and `bias`."""
        return {
            "weight_": weight.to(torch.float32),  # fp8 values, exact in fp32
            # [1, 1] per tensor or [1, out] per channel: it scales the columns of y either way
            "weight_scale": weight_scale.reshape(1, -1),
            "bias": None if bias is None else bias.detach(),  # a plain tensor, as CpuLinear's
        }

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


def fp32_lm_head_kind() -> str:
    return "mkl" if intel_cpu() else "onednn"


def use_cpu_linears(model: nn.Module, dtype: torch.dtype) -> tuple[int, str | None]:
    """Swap `model`'s linears (on the CPU, weights in `dtype`) for the CPU's decode linears. Returns how
    many were packed or read as stored, and why an FP8 model's weights are dequantized instead, if they are."""
    fp8_kernel, why_not = None, None
    if dtype == torch.float32 and any(type(m) is FP8Linear for m in model.modules()):
        fp8_kernel, why_not = cpu_gemv.available()
        if why_not:
            why_not = f"FP8 weights dequantized to float32 at load (4x the bytes a step reads): {why_not}"
    if fp8_kernel is not None:
        hold_embedding_as_bf16(model)
    if not torch.backends.mkldnn.is_available() and fp8_kernel is None:
        return 0, why_not
    pack_all = dtype == torch.bfloat16 and bf16_packing_supported()
    lm_head = getattr(model, "lm_head", None)
    packed = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, FP8DynamicLinear):
                setattr(parent, name, CpuDynamicFP8Linear(child))
                continue
            if fp8_kernel is not None and isinstance(child, FP8Linear):
                setattr(parent, name, CpuFP8Linear(child, fp8_kernel))
                packed += 1
                continue
            if fp8_kernel is not None and child is lm_head and child.weight.dtype == torch.bfloat16:
                setattr(parent, name, CpuBf16Head(child.weight.detach(), fp8_kernel))
                packed += 1
                continue
            kind = "onednn" if pack_all else "plain"
            if child is lm_head and dtype == torch.float32:
                kind = fp32_lm_head_kind()
            if isinstance(child, FP8Linear):
                weight = child.dequantized_weight(dtype)
            elif isinstance(child, nn.Linear) and kind != "plain":
                weight = child.weight.detach()
            else:
                continue  # a plain linear that stays plain keeps its module
            bias = None if child.bias is None else child.bias.detach().to(dtype)
            setattr(parent, name, CpuLinear(weight.to(dtype), bias, kind))
            packed += kind != "plain"
    return packed, why_not
