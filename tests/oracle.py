"""The oracle: tiny random transformers Qwen3 and Qwen2 models, and their greedy generate."""

from __future__ import annotations

import torch

HF_CONFIGS = {
    # name: Qwen3Config kwargs (Qwen2Config's for names starting "qwen2-"). Wide init (0.3) so greedy argmax
    # varies and equality means something.
    "gqa2-untied": dict(
        vocab_size=512,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        tie_word_embeddings=False,
    ),
    "mha-tied": dict(
        vocab_size=300,
        hidden_size=48,
        num_hidden_layers=3,
        num_attention_heads=3,
        num_key_value_heads=3,
        head_dim=16,
        intermediate_size=96,
        tie_word_embeddings=True,
    ),
    "gqa4-tied-odd": dict(
        vocab_size=997,
        hidden_size=96,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=24,
        intermediate_size=200,
        tie_word_embeddings=True,
        rope_theta=1_000_000.0,
    ),
    # The Qwen2 family (Qwen2.5's drafter/target pair: GQA, tied, theta 1e6): q/k/v biases, no q/k norm,
    # head_dim = hidden / heads (Qwen2Config has no head_dim field).
    "qwen2-gqa2-tied": dict(
        vocab_size=512,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        tie_word_embeddings=True,
        rope_theta=1_000_000.0,
    ),
    "qwen2-gqa4-untied-odd": dict(
        vocab_size=701,
        hidden_size=112,
        num_hidden_layers=3,
        num_attention_heads=8,
        num_key_value_heads=2,
        intermediate_size=200,
        tie_word_embeddings=False,
    ),
}
QWEN2_CONFIGS = [name for name in HF_CONFIGS if name.startswith("qwen2-")]


def make_hf_model(name: str, seed: int = 0):
    import transformers

    family = "Qwen2" if name in QWEN2_CONFIGS else "Qwen3"
    config_class = getattr(transformers, f"{family}Config")
    model_class = getattr(transformers, f"{family}ForCausalLM")
    torch.manual_seed(seed)
    config = config_class(**HF_CONFIGS[name], initializer_range=0.3, max_position_embeddings=4096)
    model = model_class(config).eval()
    with torch.no_grad():  # transformers initializes biases to zero, which would test nothing
        for parameter_name, parameter in model.named_parameters():
            if parameter_name.endswith(".bias"):
                parameter.normal_(std=config.initializer_range)
    return model


def hf_greedy(model, tokens: list[int], num_draft_tokens: int) -> list[int]:
    """The oracle: transformers' greedy generate, new tokens only."""
    ids = torch.tensor([tokens])
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=num_draft_tokens,
            min_new_tokens=num_draft_tokens,
        )
    return out[0, len(tokens) :].tolist()


def fresh_forward(engine, tokens: list[int]):
    """The engine model's final hidden states [1, len, hidden] of one pass over `tokens`, written to fresh
    consecutive pages after forgetting every cached conversation (the modules and pool a draft runs on)."""
    from engine.attention import SdpaReads

    engine.reset_cache()
    n, size = len(tokens), engine.config.page_size
    positions = torch.arange(n)[None]
    slots = slice(size, size + n)  # pages 1, 2, ...: page 0 is scratch
    reads = SdpaReads(slots, positions, n)
    write_index = torch.arange(size, size + n)[None]
    return engine.model(
        torch.tensor([tokens]), positions, write_index, reads, engine.rope, engine.pool.tensors
    )
