"""The page pool: every layer's keys and values in fixed-size pages, allocated once from a memory budget.

Pages are stored flat, `[layers, num_pages * page_size, kv_heads, head_dim]`, so the slot of position p of a
sequence is `page_table[p // page_size] * page_size + p % page_size`: one index addresses a token in every
layer, and a run of consecutive pages is a plain view. Page 0 is scratch: padding tokens and padded batch
rows write there, and positions a static-shape read pads with point there, so it must hold finite values.
Every page is zeroed the first time a sequence is given it: a decode loop reads (masked) slots its later
steps will write, and a masked 0 x NaN of never-written memory would still be NaN.
"""

from __future__ import annotations

import numpy as np
import torch

from engine.config import ModelConfig

SCRATCH_PAGE = 0


def bytes_per_token(config: ModelConfig, dtype: torch.dtype) -> int:
    """Keys and values of one position in every layer."""
    element = torch.tensor([], dtype=dtype).element_size()
    return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * element


class PagePool:
    def __init__(
        self, config: ModelConfig, num_pages: int, page_size: int, dtype: torch.dtype, device, zeroed: bool
    ):
        shape = (config.num_hidden_layers, num_pages * page_size, config.num_key_value_heads, config.head_dim)
        # Left uninitialised where the caller allows (the OS maps it lazily: an unused budget costs no
        # memory) and zeroed page by page on first use; eager FlexAttention reads the whole pool.
        make = torch.zeros if zeroed else torch.empty
        self.k = make(
            shape, dtype=dtype, device=device
        )  # [layers, num_pages * page_size, kv_heads, head_dim]
        self.v = make(shape, dtype=dtype, device=device)
        scratch = slice(SCRATCH_PAGE * page_size, (SCRATCH_PAGE + 1) * page_size)
        self.k[:, scratch].zero_()
        self.v[:, scratch].zero_()
        self.num_pages = num_pages
        self.page_size = page_size
        self.cleared = np.full(num_pages, zeroed, dtype=bool)  # [num_pages] zeroed or written since
        self.cleared[SCRATCH_PAGE] = True

    def clear_new(self, pages: list[int]) -> None:
        """Zero the pages among `pages` that were never used (one indexed write per pool tensor)."""
        pages = np.asarray(pages, dtype=np.int64)
        unused = ~self.cleared[pages]
        if not unused.any():  # most calls: every page was written before
            return
        new = np.unique(pages[unused])
        self.cleared[new] = True
        slots = torch.from_numpy((new[:, None] * self.page_size + np.arange(self.page_size)).reshape(-1))
        slots = slots.to(self.k.device)
        self.k[:, slots] = 0
        self.v[:, slots] = 0

    @property
    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k, self.v

    @property
    def num_bytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()
