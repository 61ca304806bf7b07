"""How a forward pass reads keys and values from the page pool: the two attention paths.

- `sdpa` (the CPU default; also the old behaviour, kept for A/B on a device): each row's positions are
  gathered from the flat pool into a [B, kv_len] copy, or — one row whose positions lie on consecutive pages,
  which the allocator arranges for a growing conversation — read as a view, then `scaled_dot_product_attention`
  with a boolean mask. Eager callers give exact lengths; static-shape callers (compiled, graphs) pad kv_len
  to a span they were built for, padded positions pointing at the zeroed scratch page.
- `flex` (the CUDA default): FlexAttention over the whole pool as one physical sequence, with a block mask
  built on the device from the page table: each row visits only its own pages (kv_indices = its page
  table, kv_num_blocks from its length), so nothing is copied and no span is rounded up, and the mask_mod
  maps a physical slot back to the row's logical position (`physical_to_logical`, as torch's experimental
  PagedAttention does) so it is exact even where a kernel applies it densely. Everything is tensor ops on
  the device: it compiles fullgraph and captures into CUDA graphs. On the CPU, eager FlexAttention scores
  the whole pool, so it is selectable there only to test it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention

ATTENTION_PATHS = ("sdpa", "flex")
# The block mask's query block: every decode step's queries lie in one block, and 128 is a multiple of each
# BLOCK_M inductor's flex kernels choose (decoding: max(16, next_pow2(seq x GQA group)); the main kernel:
# 32-128 by device and dtype), so no kernel refuses the mask. Its key block is one page, which each kernel
# must read in BLOCK_N-wide tiles that divide it: the main kernel's tables pick up to 128 (bf16, head_dim 64,
# sm90+), so both kernels are told 64, and CUDA's page sizes are multiples of 64 (engine/config.py).
# tests/test_flex_blocks.py checks these against torch's own config tables.
FLEX_Q_BLOCK = 128
FLEX_KERNEL_OPTIONS = {"BLOCK_N": 64}


class SdpaReads:
    def __init__(
        self,
        slots: torch.Tensor | slice,  # [B, kv_len] flat pool slot of each key position, or one row's slice
        query_positions: torch.Tensor,  # [B, S]
        kv_len: int,
    ):
        self.slots = slots
        key_positions = torch.arange(kv_len, device=query_positions.device)
        self.mask = (key_positions[None, None, :] <= query_positions[:, :, None]).unsqueeze(1)  # [B,1,S,kv]

    def attend(self, q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor) -> torch.Tensor:
        """q: [B, H, S, D]; pools: [pool_len, kv_heads, D] → [B, H, S, D]."""
        if isinstance(self.slots, slice):
            keys, values = k_pool[self.slots].unsqueeze(0), v_pool[self.slots].unsqueeze(0)
        else:
            keys, values = k_pool[self.slots], v_pool[self.slots]  # gathered copies: [B, kv_len, kv_heads, D]
        keys, values = keys.transpose(1, 2).to(q.dtype), values.transpose(1, 2).to(q.dtype)
        group = q.shape[1] // keys.shape[1]
        if q.is_cuda and group > 1:
            # CUDA's SDPA does GQA (`enable_gqa`) only in its flash and math kernels, and flash takes no
            # mask: a masked GQA call runs the math kernel, which materializes fp32 scores (~2 GiB per
            # layer for a 512-token chunk against 32k keys). Keys and values expanded to the query heads
            # make the memory-efficient kernel eligible, for a copy of group x the keys read.
            keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
            group = 1
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=self.mask, enable_gqa=group > 1)


def gather_slots(page_table: torch.Tensor, kv_len: int, page_size: int) -> torch.Tensor:
    """[B, kv_len] flat slots of logical positions 0..kv_len-1 of each row (on the device, shape-static)."""
    positions = torch.arange(kv_len, device=page_table.device)
    return page_table[:, positions // page_size] * page_size + positions % page_size


class FlexReads:
    def __init__(
        self,
        page_table: torch.Tensor,  # [B, max_pages] physical page of each logical page (scratch past the end)
        physical_to_logical: torch.Tensor,  # [B, num_pages] logical index of each physical page, or -1
        query_positions: torch.Tensor,  # [B, S]
        page_size: int,
        pool_len: int,
    ):
        batch, seq = query_positions.shape
        last = query_positions.max(dim=1).values  # [B]
        kv_num_blocks = (last // page_size + 1).to(torch.int32).view(batch, 1, 1)
        # Compiled flex wants a block mask as wide as the keys (the whole pool), as torch's PagedAttention
        # builds it; the entries past kv_num_blocks are never visited.
        width = pool_len // page_size - page_table.shape[1]
        kv_indices = F.pad(page_table, (0, width)).to(torch.int32).view(batch, 1, 1, -1)

        def mask_mod(b, h, q_idx, kv_idx):
            logical = physical_to_logical[b, kv_idx // page_size]
            position = logical * page_size + kv_idx % page_size
            return (logical >= 0) & (position <= query_positions[b, q_idx])

        self.block_mask = BlockMask.from_kv_blocks(
            kv_num_blocks,
            kv_indices,
            BLOCK_SIZE=(FLEX_Q_BLOCK, page_size),
            mask_mod=mask_mod,
            seq_lengths=(seq, pool_len),
            compute_q_blocks=False,
        )

    def attend(self, q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor) -> torch.Tensor:
        keys = k_pool.unsqueeze(0).transpose(1, 2)  # [1, kv_heads, pool_len, D], a view
        values = v_pool.unsqueeze(0).transpose(1, 2)
        return flex_attention(
            q,
            keys.to(q.dtype),
            values.to(q.dtype),
            block_mask=self.block_mask,
            enable_gqa=True,
            kernel_options=FLEX_KERNEL_OPTIONS,
        )


def physical_to_logical(page_table: torch.Tensor, num_pages: int) -> torch.Tensor:
    """[B, num_pages] inverse of the page table; the scratch page (0) maps to -1 for every row."""
    batch, max_pages = page_table.shape
    inverse = torch.full((batch, num_pages), -1, dtype=torch.long, device=page_table.device)
    logical = torch.arange(max_pages, device=page_table.device).expand(batch, max_pages)
    inverse.scatter_(1, page_table, logical)
    inverse[:, 0] = -1
    return inverse
