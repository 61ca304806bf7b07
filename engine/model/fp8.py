"""FP8 linears for checkpoints written by `export/`: fp8 weights with float32 scales per tensor or per channel.

Each decoder linear keeps its weight as `float8_e4m3fn` `[out, in]` (1 byte a parameter, never a full-precision
copy) and its `weight_scale` as float32, `[1]` (one per tensor) or `[out, 1]` (one per output channel, i.e.
per weight row), real weight ≈ fp8 × scale, which are the compressed-tensors "float-quantized" layouts of
weight strategies "tensor" and "channel" that vLLM and SGLang read. Two forwards:
- weight-only: torchao's float8 weight-only math (upcast the fp8 weight, scale, matmul in the activation
  dtype), written as plain ops. Compiled on CUDA, a decode step's few rows (<= MAX_FUSED_ROWS: every batch
  bucket) are a multiply-and-reduce instead of a matmul, so inductor fuses the upcast into one kernel that
  reads each fp8 weight byte once, at every batch size. (Inductor turns a matmul into that fused form only
  when the batch is statically 1; buckets 2-8, made dynamic by automatic dynamic shapes, would write a
  bf16 copy of every weight each step: 2.2 GB instead of 0.44 GB for Qwen3-0.6B. We chose this over
  `_scaled_mm` for batch > 1, which would quantize activations and so change a weight-only model's math.)
  Eager and prefill (many rows) keep the matmul;
- dynamic: each activation row (one token) is quantized to fp8 on the fly with its own scale and multiplied
  with `torch._scaled_mm`'s row-wise kernel (it runs on CPU too, and on CUDA sm89+ in bf16). Per-row, not
  one amax over the tensor: a token's drafts must not depend on its batch companions, on padding rows or on
  how prefill chunked its context. The checkpoint declares dynamic per-tensor activations; dynamic scales
  are computed at run time, and a finer grain only rounds each row closer to its own values.
Both are pure tensor code: no `.item()`, no host syncs, so they compile with fullgraph and capture into CUDA
graphs. The loader calls `quantization_from_config` on `config.json` and `swap_fp8_linears` on the empty
(meta-device) model before it checks and assigns the checkpoint's tensors, so a `weight_scale` whose shape
is not the one the config's weight strategy declares is refused there.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from engine.model.errors import LoadError

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8_DTYPE).max  # 448
LINEAR_NAMES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
LINEAR_NAMES += ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
QUANTIZATIONS = ("fp8-weight-only", "fp8-dynamic")
WEIGHT_SCALES = ("tensor", "channel")  # compressed-tensors' weight strategies we serve
MAX_FUSED_ROWS = 8  # rows up to which compiled CUDA weight-only linears multiply-reduce (decode batches)
MIN_ACTIVATION_AMAX = 1e-12  # an all-zero activation gets a tiny scale instead of 0/0


class FP8Linear(nn.Module):
    """Weight-only FP8 linear: y = x @ (fp8 weight × scale)ᵀ (+ bias), computed in x's dtype. `weight_scales`
    is "tensor" (one scale) or "channel" (one per output row)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        device=None,
        weight_scales: str = "tensor",
    ):
        super().__init__()
        if weight_scales not in WEIGHT_SCALES:
            raise LoadError(f"unknown weight scales {weight_scales!r}; expected one of {WEIGHT_SCALES}")
        self.in_features, self.out_features, self.weight_scales = in_features, out_features, weight_scales
        weight = torch.empty(out_features, in_features, dtype=FP8_DTYPE, device=device)
        self.weight = nn.Parameter(weight, requires_grad=False)  # [out, in] float8_e4m3fn
        scale_shape = (1,) if weight_scales == "tensor" else (out_features, 1)
        self.register_buffer("weight_scale", torch.ones(scale_shape, dtype=torch.float32, device=device))
        self.bias = nn.Parameter(torch.empty(out_features, device=device)) if bias else None

    def dequantized_weight(self, dtype: torch.dtype) -> torch.Tensor:  # [out, in]
        return dequantize(self.weight, self.weight_scale, dtype)

    def scale_per_output(self) -> torch.Tensor:  # [1, out]
        """The weight's scale of each output column of y, as row-wise scaled matmuls take it (`scale_b`)."""
        return self.weight_scale.reshape(1, -1).expand(1, self.out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., in] -> [..., out]
        if x.is_cuda and torch.compiler.is_compiling() and x.numel() // self.in_features <= MAX_FUSED_ROWS:
            return self.multiply_reduce(x)
        return F.linear(x, self.dequantized_weight(x.dtype), self.bias)

    def multiply_reduce(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., in] -> [..., out]
        """The same product as `forward`'s matmul (the weight dequantized and rounded to x's dtype, fp32
        accumulation), as pointwise ops and a sum that inductor fuses into one weight-reading kernel."""
        rows = x.reshape(-1, 1, self.in_features).to(torch.float32)  # [rows, 1, in]
        weight = self.dequantized_weight(x.dtype).to(torch.float32)  # [out, in], fused: never materialized
        out = (rows * weight).sum(dim=-1).to(x.dtype)  # [rows, out]
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
            f"weight_scales={self.weight_scales}"
        )


