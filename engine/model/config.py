"""The model's shape, read from an HF Qwen3 `config.json`, and the error for a config we cannot serve."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


class ConfigError(ValueError):
    """A config that cannot describe a Qwen3 model or a servable engine."""


@dataclass(frozen=True, slots=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 40960
    attention_bias: bool = False

    def __post_init__(self):
        for name in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "intermediate_size",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"config.json: {name} must be a positive integer, got {value!r}")
        if self.vocab_size > 2**24:  # the engine reads drafts back with their probabilities, as float32
            raise ConfigError(f"config.json: vocab_size {self.vocab_size} is above 2**24, not supported")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"config.json: num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2:
            raise ConfigError(
                f"config.json: head_dim must be even for rotary embeddings, got {self.head_dim}"
            )

    @classmethod
    def from_hf(cls, hf: dict) -> ModelConfig:
        """Read the fields we use from an HF Qwen3 `config.json`; refuse what we would get wrong."""
        model_type = hf.get("model_type")
        if model_type != "qwen3":
            raise ConfigError(f"config.json: model_type is {model_type!r}; only 'qwen3' is supported")
        rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ConfigError(f"config.json: rope type {rope_type!r} is not supported (only 'default')")
        if hf.get("use_sliding_window"):
            raise ConfigError(
                "config.json: use_sliding_window is true; sliding-window attention is not supported"
            )
        rope_theta = rope.get("rope_theta", hf.get("rope_theta", 1_000_000.0))
        num_heads = hf.get("num_attention_heads")
        hidden = hf.get("hidden_size")
        head_dim = hf.get("head_dim") or (hidden // num_heads if hidden and num_heads else None)
        try:
            return cls(
                vocab_size=hf["vocab_size"],
                hidden_size=hidden,
                num_hidden_layers=hf["num_hidden_layers"],
                num_attention_heads=num_heads,
                num_key_value_heads=hf.get("num_key_value_heads") or num_heads,
                head_dim=head_dim,
                intermediate_size=hf["intermediate_size"],
                rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
                rope_theta=float(rope_theta),
                tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
                max_position_embeddings=hf.get("max_position_embeddings", 40960),
                attention_bias=bool(hf.get("attention_bias", False)),
            )
        except KeyError as missing:
            raise ConfigError(f"config.json: missing field {missing}") from None

    def to_hf(self) -> dict:
        """The HF `config.json` fields for this shape (what `Qwen3Config(**...)` accepts)."""
        fields = dataclasses.asdict(self)
        return {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], **fields, "hidden_act": "silu"}
