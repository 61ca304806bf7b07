"""Presets: the real-shape one is Qwen3-0.6B's config exactly (checked cheaply, on the meta device: its
0.6 B random weights are never drawn in CPU tests)."""

from __future__ import annotations

import torch

from engine.model.presets import PRESETS, is_preset
from engine.model.qwen3 import Qwen3

# Qwen3-0.6B's config.json, the fields our ModelConfig reads.
QWEN3_0_6B = dict(
    vocab_size=151936,
    hidden_size=1024,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    intermediate_size=3072,
    rms_norm_eps=1e-6,
    rope_theta=1_000_000.0,
    tie_word_embeddings=True,
    max_position_embeddings=40960,
    attention_bias=False,
)


def test_real_shape_preset_is_qwen3_0_6b_exactly():
    config = PRESETS["qwen3-0.6b-random"]
    assert is_preset("qwen3-0.6b-random")
    assert {name: getattr(config, name) for name in QWEN3_0_6B} == QWEN3_0_6B
    with torch.device("meta"):
        model = Qwen3(config)
    unique = {id(p): p.numel() for p in model.parameters()}  # the tied lm_head counted once
    assert sum(unique.values()) == 596_049_920  # Qwen3-0.6B's parameter count
