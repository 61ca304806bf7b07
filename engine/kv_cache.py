"""The static KV cache: allocated once, written by index, never reallocated on the hot path."""

from __future__ import annotations

import torch

from engine.config import ModelConfig


class KVCache:
    """Keys and values for `num_slots` sequences of up to `cache_len` positions each.

    One extra slot at index `scratch_slot` absorbs the writes of padding tokens and padded batch rows,
    so padding never touches a real conversation's cache.
    """

    def __init__(self, config: ModelConfig, num_slots: int, cache_len: int, dtype: torch.dtype, device):
        shape = (
            config.num_hidden_layers,
            num_slots + 1,
            cache_len,
            config.num_key_value_heads,
            config.head_dim,
        )
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # [layers, slots + 1, cache_len, kv_heads, D]
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.scratch_slot = num_slots
        self.cache_len = cache_len

    @property
    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k, self.v

    @property
    def num_bytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()