class FP8DynamicLinear(FP8Linear):
    """FP8 linear with per-row dynamic activation quantization: fp8 × fp8 in `torch._scaled_mm`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., in] -> [..., out]
        x_q, x_scale = quantize_per_row(x.reshape(-1, self.in_features))  # [tokens, in], [tokens, 1]
        odd = self.in_features % 16 or self.out_features % 16
        if x.is_cuda and (odd or x.dtype != torch.bfloat16):
            # cuBLAS fp8 GEMMs need dimensions divisible by 16 and row-wise scaling a bf16 output; emulate
            # the same product otherwise (tests and odd shapes, never the bf16 Qwen3 shapes we serve).
            out = F.linear((x_q.to(torch.float32) * x_scale).to(x.dtype), self.dequantized_weight(x.dtype))
        else:
            out = torch._scaled_mm(
                x_q,
                self.weight.t(),  # [in, out], column-major as cuBLAS wants it
                scale_a=x_scale,
                scale_b=self.scale_per_output().contiguous(),
                out_dtype=x.dtype,
                use_fast_accum=True,
            )
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)


def dequantize(weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """fp8 `weight` [out, in] times its float32 scale ([1] per tensor or [out, 1] per channel: either
    broadcasts over the rows), in `dtype`: exactly torchao's _dequantize_affine_float8 (upcast to fp32,
    scale, cast to the compute dtype)."""
    return (weight.to(torch.float32) * scale).to(dtype)


def quantize_per_row(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [rows, in] as float8_e4m3fn with one float32 scale per row ([rows, 1]) so that x ≈ x_q × scale; all
    on the device, each row's scale from its own amax alone."""
    amax = x.abs().amax(dim=-1, keepdim=True).to(torch.float32).clamp(min=MIN_ACTIVATION_AMAX)
    scale = amax / FP8_MAX
    x_q = (x.to(torch.float32) / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return x_q, scale


def servable_quantization(quantization: str, device) -> tuple[str, str | None]:
    """The quantization this device serves a checkpoint with, and why, if not the one it declares:
    fp8-dynamic multiplies fp8 by fp8 in `torch._scaled_mm`, which CUDA runs on sm89+ only (Ada, Hopper and
    later; warmup would fail below). There the same fp8 weights serve weight-only (activations unquantized)."""
    device = torch.device(device)
    if quantization != "fp8-dynamic" or device.type != "cuda":
        return quantization, None
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) >= (8, 9):
        return quantization, None
    return "fp8-weight-only", (
        f"fp8-dynamic needs torch._scaled_mm's fp8 kernels (CUDA sm89+); this GPU is sm{major}{minor}: "
        "serving the checkpoint's fp8 weights weight-only, activations unquantized"
    )


