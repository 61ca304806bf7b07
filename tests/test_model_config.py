"""The family switch: `config.json`'s model_type picks Qwen3 or Qwen2 for the one model, with the real Qwen2.5
pair's configs read as transformers reads them (checked on the meta device), and what we would get wrong
refused with a ConfigError that names it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine.model.config import ConfigError, ModelConfig
from engine.model.presets import PRESETS
from engine.model.qwen3 import Qwen3

# Qwen2.5-Coder-0.5B-Instruct's config.json (the real pair's drafter), as published; the window fields are
# inert while use_sliding_window is false. The 1.5B target differs in the fields below it.
QWEN2_5_CODER_0_5B = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "hidden_act": "silu",
    "hidden_size": 896,
    "initializer_range": 0.02,
    "intermediate_size": 4864,
    "max_position_embeddings": 32768,
    "max_window_layers": 24,
    "model_type": "qwen2",
    "num_attention_heads": 14,
    "num_hidden_layers": 24,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
QWEN2_5_CODER_1_5B = QWEN2_5_CODER_0_5B | {
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "max_window_layers": 21,
    "num_attention_heads": 12,
    "num_hidden_layers": 28,
}


@pytest.mark.parametrize(
    ("hf", "head_dim", "num_parameters"),
    [(QWEN2_5_CODER_0_5B, 64, 494_032_768), (QWEN2_5_CODER_1_5B, 128, 1_543_714_304)],
)
def test_qwen2_5_configs_build_the_qwen2_model(hf, head_dim, num_parameters):
    config = ModelConfig.from_hf(hf)
    assert (config.family, config.head_dim, config.tie_word_embeddings) == ("qwen2", head_dim, True)
    assert config.qkv_bias and not config.qk_norm and not config.attention_bias
    with torch.device("meta"):
        model = Qwen3(config)
    names = set(model.state_dict())
    attention = "model.layers.0.self_attn."
    assert {attention + f"{p}_proj.bias" for p in "qkv"} <= names
    assert not any(n.endswith(("o_proj.bias", "q_norm.weight", "k_norm.weight")) for n in names)
    unique = {id(p): p.numel() for p in model.parameters()}  # the tied lm_head counted once
    assert sum(unique.values()) == num_parameters  # Qwen2.5-0.5B's and 1.5B's parameter counts


@pytest.mark.parametrize(
    "config", [PRESETS["tiny"], dataclasses.replace(PRESETS["tiny"], family="qwen2")], ids=["qwen3", "qwen2"]
)
def test_to_hf_is_what_transformers_builds_and_reads_back(config):
    import transformers

    hf = config.to_hf()
    assert ModelConfig.from_hf(hf) == config
    family = hf["architectures"][0].removesuffix("ForCausalLM")
    with torch.device("meta"):
        theirs = getattr(transformers, f"{family}ForCausalLM")(getattr(transformers, f"{family}Config")(**hf))
        ours = Qwen3(config)
    assert {n: t.shape for n, t in ours.state_dict().items()} == {
        n: t.shape for n, t in theirs.state_dict().items()
    }


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"model_type": "llama"}, "model_type is 'llama'; supported: 'qwen3', 'qwen2'"),
        ({"use_sliding_window": True}, "sliding-window attention is not supported"),
        ({"rope_scaling": {"type": "yarn", "factor": 4.0}}, "rope type 'yarn' is not supported"),
        ({"rope_parameters": {"rope_type": "linear", "factor": 2.0}}, "rope type 'linear'"),
    ],
)
def test_qwen2_configs_we_would_get_wrong_are_refused(edit, message):
    with pytest.raises(ConfigError, match=message):
        ModelConfig.from_hf(QWEN2_5_CODER_0_5B | edit)


def test_qwen2_has_no_attention_bias_switch():
    """Qwen2's config has no attention_bias field: its q/k/v always have biases and its o_proj none."""
    assert not ModelConfig.from_hf(QWEN2_5_CODER_0_5B | {"attention_bias": True}).attention_bias
    with pytest.raises(ConfigError, match="attention_bias is Qwen3's field"):
        dataclasses.replace(ModelConfig.from_hf(QWEN2_5_CODER_0_5B), attention_bias=True)


@pytest.mark.parametrize("model_type", ["qwen3", "qwen2"])
def test_fields_missing_from_config_json_read_as_transformers_reads_them(model_type):
    """An untied config.json without tie_word_embeddings is untied (served tied, its lm_head would be
    dropped); likewise rope_theta, max_position_embeddings and Qwen3's head_dim take transformers' defaults."""
    import transformers

    shape = dict(vocab_size=256, hidden_size=64, num_hidden_layers=1, num_attention_heads=2)
    shape |= dict(num_key_value_heads=1, intermediate_size=96)
    ours = ModelConfig.from_hf({"model_type": model_type, **shape})
    family = ours.to_hf()["architectures"][0].removesuffix("ForCausalLM")
    theirs = getattr(transformers, f"{family}Config")(**shape)
    assert ours.tie_word_embeddings is theirs.tie_word_embeddings is False
    assert ours.rope_theta == theirs.rope_parameters["rope_theta"]
    assert ours.max_position_embeddings == theirs.max_position_embeddings
    assert ours.head_dim == getattr(theirs, "head_dim", shape["hidden_size"] // shape["num_attention_heads"])
    assert ours.rms_norm_eps == theirs.rms_norm_eps
