"""Speculative decoding for a transformers target with drafts from a drafter server: a decoding loop that
`generate` runs in place of its own when passed as `custom_generate`, and a plain function that calls it.

    out = target.generate(input_ids, custom_generate=speculative_decoding, draft_client=DraftClient(url),
                          max_new_tokens=64, do_sample=False)

A round asks the server for k drafts of the current context, runs ONE target forward pass over the tokens the
target's KV cache (a DynamicCache) has not seen plus the drafts, and keeps drafts while they are what the
target itself would choose, then one token of the target's own; the cache is cropped back to the kept tokens.
Every position goes through `generate`'s logits processors and every kept token through its stopping
criteria, in order, so the output is exactly what `generate` gives on its own: greedy token for token (EOS,
`max_new_tokens`, `min_new_tokens`, repetition penalty alike), and with `do_sample=True` the same
distribution, by verifying each greedy draft x as a point-mass proposal: keep it with probability p(x), else
sample from p with x removed. When the server sends nothing (down, overloaded, slow) a round decodes one
token on its own: slower, never wrong. Batch size 1 only. No streaming: transformers (5.24) hands a callable
custom_generate neither `streamer` nor `synced_gpus`. This module may import torch; drafter.client does not.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from drafter.client import DraftClient

DEFAULT_NUM_DRAFT_TOKENS = 8
SERVER_STAGES = ("receive", "queue", "engine", "host")  # Server-Timing stages that add up to a call
AUTO = "auto"


def check_num_draft_tokens(num_draft_tokens) -> None:
    if num_draft_tokens != AUTO and (type(num_draft_tokens) is not int or num_draft_tokens < 1):
        raise ValueError(f'num_draft_tokens must be a positive integer or "auto", got {num_draft_tokens!r}')


@dataclass
class SpeculationStats:
    """What the rounds did. A round is one target forward pass; `num_kept` counts the tokens rounds added
    (accepted drafts + the target's own), so `mean_accepted_tokens` is k + 1 for a perfect drafter."""

    num_draft_tokens: int | str  # k, or "auto": the server picks k per round
    num_rounds: int = 0
    num_kept: int = 0
    num_skipped: int = 0  # rounds the server answered no drafts to (see Drafts.skipped)
    drafted: list[int] = field(init=False)  # [k]: rounds that drafted position i ("auto": the longest yet)
    accepted: list[int] = field(init=False)  # [k]: ... in which draft i was accepted
    draft_call_ms: list[float] = field(default_factory=list)  # per call, as the target waited for it
    draft_engine_ms: list[float] = field(default_factory=list)  # per call, the server's engine time in it
    # per call, the server's whole time on it (Server-Timing: receive + queue + engine + host)
    draft_server_ms: list[float] = field(default_factory=list)
    verify_ms: list[float] = field(default_factory=list)  # per round, the target's forward pass and choice
    round_log: list[tuple[int, int, bool]] = field(default_factory=list)  # per round: drafts, kept, called
    # per round: of its drafts, how many (the first ones) the server's suffix index made
    suffix_log: list[int] = field(default_factory=list)

    def __post_init__(self):
        check_num_draft_tokens(self.num_draft_tokens)
        fixed = 0 if self.num_draft_tokens == AUTO else self.num_draft_tokens
        self.drafted = [0] * fixed
        self.accepted = [0] * fixed

    def record(
        self, num_drafts: int, num_accepted: int, num_kept: int, called: bool = True, num_suffix: int = 0
    ) -> None:
        self.num_rounds += 1
        self.num_kept += num_kept
        self.round_log.append((num_drafts, num_kept, called))
        self.suffix_log.append(num_suffix)
        grow = num_drafts - len(self.drafted)
        if grow > 0:
            self.drafted += [0] * grow
            self.accepted += [0] * grow
        for i in range(num_drafts):
            self.drafted[i] += 1
            self.accepted[i] += i < num_accepted

    @property
    def mean_accepted_tokens(self) -> float:
        return self.num_kept / self.num_rounds if self.num_rounds else 0.0

    @property
    def acceptance_by_position(self) -> list[float | None]:
        """None for a position no round drafted (only when every round was clipped below it)."""
        return [a / d if d else None for a, d in zip(self.accepted, self.drafted, strict=True)]


def speculative_decoding(
    model,
    input_ids: torch.LongTensor,
    logits_processor=None,
    stopping_criteria=None,
    generation_config=None,
    *,
    draft_client: DraftClient,
    num_draft_tokens: int | str = DEFAULT_NUM_DRAFT_TOKENS,
    speculation_stats: SpeculationStats | None = None,
    draft_source: str | None = None,
    **model_kwargs,
) -> torch.LongTensor:
    """`generate`'s `custom_generate` (it passes the prepared processors, criteria and config), or a plain
    function: called without a generation_config it runs `model.generate(input_ids, **model_kwargs)` with
    itself as custom_generate, so both uses share one loop and `generate`'s argument handling.

    `draft_client` is a DraftClient (or anything with `session()` whose `draft(context, k)` returns Drafts).
    `num_draft_tokens`: k per round, or "auto" (the server picks k per round from the session's acceptance
    and its load; drafts past the room left are dropped). `draft_source`: "model", "suffix" or "hybrid"
    (drafter.sessions.draft_source; None: the server's default). Returns the prompt followed by the new
    tokens, as `generate` does."""
    if generation_config is None:
        return model.generate(
            input_ids,
            custom_generate=speculative_decoding,
            draft_client=draft_client,
            num_draft_tokens=num_draft_tokens,
            speculation_stats=speculation_stats,
            draft_source=draft_source,
            **model_kwargs,
        )
    check_supported(model, input_ids, generation_config, model_kwargs)
    stats = speculation_stats or SpeculationStats(num_draft_tokens)
    if stats.num_draft_tokens != num_draft_tokens:
        raise ValueError("speculation_stats was made for another num_draft_tokens")
    with draft_client.session() as session:
        output = decode(
            model,
            input_ids,
            logits_processor,
            stopping_criteria,
            generation_config,
            session,
            num_draft_tokens,
            stats,
            draft_source,
        )
    return output


def check_supported(model, input_ids, generation_config, model_kwargs) -> None:
    if input_ids.shape[0] != 1:
        raise ValueError(
            f"speculative_decoding decodes one sequence at a time, got a batch of {input_ids.shape[0]}"
        )
    if model.config.is_encoder_decoder:
        raise ValueError("speculative_decoding needs a decoder-only target")
    if generation_config.num_beams != 1 or generation_config.return_dict_in_generate:
        raise ValueError("speculative_decoding supports neither beams nor return_dict_in_generate")
    mask = model_kwargs.get("attention_mask")
    if mask is not None and not bool(mask.all()):
        raise ValueError("speculative_decoding takes an unpadded prompt (an attention_mask of ones)")


@torch.inference_mode()
def decode(
    model, input_ids, logits_processor, stopping_criteria, config, session, num_draft_tokens, stats, source
) -> torch.LongTensor:
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)  # between rounds: every context token but the last
    context = input_ids[0].tolist()
    while True:
        # Leave room for the target's own token: at most max_length tokens come out, nothing is truncated.
        room = config.max_length - len(context) - 1
        k = min(num_draft_tokens, room) if num_draft_tokens != AUTO else AUTO
        drafts, num_suffix = (
            draft(session, context, k, room, stats, model.config.vocab_size, source) if room > 0 else ([], 0)
        )
        started = time.perf_counter()
        logits = verify_logits(model, cache, context, drafts)
        kept, num_accepted, done = choose(
            logits, context, drafts, logits_processor, stopping_criteria, config
        )
        stats.verify_ms.append((time.perf_counter() - started) * 1e3)
        stats.record(len(drafts), num_accepted, len(kept), called=room > 0, num_suffix=num_suffix)
        context += kept
        if done:
            return torch.tensor([context], dtype=input_ids.dtype, device=input_ids.device)
        # Drop the rejected drafts (crop takes minus the number to remove); the target's own token is fed
        # to the next round.
        cache.crop(len(context) - 1 - cache.get_seq_length())


