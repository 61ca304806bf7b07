"""The flex block mask's block sizes suit every kernel config inductor would pick on a GPU, for the shapes the
presets serve: read from torch's own config tables (CUDAConfigHeuristic), per device capability, so no GPU
is needed. A mask a kernel refuses makes `Engine.compile` fall back to eager flex, which scores the pool."""

from __future__ import annotations

import pytest
import torch
from torch._inductor.template_heuristics.triton import CUDAConfigHeuristic

from engine.attention import FLEX_KERNEL_OPTIONS, FLEX_Q_BLOCK
from engine.config import ConfigError, EngineConfig
from engine.model.presets import PRESETS

CAPABILITIES = [(8, 0), (8, 9), (9, 0), (10, 0), (12, 0)]  # A100, L4/L40, H100/H200, B200, RTX 50xx
DTYPES = [torch.bfloat16, torch.float32]
PAGE_SIZE = EngineConfig().page_size


def next_power_of_2(n: int) -> int:
    return 1 << (n - 1).bit_length()


@pytest.mark.parametrize("capability", CAPABILITIES)
def test_block_mask_suits_every_flex_kernel_config(monkeypatch, capability):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    heuristic = CUDAConfigHeuristic()
    for name, shape in PRESETS.items():
        group = shape.num_attention_heads // shape.num_key_value_heads
        for dtype in DTYPES:
            # The decoding kernel (a static batch, one query token): BLOCK_M from the GQA group, BLOCK_N
            # clamped to the key block, both of which must divide the mask's blocks.
            block_m = max(next_power_of_2(group), 16)
            assert FLEX_Q_BLOCK % block_m == 0, (name, dtype)
            for conf in heuristic.get_flex_decode_configs(shape.head_dim, dtype):
                block_n = min(FLEX_KERNEL_OPTIONS.get("BLOCK_N", conf.block_n), PAGE_SIZE)
                assert PAGE_SIZE % block_n == 0, (name, dtype, conf)
            # The main kernel (what a symbolic batch or a non-power-of-two group falls back to): our
            # kernel options override its table's choices (inductor `setdefault`s them).
            for conf in heuristic.get_flex_attn_fwd_configs(shape.head_dim, dtype):
                assert FLEX_Q_BLOCK % FLEX_KERNEL_OPTIONS.get("BLOCK_M", conf.block_m) == 0, (
                    name,
                    dtype,
                    conf,
                )
                assert PAGE_SIZE % FLEX_KERNEL_OPTIONS.get("BLOCK_N", conf.block_n) == 0, (name, dtype, conf)


def test_cuda_flex_refuses_pages_its_kernels_cannot_read():
    for page_size in (16, 32, 96):
        with pytest.raises(ConfigError, match="multiple of 64"):
            EngineConfig(device="cuda", attention="flex", page_size=page_size)
    EngineConfig(device="cuda", attention="flex", page_size=128)
    EngineConfig(device="cpu", attention="flex", page_size=16)  # eager flex on the CPU: any page size
