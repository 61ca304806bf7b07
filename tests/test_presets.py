"""Presets: the real-shape one is Qwen3-0.6B's config exactly (checked cheaply, on the meta device: its
0.6 B random weights are never drawn in CPU tests), and preset weights fit the Qwen2 family too."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine.config import EngineConfig
from engine.engine import Engine
from engine.model.presets import PRESETS, is_preset, preset_state_dict, write_preset
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


@pytest.mark.parametrize(
    "edit", [dict(family="qwen2"), dict(family="qwen2", tie_word_embeddings=False), dict(attention_bias=True)]
)
def test_preset_weights_fit_every_family(monkeypatch, tmp_path, edit):
    """A preset of the Qwen2 family (or of a Qwen3 with attention biases) draws exactly the tensors its model
    declares, biases included, and its written checkpoint is what transformers reads back."""
    import transformers

    config = dataclasses.replace(PRESETS["tiny"], **edit)
    monkeypatch.setitem(PRESETS, "variant", config)
    with torch.device("meta"):
        expected = {n: t.shape for n, t in Qwen3(config).state_dict().items()}
    if config.tie_word_embeddings:
        expected.pop("lm_head.weight")
    weights = preset_state_dict("variant")
    assert {n: t.shape for n, t in weights.items()} == expected
    assert all(weights[n].abs().sum() > 0 for n in weights if n.endswith(".bias"))
    architecture = config.to_hf()["architectures"][0]
    theirs = getattr(transformers, architecture).from_pretrained(write_preset("variant", tmp_path))
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    assert set(theirs.state_dict()) == set(weights) | tied  # nothing of theirs left at random init
    for name, tensor in weights.items():
        assert torch.equal(theirs.state_dict()[name], tensor), name
    assert Engine.load("variant", EngineConfig(max_seq_len=64)).draft(list(range(1, 20)), 4)