def draft(
    session, context: list[int], k, room: int, stats: SpeculationStats, vocab_size: int, source: str | None
) -> tuple[list[int], int]:
    """The round's drafts, and how many of them (the first ones) the server's suffix index made."""
    started = time.perf_counter()
    answer = session.draft(context, k) if source is None else session.draft(context, k, source=source)
    stats.draft_call_ms.append((time.perf_counter() - started) * 1e3)
    stats.num_skipped += answer.skipped is not None
    timing = answer.server_timing_ms
    if "engine" in timing:
        stats.draft_engine_ms.append(timing["engine"])
        stats.draft_server_ms.append(sum(timing.get(stage, 0.0) for stage in SERVER_STAGES))
    drafts = answer.tokens[: room if k == AUTO else k]  # never trust a server to respect k
    if drafts and not 0 <= min(drafts) <= max(drafts) < vocab_size:
        raise ValueError(f"the drafter sent token ids outside the target's vocabulary [0, {vocab_size})")
    return drafts, min(getattr(answer, "suffix_tokens", 0), len(drafts))


def verify_logits(model, cache, context: list[int], drafts: list[int]) -> torch.Tensor:
    """[len(drafts) + 1, vocab] fp32 logits: the target's next-token scores after context + drafts[:i], from
    one forward pass over the tokens the cache has not seen (the whole prompt in the first round)."""
    ids = torch.tensor([context[cache.get_seq_length() :] + drafts], device=model.device)
    logits = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=len(drafts) + 1).logits
    return logits[0].float()


def choose(
    logits, context, drafts, logits_processor, stopping_criteria, config
) -> tuple[list[int], int, bool]:
    """The tokens this round keeps, how many of them are accepted drafts, and whether generation is done.
    Position i is scored only once drafts[:i] are kept, so processors see the real sequence."""
    sequence = torch.tensor([context], device=logits.device)
    kept: list[int] = []
    for i in range(len(drafts) + 1):
        scores = logits_processor(sequence, logits[i : i + 1])  # [1, vocab]
        proposal = drafts[i] if i < len(drafts) else None
        token = sample(scores, proposal) if config.do_sample else int(scores.argmax(-1))
        kept.append(token)
        sequence = torch.cat([sequence, sequence.new_tensor([[token]])], dim=-1)
        accepted = token == proposal
        if bool(stopping_criteria(sequence, scores).all()):
            return kept, i + accepted, True
        if not accepted:
            return kept, i, False
    raise AssertionError("unreachable: the last position has no proposal")


def sample(scores: torch.Tensor, proposal: int | None) -> int:
    """A token from p = softmax(scores), given a point-mass proposal x: x itself with probability p(x), else
    a sample from p with x removed (the residual (p - 1_x)+, renormalized), so the token is p-distributed."""
    probs = scores[0].softmax(-1)
    if proposal is not None:
        if torch.rand(()) < probs[proposal]:
            return proposal
        probs = probs.clone()
        probs[proposal] = 0
    return int(torch.multinomial(probs, 1))
