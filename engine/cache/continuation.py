"""Which cached sequence a request continues, by the sequence table's rules (engine/cache/sequences.py):
the one its session hint names; else the one placed last, if the request extends its last context past
every full page (a lone client's conversation: nothing else is searched); else one whose whole last
context it repeats or extends and that no other session holds. Each answer comes with how many of the
request's tokens (all but the last, which the decode loop always feeds) that sequence already holds.

Pure reads of the table's sequences, for `SequenceTable.place` and `reuse_estimate`; they change nothing,
and know nothing of pages beyond the page size or of the prefix index.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from engine.cache.sequences import Sequence


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differs = a[:n] != b[:n]
    return int(differs.argmax()) if differs.any() else n


def covers_last_context(tokens: np.ndarray, reuse: int, sequence: Sequence) -> bool:
    """Whether a context repeats or extends the sequence's last context, given `reuse`, its tokens but the
    last in common with the sequence's: past the last context, or exactly it (the last token included)."""
    if reuse >= sequence.context_len:
        return True
    last = sequence.context_len - 1
    return (
        reuse == last == len(tokens) - 1
        and last < len(sequence.tokens)
        and tokens[last] == sequence.tokens[last]
    )


def hinted(
    by_session: dict[str, Sequence], tokens: np.ndarray, session: str | None, taken: set[int]
) -> tuple[Sequence | None, int]:
    """The sequence the request's session hint names, and how many of its tokens the request reuses."""
    sequence = by_session.get(session) if session is not None else None
    if sequence is None or id(sequence) in taken:
        return None, -1
    return sequence, common_prefix(tokens[: len(tokens) - 1], sequence.tokens)


def continues_latest(
    latest: Sequence | None,
    page_size: int,
    tokens: np.ndarray,
    session: str | None,
    taken: set[int],
    full_pages: int,
) -> tuple[Sequence | None, int]:
    """The sequence placed last, if this request extends its last context past every full page (a lone
    client's conversation): no other sequence can then offer more than part of a page, so neither the
    index nor the other sequences are searched."""
    sequence = latest
    if sequence is None or not may_continue(sequence, session, taken):
        return None, -1
    reuse = common_prefix(tokens[: len(tokens) - 1], sequence.tokens)
    if covers_last_context(tokens, reuse, sequence) and reuse >= full_pages * page_size:
        return sequence, reuse
    return None, -1


def may_continue(sequence: Sequence, session: str | None, taken: set[int]) -> bool:
    """Unhinted, a request may continue a sequence no other request of its batch has and no other
    session holds (a sessionless one continues only sessionless sequences)."""
    return id(sequence) not in taken and sequence.session in (None, session) and sequence.branch_of is None


def continued(
    sequences: list[Sequence], tokens: np.ndarray, session: str | None, matched: list[int], taken: set[int]
) -> tuple[Sequence | None, int]:
    """Without a hint: the sequence whose whole last context this request extends, and how many of its
    tokens the request reuses. With `matched` (the prefix index's full pages for it), only a sequence that
    holds the last of them in the same place."""
    reusable = tokens[: len(tokens) - 1]
    best, best_reuse = None, -1
    for sequence in sequences:
        if not may_continue(sequence, session, taken) or (
            matched and sequence.pages[len(matched) - 1 : len(matched)] != matched[-1:]
        ):
            continue
        reuse = common_prefix(reusable, sequence.tokens)
        if covers_last_context(tokens, reuse, sequence) and reuse > best_reuse:
            best, best_reuse = sequence, reuse
    return best, best_reuse
