"""The CPU's decode linears over weights as an FP8 export stores them: fp8 bytes and a bf16 LM head, read in
place by engine/model/cpu_gemv.py's kernel (float32 compute). engine/model/cpu_linears.py puts them in.

- `CpuFP8Linear`: one decoder linear; decode rows through the kernel, a prefill chunk of more than
  MAX_KERNEL_ROWS through a float32 copy of the weight made for it;
- `CpuBf16Head`: the LM head over the bf16 table, the embedding's own when tied (`hold_embedding_as_bf16`
  narrows the table the loader widened, where that loses nothing).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.model import cpu_gemv
from engine.model.fp8 import FP8Linear

# Up to this many rows a product streams the stored weights through the kernel, a pass per 8 rows; a prefill
# chunk of more multiplies once by a float32 copy of the weight made for it.
MAX_KERNEL_ROWS = 32


class PackedFP8Linear(nn.Module):
    """A CPU linear made from an FP8 module's weight, scale and bias by `pack`: at construction, and when the
    engine swaps its weights (engine/swap.py packs the new ones aside, then `install`s them)."""

    def __init__(self, linear: FP8Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.load(linear.weight.detach(), linear.weight_scale.detach(), linear.bias)

    def load(self, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.install(self.pack(weight, weight_scale, bias))

    def pack(
        self, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None
    ) -> dict[str, torch.Tensor | None]:
        raise NotImplementedError

    def install(self, attributes: dict[str, torch.Tensor | None]) -> None:
        for name, value in attributes.items():
            setattr(self, name, value)


class CpuFP8Linear(PackedFP8Linear):
    """`FP8Linear`'s product (fp8 weight × its float32 scale, per tensor or per output row) in float32, with the
    weight held as its fp8 bytes: decode rows through the kernel, prefill chunks through a transient copy."""

    def __init__(self, linear: FP8Linear, kernel: cpu_gemv.Kernel):
        super().__init__(linear)
        self.kernel = kernel

    def pack(
        self, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None
    ) -> dict[str, torch.Tensor | None]:
        # Copies: a checkpoint's tensors are views of its memory-mapped file, which stays mapped (and
        # resident: every page the loader read, 0.5 GB on the real 0.5B drafter) while one view lives.
        return {
            "weight_": weight.clone(memory_format=torch.contiguous_format),  # [out, in] float8_e4m3fn
            "weight_scale": weight_scale.reshape(-1).to(torch.float32, copy=True),  # [1] or [out]
            "bias": None if bias is None else bias.detach().to(torch.float32).contiguous(),
        }

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., in] float32 -> [..., out]
        rows = x.reshape(-1, self.in_features).contiguous()
        if rows.shape[0] <= MAX_KERNEL_ROWS:
            out = self.kernel.fp8(rows, self.weight_, self.weight_scale, self.bias)
        else:
            out = F.linear(rows, self.kernel.dequantize(self.weight_, self.weight_scale), self.bias)
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, kernel={self.kernel.isa}"


class CpuBf16Head(nn.Module):
    """A float32 product with a bf16 weight read as stored, no float32 copy: the LM head over the embedding
    table. Rows are few (the positions that need a distribution), so they all go through the kernel."""

    def __init__(self, weight: torch.Tensor, kernel: cpu_gemv.Kernel):
        super().__init__()
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        # [out, in] bfloat16, the embedding's own table when tied; a swap copies new values into it.
        self.weight = weight
        self.kernel = kernel

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., in] float32 -> [..., out]
        out = self.kernel.bf16(x.reshape(-1, self.in_features).contiguous(), self.weight)
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, kernel={self.kernel.isa}"


def kernel_isa(model: nn.Module) -> str | None:
    """The instruction set of the CPU kernel `model`'s linears read their stored weights with, if any."""
    return next((m.kernel.isa for m in model.modules() if isinstance(m, CpuFP8Linear | CpuBf16Head)), None)


def hold_embedding_as_bf16(model: nn.Module) -> None:
    """An FP8 export stores its embedding (and LM head) in bf16; the loader widened them to float32. Held in
    bf16 again where that loses nothing, they are half the bytes a step's LM head reads (the model widens
    the rows it looks up)."""
    body = getattr(model, "model", None)
    if not isinstance(getattr(body, "embed_tokens", None), nn.Embedding):
        return  # not our Qwen3 (a stack of linears under test)
    tied = model.config.tie_word_embeddings
    for module in (model.model.embed_tokens,) if tied else (model.model.embed_tokens, model.lm_head):
        weight = module.weight.detach()
        if weight.dtype != torch.float32:
            continue
        narrow = weight.to(torch.bfloat16)
        if torch.equal(narrow.to(torch.float32), weight):
            module.weight = nn.Parameter(narrow, requires_grad=False)
    if tied:
        model.lm_head.weight = model.model.embed_tokens.weight
