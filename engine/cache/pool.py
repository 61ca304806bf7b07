"""The page pool: every layer's keys and values in fixed-size pages, allocated once from a memory budget.

Each layer has its own key tensor and value tensor, `[num_pages * page_size, kv_heads, head_dim]`, so the slot
of position p of a sequence is `page_table[p // page_size] * page_size + p % page_size`: one index addresses a
token in every layer, and a run of consecutive pages is a plain view. One tensor per layer, not one stacked
`[layers, slots, ...]` tensor: a compiled step that writes a layer's keys through a view of a stacked tensor
is traced as `index_put` on a `select`, then `select_scatter` into the whole tensor, which inductor does not
turn back into an in-place write, so every step copied the whole pool (25 ms with a 0.01 GiB pool, 1.8 s with
0.5 GiB, on the CPU); a write into a tensor that is itself a graph input is reinplaced (bench/pool_scaling.py).
Page 0 is scratch: padding tokens and padded batch rows write there, and positions a static-shape read pads
with point there, so it must hold finite values. Every page is zeroed the first time a sequence is given it:
a decode loop reads (masked) slots its later steps will write, and a masked 0 x NaN of never-written memory
would still be NaN.
"""

from __future__ import annotations

import numpy as np
import torch

from engine.model.config import ModelConfig

SCRATCH_PAGE = 0

LayerTensors = tuple[torch.Tensor, ...]  # one [num_pages * page_size, kv_heads, head_dim] tensor per layer


def bytes_per_token(config: ModelConfig, dtype: torch.dtype) -> int:
    """Keys and values of one position in every layer."""
    element = torch.tensor([], dtype=dtype).element_size()
    return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * element


class PagePool:
    def __init__(
        self, config: ModelConfig, num_pages: int, page_size: int, dtype: torch.dtype, device, zeroed: bool
    ):
        shape = (num_pages * page_size, config.num_key_value_heads, config.head_dim)
        # Left uninitialised where the caller allows (the OS maps it lazily: an unused budget costs no
        # memory) and zeroed page by page on first use; eager FlexAttention reads the whole pool.
        make = torch.zeros if zeroed else torch.empty
        layers = range(config.num_hidden_layers)
        self.k: LayerTensors = tuple(make(shape, dtype=dtype, device=device) for _ in layers)
        self.v: LayerTensors = tuple(make(shape, dtype=dtype, device=device) for _ in layers)
        self.num_pages = num_pages
        self.page_size = page_size
        self.cleared = np.full(num_pages, zeroed, dtype=bool)  # [num_pages] zeroed or written since
        self.cleared[SCRATCH_PAGE] = False
        self.clear_new([SCRATCH_PAGE])  # zeroed whatever the pool's memory: padding reads it

    def clear_new(self, pages: list[int]) -> None:
        """Zero the pages among `pages` that were never used (one indexed write per layer tensor)."""
        pages = np.asarray(pages, dtype=np.int64)
        unused = ~self.cleared[pages]
        if not unused.any():  # most calls: every page was written before
            return
        new = np.unique(pages[unused])
        self.cleared[new] = True
        slots = torch.from_numpy((new[:, None] * self.page_size + np.arange(self.page_size)).reshape(-1))
        slots = slots.to(self.k[0].device)
        for tensor in (*self.k, *self.v):
            tensor[slots] = 0

    def copy_pages(self, pairs: list[tuple[int, int]]) -> None:
        """Copy each (from, to) page's keys and values, in every layer (one indexed copy per layer tensor):
        a branch forking inside its session's partly filled page (engine/ahead.py)."""
        if not pairs:
            return
        sources, targets = (np.asarray(side, dtype=np.int64) for side in zip(*pairs, strict=True))
        self.cleared[targets] = True
        within = np.arange(self.page_size)
        device = self.k[0].device
        source_slots = torch.from_numpy((sources[:, None] * self.page_size + within).reshape(-1)).to(device)
        target_slots = torch.from_numpy((targets[:, None] * self.page_size + within).reshape(-1)).to(device)
        for tensor in (*self.k, *self.v):
            tensor[target_slots] = tensor[source_slots]

    @property
    def tensors(self) -> tuple[LayerTensors, LayerTensors]:
        return self.k, self.v

    @property
    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))
