"""How one engine serves a model: device, precision, KV-cache budget and the static sizes (the model's own
shape is engine/model/config.py's)."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.model.config import ConfigError
from engine.tiers import draft_tiers

__all__ = ["ConfigError", "EngineConfig"]  # ConfigError: refused configs of either kind


def _default_buckets() -> tuple[int, ...]:
    return (1, 2, 4, 8)


MAX_TOP_CHOICES = 8
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
    # Top choices each decode step keeps (ids and probabilities), for drafting ahead (engine/ahead.py); 0: off.
    top_choices: int = 0

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
        if not isinstance(self.top_choices, int) or not 0 <= self.top_choices <= MAX_TOP_CHOICES:
            raise ConfigError(
                f"top_choices must be an integer in [0, {MAX_TOP_CHOICES}], got {self.top_choices!r}"
            )
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
