"""Qwen3 in plain PyTorch, reading and writing a static KV cache.

Parameter names mirror transformers' `Qwen3ForCausalLM`, so an HF state dict assigns onto this module as is.
One forward serves prefill and decode: every token carries its own position and the cache slot it is
written to, and every sequence reads one slot, so sequences of different lengths share a batch.
The model knows nothing of slots' contents, requests or tokenizers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalize in fp32 and scale in the input dtype, exactly as transformers does.
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_table(config: ModelConfig, num_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, [num_positions, head_dim] in fp32, computed the way transformers computes them."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    freqs = torch.arange(num_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos(), angles.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,  # [B, S, hidden]
        cos: torch.Tensor,  # [B, S, 1, head_dim]
        sin: torch.Tensor,  # [B, S, 1, head_dim]
        mask: torch.Tensor,  # [B, 1, S, kv_len] bool, True where a query may attend
        k_cache: torch.Tensor,  # [slots, cache_len, kv_heads, head_dim]
        v_cache: torch.Tensor,  # [slots, cache_len, kv_heads, head_dim]
        write_slots: torch.Tensor,  # [B, S] slot each token's keys/values are written to
        positions: torch.Tensor,  # [B, S]
        read_slots: torch.Tensor | slice,  # [B] slot each sequence attends over, or a contiguous range
    ) -> torch.Tensor:
        batch, seq, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(batch, seq, self.num_heads, self.head_dim))
        k = self.k_norm(self.k_proj(x).view(batch, seq, self.num_kv_heads, self.head_dim))
        v = self.v_proj(x).view(batch, seq, self.num_kv_heads, self.head_dim)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        # Write before reading, so each token attends to itself; stale entries past a
        # sequence's position are masked, which is what lets a slot be overwritten in place.
        k_cache[write_slots, positions] = k.to(k_cache.dtype)
        v_cache[write_slots, positions] = v.to(v_cache.dtype)
        kv_len = mask.shape[-1]
        # A slice reads a view; a tensor of slots gathers a copy (about 4x slower attention at 16k on CPU),
        # which static-shape paths (compiled, CUDA graphs) need because their slots live on the device.
        keys = k_cache[read_slots, :kv_len].transpose(1, 2)  # [B, kv_heads, kv_len, head_dim]
        values = v_cache[read_slots, :kv_len].transpose(1, 2)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), keys, values, attn_mask=mask, enable_gqa=self.num_heads != self.num_kv_heads
        )
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, self.num_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, cos, sin, mask, k_cache, v_cache, write_slots, positions, read_slots):
        x = x + self.self_attn(
            self.input_layernorm(x), cos, sin, mask, k_cache, v_cache, write_slots, positions, read_slots
        )
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen3Body(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class Qwen3(nn.Module):
    """`forward` returns final hidden states; `logits` projects the few rows that need a distribution."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = Qwen3Body(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self,
        input_ids: torch.Tensor,  # [B, S]
        positions: torch.Tensor,  # [B, S]
        write_slots: torch.Tensor,  # [B, S]
        read_slots: torch.Tensor | slice,  # [B], or a contiguous range of slots
        kv_len: int,  # attention span: every position a sequence may attend to is < kv_len
        rope: tuple[torch.Tensor, torch.Tensor],  # cos, sin: [cache_len, head_dim]
        cache: tuple[torch.Tensor, torch.Tensor],  # k, v: [layers, slots, cache_len, kv_heads, head_dim]
    ) -> torch.Tensor:  # [B, S, hidden]
        x = self.model.embed_tokens(input_ids)
        cos = rope[0][positions].unsqueeze(2).to(x.dtype)
        sin = rope[1][positions].unsqueeze(2).to(x.dtype)
        key_positions = torch.arange(kv_len, device=input_ids.device)
        mask = (key_positions[None, None, :] <= positions[:, :, None]).unsqueeze(1)
        k_cache, v_cache = cache
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, mask, k_cache[i], v_cache[i], write_slots, positions, read_slots)
        return self.model.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
