"""Qwen3 in plain PyTorch, reading and writing a paged KV cache; the Qwen2 family is the same model.

Parameter names mirror transformers' `Qwen3ForCausalLM` (`Qwen2ForCausalLM`), so an HF state dict assigns
onto this module as is. The families differ only in the attention's projections (engine/model/config.py):
Qwen3 normalizes q and k per head, Qwen2 has none of that and a bias on q, k and v.
One forward serves prefill and decode: every token carries its own position and the flat pool slot its
keys/values are written to, and `reads` (engine/attention.py) says how each sequence reads its own pages,
so sequences of different lengths share a batch. The model knows nothing of pages' contents, requests or
tokenizers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.model.config import ModelConfig


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
        bias = config.qkv_bias
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(
            self.num_heads * self.head_dim, config.hidden_size, bias=config.attention_bias
        )
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        else:  # Qwen2: no q/k norm; an Identity keeps one forward and adds nothing to the state dict
            self.q_norm = self.k_norm = nn.Identity()

    def forward(
        self,
        x: torch.Tensor,  # [B, S, hidden]
        cos: torch.Tensor,  # [B, S, 1, head_dim]
        sin: torch.Tensor,  # [B, S, 1, head_dim]
        k_pool: torch.Tensor,  # [pool_len, kv_heads, head_dim], this layer's pages, flat
        v_pool: torch.Tensor,  # [pool_len, kv_heads, head_dim]
        write_index: torch.Tensor,  # [B, S] flat pool slot each token's keys/values are written to
        reads,  # SdpaReads | FlexReads: which slots each sequence attends over
    ) -> torch.Tensor:
        batch, seq, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(batch, seq, self.num_heads, self.head_dim))
        k = self.k_norm(self.k_proj(x).view(batch, seq, self.num_kv_heads, self.head_dim))
        v = self.v_proj(x).view(batch, seq, self.num_kv_heads, self.head_dim)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        # Write before reading, so each token attends to itself; slots past a sequence's position are
        # masked, which is what lets a page be overwritten in place.
        k_pool[write_index] = k.to(k_pool.dtype)
        v_pool[write_index] = v.to(v_pool.dtype)
        out = reads.attend(q.transpose(1, 2), k_pool, v_pool)  # [B, H, S, head_dim]
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

    def forward(self, x, cos, sin, k_pool, v_pool, write_index, reads):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, k_pool, v_pool, write_index, reads)
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
        write_index: torch.Tensor,  # [B, S] flat pool slot of each token
        reads,  # SdpaReads | FlexReads (engine/attention.py)
        rope: tuple[torch.Tensor, torch.Tensor],  # cos, sin: [max_positions, head_dim]
        cache,  # k, v: one [pool_len, kv_heads, head_dim] tensor per layer each (engine/cache/pool.py)
    ) -> torch.Tensor:  # [B, S, hidden]
        # The table may be held narrower than the compute dtype (engine/model/cpu_fp8.py): rows widen.
        x = self.model.embed_tokens(input_ids).to(self.model.norm.weight.dtype)
        cos = rope[0][positions].unsqueeze(2).to(x.dtype)
        sin = rope[1][positions].unsqueeze(2).to(x.dtype)
        k_cache, v_cache = cache
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, k_cache[i], v_cache[i], write_index, reads)
        return self.model.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
