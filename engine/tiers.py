"""How many greedy steps one decode loop runs: draft-length tiers and the step that feeds the last draft.

- Tiers: a CUDA graph captures a loop of a fixed number of steps, so graphs are captured per (batch bucket,
  tier) and a batch runs the smallest tier that covers its largest k (k = 4 pays for 4 steps, not 16).
  Eager and compiled loops are driven from Python and run the exact count.
- Decode one step ahead (static-shape paths: compiled or graphed). A k-step loop feeds back only k - 1 of
  its k drafts, so when the target accepts all k, the next call finds the k-th draft uncached and prefills
  it: an eager forward on every device, ~2,000 kernel launches of a 28-layer model on CUDA, the slowest
  call of the best conversations. One more step writes the k-th draft's keys too, so a fully accepted
  round has nothing to prefill and a growing conversation never leaves the captured/compiled loop. We
  chose this over a fixed-width captured "extend" step: it reuses the decode graph (no new graph family,
  no second mask path), and costs one decode step per call, which on CUDA is ~0.1 of the eager prefill
  it replaces. Eager loops keep exact k: there the 1-token prefill costs the same as the extra step, so
  the extra step would only be spent when rounds are rejected.
"""

from __future__ import annotations

import bisect


def draft_tiers(configured: tuple[int, ...], max_draft_tokens: int) -> tuple[int, ...]:
    """The configured tiers up to max_draft_tokens, plus max_draft_tokens (every k must have a tier)."""
    return tuple(sorted({t for t in configured if t < max_draft_tokens} | {max_draft_tokens}))


def tier_for(tiers: tuple[int, ...], num_draft_tokens: int) -> int:
    """The smallest tier >= num_draft_tokens (tiers sorted, the last one max_draft_tokens)."""
    return tiers[bisect.bisect_left(tiers, num_draft_tokens)]


def decode_steps(num_draft_tokens: int, tiers: tuple[int, ...] | None, ahead: bool) -> int:
    """Steps a loop runs for a batch whose largest k is `num_draft_tokens`: rounded up to a tier when the
    loop is captured (`tiers` given), plus the step that feeds the last draft back when `ahead`."""
    drafts = tier_for(tiers, num_draft_tokens) if tiers else num_draft_tokens
    return drafts + 1 if ahead else drafts
