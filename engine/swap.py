"""Swapping the served weights in place (online adaptation: docs/adaptation.md).

The new weights come as a checkpoint's tensors in the served layout (export/versions.py makes them with the
export's own quantization): they are checked and cast exactly as the loader checks and casts a checkpoint,
all of them before anything is written. Compiled code and CUDA graphs hold the live parameters and buffers,
so the new values are copied into that very storage and nothing recompiles. The CPU's eager packed linears
(engine/model/cpu_linears.py) hold derived copies instead (packed, dequantized): those are built from the
new weights the way loading builds them, beside the old ones, and take their place at the commit, which is
safe because no compiled code runs there. The KV cache is not this module's business: its keys and values
are of the old weights, and the engine drops them (`Engine.weight_swap`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Generator, Iterator
from typing import TypeVar

import torch
from torch import nn

from engine.model.cpu_fp8 import PackedFP8Linear
from engine.model.cpu_linears import CpuLinear
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


class WeightSwap:
    """New weights made ready beside the live ones a module at a time (`pieces`), then put in at once
    (`commit`): the engine serves batches between two pieces with the old weights untouched, and a swap holds
    the batches up only for its commit (copies of the plain tensors, packed linears' attributes rebound).

    On the real 0.5B drafter (bf16, 2 cores) packing its linears is ~1.1 s of a swap's ~1.2 s: done whole, a
    request arriving meanwhile waited for all of it."""

    def __init__(
        self,
        loaded: LoadedModel,
        tensors: dict[str, torch.Tensor],
        dtype: torch.dtype,
        device,
        shared: Collection[str] = (),  # names whose values are served already: checked, not put in again
    ):
        self.loaded, self.tensors, self.dtype, self.device = loaded, tensors, dtype, device
        self.shared = frozenset(shared)
        self.copies: list[tuple[torch.Tensor, torch.Tensor]] = []  # (live tensor, its new value)
        self.installs: list[tuple[nn.Module, dict]] = []  # (packed linear, its new attributes)
        self.ready = False

    def pieces(self) -> Iterator[None]:
        """Check every tensor (LoadError, nothing written, if they do not fit), then make each module's new
        weights ready; a yield between two pieces."""
        by_module = check_weights(self.loaded, self.tensors, self.dtype, self.device)
        yield
        model = self.loaded.model
        # A module is made again whole if any of its tensors is new (a packed linear packs weight and bias
        # together), and left as it is if none is: on a real drafter the embedding is most of the commit.
        changed = {
            name: values
            for name, values in by_module.items()
            if any(f"{name}.{attribute}" not in self.shared for attribute in values)
        }
        for name, values in changed.items():
            self.prepare(model.get_submodule(name), values)
            yield
        embedding = "model.embed_tokens"
        if (
            embedding in changed
            and self.loaded.config.tie_word_embeddings
            and isinstance(model.lm_head, CpuLinear)
        ):
            head = model.lm_head  # a packed copy of the embedding: packed from the new one
            attributes = head.pack(by_module[embedding]["weight"], None)
            if head.kind != "onednn":  # its plain weight is the embedding table itself, as at load
                attributes["weight_"] = model.model.embed_tokens.weight.detach()
            self.installs.append((head, attributes))
            yield
        self.ready = True  # nothing but the commit is left after the last yield

    def prepare(self, module: nn.Module, values: dict[str, torch.Tensor]) -> None:
        """One module's new tensors (`weight`, `weight_scale`, `bias`, ... as the checkpoint names them)."""
        if isinstance(module, PackedFP8Linear):  # FP8 bytes read in place, or dynamic FP8's fp32 values
            self.installs.append(
                (module, module.pack(values["weight"], values["weight_scale"], values.get("bias")))
            )
        elif isinstance(module, CpuLinear):  # from an FP8Linear (a scale) or an nn.Linear (none)
            weight = values["weight"]
            if "weight_scale" in values:
                weight = dequantize(weight, values["weight_scale"], self.dtype)
            self.installs.append((module, module.pack(weight.to(self.dtype), values.get("bias"))))
        else:
            self.copies.extend((getattr(module, attribute), value) for attribute, value in values.items())

    def commit(self) -> None:
        """Put the new weights in (all pieces made): compiled code and graphs hold the live tensors, so those
        are copied into; packed linears are eager and take their new attributes."""
        assert self.ready, "a swap commits once all its pieces are made"
        with torch.no_grad():
            for live, value in self.copies:
                live.copy_(value)
        for module, attributes in self.installs:
            module.install(attributes)


T = TypeVar("T")


def run_through(pieces: Generator[None, None, T]) -> T:
    """A job made of pieces (`Engine.weight_swap`) run in one go: its result."""
    while True:
        try:
            next(pieces)
        except StopIteration as done:
            return done.value
