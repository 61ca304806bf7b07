"""Moved to drafter.integrations.transformers_generate; this name re-exports it for one release (README)."""

from drafter.integrations.transformers_generate import (  # noqa: F401
    DEFAULT_NUM_DRAFT_TOKENS,
    SpeculationStats,
    speculative_decoding,
)