def swap_fp8_linears(model: nn.Module, quantization: str, weight_scales: str = "tensor") -> nn.Module:
    """Replace every decoder linear of our Qwen3 with an FP8 module of the same shape, on the same device,
    whose `weight_scale` has the shape `weight_scales` ("tensor" or "channel") gives it."""
    if quantization not in QUANTIZATIONS:
        raise LoadError(f"unknown quantization {quantization!r}; expected one of {QUANTIZATIONS}")
    cls = FP8DynamicLinear if quantization == "fp8-dynamic" else FP8Linear
    if quantization == "fp8-weight-only":
        fuse_dequantization_into_matvec()
    for layer in model.model.layers:
        for name in LINEAR_NAMES:
            parent_name, attr = name.split(".")
            parent = getattr(layer, parent_name)
            linear = getattr(parent, attr)
            replacement = cls(
                linear.in_features,
                linear.out_features,
                linear.bias is not None,
                linear.weight.device,
                weight_scales=weight_scales,
            )
            setattr(parent, attr, replacement)
    return model


def fuse_dequantization_into_matvec() -> None:
    """What torchao's weight-only configs set (`set_inductor_config`): with coordinate-descent tuning,
    inductor lowers a batch-1 matmul on CUDA to a pointwise-multiply-and-reduce, into which the fp8→dtype
    upcast and the scale fuse, so a decode step reads 1 byte per weight instead of materializing a copy.
    Without it the upcast is its own kernel writing a bf16 weight per linear. (No effect on CPU.)"""
    import torch._inductor.config

    torch._inductor.config.coordinate_descent_tuning = True


class FP8Scheme(NamedTuple):
    quantization: str  # "fp8-weight-only" | "fp8-dynamic"
    weight_scales: str  # "tensor" ([1] per linear) | "channel" ([out, 1]): the weights' strategy


def quantization_from_config(qc: dict) -> FP8Scheme:
    """The scheme of a compressed-tensors FP8 config with per-tensor or per-channel weights; refuse the rest."""

    def refuse(why: str):
        raise LoadError(
            f"config.json: quantization_config {why}; only FP8 checkpoints from `python -m export` "
            "(compressed-tensors float-quantized, per-tensor or per-channel weights) are supported"
        )

    if not isinstance(qc, dict):
        refuse(f"is a {type(qc).__name__}, not an object")
    method = qc.get("quant_method")
    if method != "compressed-tensors":
        refuse(f"has quant_method {method!r}")
    fmt = qc.get("format")
    if fmt != "float-quantized":
        refuse(f"has format {fmt!r}")
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        refuse("has no config_groups")
    schemes = {_group_scheme(name, group, refuse) for name, group in groups.items()}
    if len({scheme.quantization for scheme in schemes}) != 1:
        refuse("mixes weight-only and dynamic-activation groups")
    if len(schemes) != 1:
        refuse("mixes per-tensor and per-channel weight groups")
    return schemes.pop()


def _group_scheme(name: str, group, refuse) -> FP8Scheme:
    if not isinstance(group, dict) or not isinstance(group.get("weights"), dict):
        refuse(f"group {name!r} has no weights scheme")
    if "Linear" not in (group.get("targets") or []):
        refuse(f"group {name!r} targets {group.get('targets')!r}, not ['Linear']")
    weights = group["weights"]
    want = {"num_bits": 8, "type": "float", "dynamic": False}
    for key, value in want.items():
        if weights.get(key, value if key == "dynamic" else None) != value:
            refuse(f"group {name!r} weights have {key}={weights.get(key)!r} (need {value!r})")
    if weights.get("strategy") not in WEIGHT_SCALES:
        refuse(
            f"group {name!r} weights have strategy={weights.get('strategy')!r} (need one of {WEIGHT_SCALES})"
        )
    if weights.get("symmetric", True) is not True:
        refuse(f"group {name!r} weights are asymmetric")
    activations = group.get("input_activations")
    if activations is None:
        return FP8Scheme("fp8-weight-only", weights["strategy"])
    if not isinstance(activations, dict):
        refuse(f"group {name!r} input_activations is a {type(activations).__name__}, not an object")
    # Dynamic activation scales are computed at run time: per row here (quantize_per_row), and per token in
    # vLLM's compressed-tensors W8A8 FP8 scheme whatever strategy is declared; "tensor" is the coarsest.
    want = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": True}
    for key, value in want.items():
        if activations.get(key) != value:
            refuse(f"group {name!r} input_activations have {key}={activations.get(key)!r} (need {value!r})")
    return FP8Scheme("fp8-dynamic", weights["strategy"])
