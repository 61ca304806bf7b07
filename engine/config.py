"""The two configs of the engine: the model's shape (read from an HF `config.json`) and how we serve it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from engine.tiers import draft_tiers


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


def _default_buckets() -> tuple[int, ...]:
    return (1, 2, 4, 8)


DEFAULT_KV_CACHE_GB = {"cpu": 1.0, "cuda": 8.0}  # CPU: mapped lazily, so an unused budget costs nothing


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """How one engine serves: where, in what precision, the KV-cache budget and the static sizes."""

    device: str = "cpu"
    dtype: str = "float32"  # "float32" | "bfloat16"
    max_seq_len: int = 4096  # longest context + draft one request may have
    max_batch_size: int = 8  # requests drafted in one decode loop
    max_draft_tokens: int = 16
    prefill_chunk: int = 512  # tokens of one sequence per prefill forward pass
    compile: bool = False
    cuda_graphs: bool = False
    batch_buckets: tuple[int, ...] = field(default_factory=_default_buckets)
    min_kv_bucket: int = 256  # sdpa with static shapes: smallest attention span, doubling up to cache_len
    attention: str = "sdpa"  # "sdpa" | "flex" (engine/attention.py)
    # 64 positions a page: FlexAttention's decode kernel reads whole 64-wide key blocks, and one key per
    # page of a 32k context keeps prefix matching to ~500 dict lookups; divergence inside a shared page
    # costs at most 63 recomputed tokens.
    page_size: int = 64
    kv_cache_gb: float | None = None  # the pool's budget; None: DEFAULT_KV_CACHE_GB of the device type
    kv_cache_tokens: int | None = None  # or the budget in positions (tests); overrides kv_cache_gb
    # CUDA graphs are captured per draft-length tier (engine/tiers.py); max_draft_tokens is always one.
    draft_length_tiers: tuple[int, ...] = (4, 8, 16)

    def __post_init__(self):
        if self.dtype not in ("float32", "bfloat16"):
            raise ConfigError(f"dtype must be 'float32' or 'bfloat16', got {self.dtype!r}")
        for name in ("max_seq_len", "max_batch_size", "max_draft_tokens", "prefill_chunk", "min_kv_bucket"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.max_draft_tokens >= self.max_seq_len:
            raise ConfigError("max_draft_tokens must be smaller than max_seq_len")
        if not self.batch_buckets or any(b < 1 for b in self.batch_buckets):
            raise ConfigError(f"batch_buckets must be positive sizes, got {self.batch_buckets!r}")
        if self.cuda_graphs and not self.device.startswith("cuda"):
            raise ConfigError("cuda_graphs needs a CUDA device")
        if self.attention not in ("sdpa", "flex"):
            raise ConfigError(f"attention must be 'sdpa' or 'flex', got {self.attention!r}")
        if not isinstance(self.page_size, int) or self.page_size < 16 or self.page_size % 16:
            raise ConfigError(f"page_size must be a positive multiple of 16, got {self.page_size!r}")
        if self.attention == "flex" and self.device.startswith("cuda") and self.page_size % 64:
            # FlexAttention's main CUDA kernel reads 64-wide key blocks; a page is one block (attention.py)
            raise ConfigError(
                f"flex attention on CUDA needs page_size a multiple of 64, got {self.page_size}"
            )
        if self.kv_cache_gb is not None and not self.kv_cache_gb > 0:
            raise ConfigError(f"kv_cache_gb must be positive, got {self.kv_cache_gb!r}")
        tiers = self.draft_length_tiers
        if not tiers or any(not isinstance(t, int) or isinstance(t, bool) or t < 1 for t in tiers):
            raise ConfigError(f"draft_length_tiers must be positive integers, got {tiers!r}")
        if self.kv_cache_tokens is not None and self.kv_cache_tokens < 1:
            raise ConfigError(f"kv_cache_tokens must be positive, got {self.kv_cache_tokens!r}")

    @property
    def buckets(self) -> tuple[int, ...]:
        """Batch sizes a decode loop is padded to: the configured ones up to max_batch_size, plus it."""
        kept = sorted({b for b in self.batch_buckets if b < self.max_batch_size} | {self.max_batch_size})
        return tuple(kept)

    @property
    def tiers(self) -> tuple[int, ...]:
        """Draft lengths a captured loop is built for: the configured tiers up to max_draft_tokens, plus it."""
        return draft_tiers(self.draft_length_tiers, self.max_draft_tokens)

    @property
    def cache_len(self) -> int:
        """Positions one sequence may hold: a loop may run a tier (<= max_draft_tokens) plus one step, so the
        last request that fits max_seq_len may write up to max_draft_tokens positions past it (results
        discarded)."""
        return self.max_seq_len + self.max_draft_tokens

    @property
    def max_pages_per_seq(self) -> int:
        return -(-self.cache_len // self.page_size)

    @property
    def budget_gb(self) -> float:
        if self.kv_cache_gb is not None:
            return self.kv_cache_gb
        return DEFAULT_KV_CACHE_GB["cuda" if self.device.startswith("cuda") else "cpu"]

    @property
    def kv_buckets(self) -> tuple[int, ...]:
        """sdpa attention spans of static-shape loops: powers of two from min_kv_bucket, capped by the
        longest sequence (always included). Flex and eager loops attend at exact lengths instead."""
        spans, span = [], self.min_kv_bucket
        while span < self.cache_len:
            spans.append(span)
            span *= 2
        return (*spans, self.cache_len)
