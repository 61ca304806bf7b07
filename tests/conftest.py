"""Shared test fixtures: tiny random transformers Qwen3 checkpoints (the oracle) written to temp dirs."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import torch

# Compiled tests share one inductor cache inside the ignored build folder, so reruns take seconds.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(__file__).resolve().parents[1] / "build" / "inductor"))
# torchao logs that its CUDA-only extensions do not load on CPU; that is expected here, not news.
logging.getLogger("torchao").setLevel(logging.ERROR)

HF_CONFIGS = {
    # name: Qwen3Config kwargs. Wide init (0.3) so greedy argmax varies and equality means something.
    "gqa2-untied": dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=16, intermediate_size=128, tie_word_embeddings=False),
    "mha-tied": dict(vocab_size=300, hidden_size=48, num_hidden_layers=3, num_attention_heads=3,
                     num_key_value_heads=3, head_dim=16, intermediate_size=96, tie_word_embeddings=True),
    "gqa4-tied-odd": dict(vocab_size=997, hidden_size=96, num_hidden_layers=4, num_attention_heads=8,
                          num_key_value_heads=2, head_dim=24, intermediate_size=200, tie_word_embeddings=True,
                          rope_theta=1_000_000.0),
}


def make_hf_model(name: str, seed: int = 0):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(**HF_CONFIGS[name], initializer_range=0.3, max_position_embeddings=4096)
    return Qwen3ForCausalLM(config).eval()


@pytest.fixture(scope="session")
def hf_checkpoint(tmp_path_factory):
    """name -> (transformers model in fp32, directory it was saved to with save_pretrained)."""
    made = {}

    def get(name: str = "gqa2-untied"):
        if name not in made:
            model = make_hf_model(name)
            directory = tmp_path_factory.mktemp(name)
            model.save_pretrained(directory)
            made[name] = (model, directory)
        return made[name]

    return get


def hf_greedy(model, tokens: list[int], num_draft_tokens: int) -> list[int]:
    """The oracle: transformers' greedy generate, new tokens only."""
    ids = torch.tensor([tokens])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=num_draft_tokens, min_new_tokens=num_draft_tokens)
    return out[0, len(tokens):].tolist()


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
