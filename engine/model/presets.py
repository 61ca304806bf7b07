"""Named random-weight Qwen3 models, so every entry point runs on a fresh machine with no downloads.

`tiny` is the embedded default the server serves out of the box; `bench-cpu` keeps Qwen3-0.6B's real
vocabulary (whose tied embedding is most of the bytes a decode step reads) with a body small enough for a
CPU; `qwen3-0.6b-random` is Qwen3-0.6B's exact shape (0.6 B parameters, 1.2 GB in bf16), so a device with no
network measures the real model's costs (export it to FP8 like a real checkpoint; never built in CPU tests). Weights are drawn from a fixed seed with a wide spread, so greedy drafts vary instead of repeating one
token. They are random: the drafts mean nothing, only their equality with transformers' does.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine.model.config import ModelConfig

PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(
        vocab_size=1024,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        max_position_embeddings=40960,
    ),
    "bench-cpu": ModelConfig(
        vocab_size=151936,
        hidden_size=512,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
        intermediate_size=1536,
        max_position_embeddings=40960,
    ),
    # Qwen3-0.6B's config.json, field for field (vocab, 28 layers, 16 query / 8 KV heads of 128, tied).
    "qwen3-0.6b-random": ModelConfig(
        vocab_size=151936,
        hidden_size=1024,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=3072,
        max_position_embeddings=40960,
    ),
}
PRESET_SEED = 0
PRESET_STD = 0.25


def is_preset(source: str) -> bool:
    return source in PRESETS


def preset_state_dict(name: str, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """HF-named weights of a preset, the same on every machine (drawn on the CPU from one seed: 0.6 B
    normal draws take seconds there, so the device needs no generator of its own)."""
    config = PRESETS[name]
    generator = torch.Generator().manual_seed(PRESET_SEED)

    def normal(*shape):
        # Drawn in fp32 and scaled in place: one transient fp32 tensor at a time, never the whole model.
        return torch.randn(*shape, generator=generator).mul_(PRESET_STD).to(dtype)

    def ones(dim):
        return torch.ones(dim, dtype=dtype)

    h, d, i = config.hidden_size, config.head_dim, config.intermediate_size
    weights = {"model.embed_tokens.weight": normal(config.vocab_size, h), "model.norm.weight": ones(h)}
    for n in range(config.num_hidden_layers):
        p = f"model.layers.{n}."
        weights |= {
            p + "input_layernorm.weight": ones(h),
            p + "post_attention_layernorm.weight": ones(h),
            p + "self_attn.q_proj.weight": normal(config.num_attention_heads * d, h),
            p + "self_attn.k_proj.weight": normal(config.num_key_value_heads * d, h),
            p + "self_attn.v_proj.weight": normal(config.num_key_value_heads * d, h),
            p + "self_attn.o_proj.weight": normal(h, config.num_attention_heads * d),
            p + "mlp.gate_proj.weight": normal(i, h),
            p + "mlp.up_proj.weight": normal(i, h),
            p + "mlp.down_proj.weight": normal(h, i),
        }
        if config.qk_norm:  # Qwen3
            weights |= {p + "self_attn.q_norm.weight": ones(d), p + "self_attn.k_norm.weight": ones(d)}
        if config.qkv_bias:  # Qwen2 (drawn after the layer's weights: Qwen3 presets keep their values)
            weights |= {
                p + "self_attn.q_proj.bias": normal(config.num_attention_heads * d),
                p + "self_attn.k_proj.bias": normal(config.num_key_value_heads * d),
                p + "self_attn.v_proj.bias": normal(config.num_key_value_heads * d),
            }
        if config.attention_bias:
            weights[p + "self_attn.o_proj.bias"] = normal(h)
    if not config.tie_word_embeddings:
        weights["lm_head.weight"] = normal(config.vocab_size, h)
    return weights


def write_preset(name: str, directory: str | Path) -> Path:
    """Write a preset as an HF checkpoint directory (config.json + model.safetensors, bf16)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    hf_config = PRESETS[name].to_hf() | {"torch_dtype": "bfloat16", "initializer_range": PRESET_STD}
    (directory / "config.json").write_text(json.dumps(hf_config, indent=2))
    save_file(preset_state_dict(name), str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory
