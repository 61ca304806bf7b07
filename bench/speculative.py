"""Greedy speculative decoding on the target's side, and the target-only greedy decoding it must equal.

A round asks a `draft(context, k)` callable for k tokens, runs ONE target forward pass over the tokens the
target's KV cache (a transformers DynamicCache) has not seen plus the drafts, keeps the longest prefix of
drafts equal to the target's greedy argmax and then the target's own next token, and crops the cache back to
the kept tokens. k is clipped to the tokens still wanted minus one, so exactly `max_new_tokens` come out with
nothing truncated; the round that wants a single token drafts nothing and the target decodes it alone.

What `Stats` counts: a round is one target verify pass. Tokens kept per round (accepted drafts + the
target's own token), averaged over every round, clipped final ones included, is the mean accepted tokens: a
perfect drafter scores k + 1 when no round is clipped. Per draft position i, the rounds that drafted it and
those in which it was accepted. With `stop_at_eos` the round that emits EOS keeps only the tokens up to it
(its acceptance counts are what the target verified). Without it both paths decode through EOS: target-only
`generate` with `min_new_tokens` masks EOS out of the argmax, so the verify pass masks it too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

Draft = Callable[[list[int], int], list[int]]  # (context, k) -> at most k draft tokens


@dataclass
class Stats:
    """What the timed rounds did; warm-up rounds go to a throwaway instance."""

    num_draft_tokens: int
    num_rounds: int = 0
    num_kept: int = 0
    drafted: list[int] = field(init=False)  # [k]: rounds that drafted position i
    accepted: list[int] = field(init=False)  # [k]: ... in which draft i was accepted
    draft_call_ms: list[float] = field(default_factory=list)

    def __post_init__(self):
        self.drafted = [0] * self.num_draft_tokens
        self.accepted = [0] * self.num_draft_tokens

    def record(self, num_drafts: int, num_accepted: int, num_kept: int) -> None:
        self.num_rounds += 1
        self.num_kept += num_kept
        for i in range(num_drafts):
            self.drafted[i] += 1
            self.accepted[i] += i < num_accepted

    @property
    def mean_accepted_tokens(self) -> float:
        return self.num_kept / self.num_rounds

    @property
    def acceptance_by_position(self) -> list[float | None]:
        """None for a position no round drafted (only when every round was clipped below it)."""
        return [a / d if d else None for a, d in zip(self.accepted, self.drafted, strict=True)]


def eos_ids(model) -> list[int]:
    eos = model.generation_config.eos_token_id
    return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)


@torch.inference_mode()
def target_greedy(model, prompt: list[int], max_new_tokens: int, stop_at_eos: bool = False) -> list[int]:
    """The reference: transformers' own greedy decoding, new tokens only."""
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        min_new_tokens=0 if stop_at_eos else max_new_tokens,
    )
    return out[0, len(prompt) :].tolist()


@torch.inference_mode()
def verify(model, cache, context: list[int], drafts: list[int], masked: list[int]) -> list[int]:
    """The target's greedy token after context + drafts[:i], for every i in 0..len(drafts), from one forward
    pass over the tokens the cache has not seen: the whole prompt in the first round, then the token the
    target chose last round and the new drafts."""
    ids = torch.tensor([context[cache.get_seq_length() :] + drafts], device=model.device)
    logits = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=len(drafts) + 1).logits
    logits[..., masked] = float("-inf")
    return logits[0].argmax(-1).tolist()


def speculative_greedy(
    model,
    draft: Draft,
    prompt: list[int],
    max_new_tokens: int,
    num_draft_tokens: int,
    stats: Stats,
    stop_at_eos: bool = False,
) -> list[int]:
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)  # between rounds: every context token but the last
    eos = eos_ids(model)
    context, new = list(prompt), []
    while len(new) < max_new_tokens:
        k = min(num_draft_tokens, max_new_tokens - len(new) - 1)  # leave room for the target's own token
        drafts = []
        if k > 0:
            started = time.perf_counter()
            drafts = draft(context, k)
            stats.draft_call_ms.append((time.perf_counter() - started) * 1e3)
        greedy = verify(model, cache, context, drafts, [] if stop_at_eos else eos)
        matches = (d == g for d, g in zip(drafts, greedy[:-1], strict=True))
        num_accepted = next((i for i, match in enumerate(matches) if not match), len(drafts))
        kept = drafts[:num_accepted] + [greedy[num_accepted]]
        end = next((i for i, t in enumerate(kept) if t in eos), None) if stop_at_eos else None
        if end is not None:
            kept = kept[: end + 1]
        stats.record(len(drafts), num_accepted, len(kept))
        context += kept
        new += kept
        # Drop the rejected drafts (crop takes minus the number to remove); the target's own token is fed
        # to the next round.
        cache.crop(len(context) - 1 - cache.get_seq_length())
        if end is not None:
            break
    return new
