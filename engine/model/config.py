"""The model's shape, read from an HF `config.json` of a family we serve, and the error for one we cannot.

The families are one model (engine/model/qwen3.py) that differs in a few fields, chosen by `model_type`:
Qwen3 normalizes q and k per head (q_norm, k_norm) and has biases on q/k/v/o only with `attention_bias`;
Qwen2 (and Qwen2.5) has no q/k norm and always a bias on q/k/v, never on o. Both tie the lm_head or not.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


class ConfigError(ValueError):
    """A config that cannot describe a model of a family we serve, or a servable engine."""


# model_type -> the transformers class whose checkpoints and greedy drafts ours reproduce.
ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "qwen2": "Qwen2ForCausalLM"}
SUPPORTED = ", ".join(map(repr, ARCHITECTURES))
# What transformers reads a field missing from config.json as (Qwen3Config's and Qwen2Config's defaults).
# Reading it otherwise would serve another model: an untied checkpoint served tied drops its lm_head.
HF_DEFAULTS = dict(
    rms_norm_eps=1e-6, rope_theta=10_000.0, tie_word_embeddings=False, max_position_embeddings=32768
)
QWEN3_HEAD_DIM = 128  # Qwen3Config's default; Qwen2's head_dim is hidden_size // num_attention_heads


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
    attention_bias: bool = False  # Qwen3's: a bias on q/k/v/o (Qwen2 has none on o, always one on q/k/v)
    family: str = "qwen3"  # config.json's model_type, a key of ARCHITECTURES

    @property
    def qk_norm(self) -> bool:
        return self.family == "qwen3"

    @property
    def qkv_bias(self) -> bool:
        return self.family == "qwen2" or self.attention_bias

    def __post_init__(self):
        if self.family not in ARCHITECTURES:
            raise ConfigError(f"config.json: model_type is {self.family!r}; supported: {SUPPORTED}")
        if self.family == "qwen2" and self.attention_bias:
            raise ConfigError("attention_bias is Qwen3's field; Qwen2 has q/k/v biases and none on o_proj")
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
        """Read the fields we use from an HF `config.json` of a family we serve; refuse what we would get
        wrong (another model_type, sliding-window attention, a rope type other than the default)."""
        model_type = hf.get("model_type")
        if model_type not in ARCHITECTURES:
            raise ConfigError(f"config.json: model_type is {model_type!r}; supported: {SUPPORTED}")
        rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ConfigError(f"config.json: rope type {rope_type!r} is not supported (only 'default')")
        if hf.get("use_sliding_window"):
            raise ConfigError(
                "config.json: use_sliding_window is true; sliding-window attention is not supported"
            )
        hf = HF_DEFAULTS | hf
        rope_theta = rope.get("rope_theta", hf["rope_theta"])
        num_heads = hf.get("num_attention_heads")
        hidden = hf.get("hidden_size")
        head_dim = hf.get("head_dim", QWEN3_HEAD_DIM if model_type == "qwen3" else None)
        head_dim = head_dim or (hidden // num_heads if hidden and num_heads else None)
        try:
            return cls(
                vocab_size=hf["vocab_size"],
                hidden_size=hidden,
                num_hidden_layers=hf["num_hidden_layers"],
                num_attention_heads=num_heads,
                num_key_value_heads=hf.get("num_key_value_heads") or num_heads,
                head_dim=head_dim,
                intermediate_size=hf["intermediate_size"],
                rms_norm_eps=float(hf["rms_norm_eps"]),
                rope_theta=float(rope_theta),
                tie_word_embeddings=bool(hf["tie_word_embeddings"]),
                max_position_embeddings=hf["max_position_embeddings"],
                # Qwen2 has no such field: its q/k/v always have a bias and its o_proj never does.
                attention_bias=model_type == "qwen3" and bool(hf.get("attention_bias", False)),
                family=model_type,
            )
        except KeyError as missing:
            raise ConfigError(f"config.json: missing field {missing}") from None

    def to_hf(self) -> dict:
        """The HF `config.json` fields for this shape (what `Qwen3Config(**...)`, or `Qwen2Config(**...)`
        for the Qwen2 family, accepts)."""
        fields = dataclasses.asdict(self)
        family = fields.pop("family")
        if family == "qwen2":
            del fields["attention_bias"]  # not a Qwen2 field: its biases are fixed by the architecture
        architecture = ARCHITECTURES[family]
        return {"model_type": family, "architectures": [architecture], **fields, "hidden_act": "silu"}
