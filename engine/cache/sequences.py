"""The page table of every cached conversation, and where each request of a batch is placed.

A *sequence* is one conversation's cached state: the token ids whose keys/values its pages hold (its last
context and the drafts fed back into the decode loop) and the pages, in logical order. A request either
*continues* a sequence (engine/cache/continuation.py) — the one its session hint names, else one whose whole
last context it repeats or extends (the target accepted some drafts and added its own) and that no other
session holds — or starts a new one. Only a request naming a sequence's own session may cut it back below its
last context (a rollback): a context that is a strict prefix of another conversation's (a shorter conversation
on the same system prompt), or any context beside another session's (parallel samples of one prompt, retries,
best-of-n under their own session names), starts its own sequence on the other's full pages, found by content,
and computes only its own partial page, so it never takes the other's cache. (A sessionless request that
repeats a sessionless sequence's last context exactly continues it: its drafts are the same, so the sequence's
contents are too, and a retrying client does not pile up copies.) Either way it keeps the longest cached
prefix it can find, its own or, through the prefix index, any conversation's full pages, and prefills the
rest.
Pages it will write must be its own: a page another sequence also holds is never written, so the reused
prefix stops at that page's start (the partly matching page is recomputed, at most page_size - 1 tokens).

A *branch* (engine/ahead.py) is a sequence drafted ahead for a session's likely next context: placed by
content from its session's sequence (the full pages shared, the partly filled one copied: `Placement.copy`,
which the engine applies before any write), never continued by a request, and kept apart until the
session's next call adopts one (it becomes the session's sequence) or drops them all.

When pages run out, branches go first, then idle indexed pages, then whole sequences not in the running
batch, least recently used first; placing a branch never evicts anything but other branches and idle
pages. Placement only changes bookkeeping; a sequence's tokens are cut to its reused prefix before
anything is written, so a batch that fails midway leaves every sequence describing what its pages really
hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine.cache.allocator import PageAllocator
from engine.cache.continuation import continued, continues_latest, hinted
from engine.cache.prefix_index import PrefixIndex
from engine.requests import DraftError


class CacheFull(DraftError):
    """The batch's pages do not fit beside the other requests of the same batch. The engine then drafts the
    batch in parts; one request always fits (the config guarantees it), so were it ever to reach the server
    it is refused as a request, never taken for a device failure."""


@dataclass(eq=False, slots=True)
class Sequence:
    tokens: np.ndarray  # ids whose keys/values its pages hold, positions 0..len-1
    pages: list[int] = field(default_factory=list)
    context_len: int = 0  # length of the last request's context; the rest of `tokens` are fed-back drafts
    session: str | None = None
    last_used: int = 0
    branch_of: str | None = None  # the session a branch was drafted ahead for; None: not a branch


@dataclass(frozen=True, slots=True)
class Placement:
    sequence: Sequence
    reuse: int  # context tokens whose keys/values are already cached
    shared: int  # of those, tokens on pages found through the prefix index (other conversations' work)
    evicted: int  # sequences evicted to make room
    copy: tuple[int, int] | None = None  # (from, to): a branch's partial page, to copy before any write


@dataclass(slots=True)
class CacheCounters:
    shared_tokens: int = 0
    evicted_sequences: int = 0
    evicted_pages: int = 0
    evicted_branches: int = 0


class SequenceTable:
    def __init__(self, num_pages: int, page_size: int, max_pages_per_seq: int):
        self.page_size = page_size
        self.allocator = PageAllocator(num_pages)
        self.index = PrefixIndex(num_pages, page_size, max_pages_per_seq)
        self.sequences: list[Sequence] = []
        self.by_session: dict[str, Sequence] = {}
        self.counters = CacheCounters()
        self.tick = 0
        self.latest: Sequence | None = None  # the sequence placed last: a lone client's conversation
        self.branches: dict[str, list[Sequence]] = {}  # by session, in placement order

    # -- placing a batch ------------------------------------------------------------------------------

    def place(
        self, batch: list[tuple[np.ndarray, str | None, int]], branch_of: str | None = None
    ) -> list[Placement]:
        """A sequence for each (context, session, positions to hold) of one batch, with its pages allocated
        for every position the batch will write; no sequence serves two requests of one batch. With
        `branch_of`, every one is a new branch of that session (the sessions given are ignored)."""
        taken: set[int] = set()
        return [
            self.place_one(tokens, session, num_positions, taken, branch_of)
            for tokens, session, num_positions in batch
        ]

    def place_one(
        self,
        tokens: np.ndarray,
        session: str | None,
        num_positions: int,
        taken: set[int],
        branch_of: str | None = None,
    ):
        size = self.page_size
        reusable = len(tokens) - 1  # the last context token is always fed to the decode loop
        full_pages = reusable // size
        target, own = (None, -1) if branch_of else hinted(self.by_session, tokens, session, taken)
        source, copied = None, None  # a branch: the session's sequence it forks from, its pages shared
        if branch_of:
            source, own = hinted(self.by_session, tokens, branch_of, set())
        if target is None and not branch_of:
            target, own = continues_latest(self.latest, size, tokens, session, taken, full_pages)
        # A hinted or continued sequence holding every full page of the context leaves the index nothing to
        # offer (a growing conversation's usual call): skip hashing and looking up its whole context.
        matched = [] if own >= full_pages * size else self.index.match(tokens, full_pages)
        if target is None and not branch_of:
            target, own = continued(self.sequences, tokens, session, matched, taken)
        if own >= len(matched) * size and (target or source) is not None:
            kept, reuse = (target or source).pages[: -(-own // size)], own
        else:
            kept, reuse = matched, len(matched) * size
        # A partly reused page is the continued sequence's own (index matches are whole pages); it is
        # written from `reuse` on, so only if no other sequence holds it too. A branch never writes its
        # session's: it gets a copy (one page, on the device) instead of recomputing up to page_size - 1 tokens.
        if reuse % size and source is not None:
            copied, kept = kept[-1], kept[:-1]
        elif reuse % size and self.allocator.refs[kept[-1]] > 1:
            kept, reuse = kept[:-1], reuse - reuse % size
        sequence = target or Sequence(tokens[:0])
        had, keeping = set(sequence.pages), set(kept)
        newly = [page for page in kept if page not in had]
        self.hold(newly)
        self.release([page for page in sequence.pages if page not in keeping])
        if reuse % size and copied is None:
            self.index.forget(kept[-1])  # its unreused positions are about to be overwritten
        sequence.tokens, sequence.pages = tokens[:reuse].copy(), list(kept)
        taken.add(id(sequence))
        if target is None:
            self.sequences.append(sequence)
        needed = -(-num_positions // size) - len(kept)
        if kept:
            self.reclaim_after(kept[-1], needed)
        try:
            evicted = self.make_room(needed, taken, evict_sequences=not branch_of)
        except CacheFull:
            if branch_of:  # a branch that does not fit is not placed at all
                self.drop(sequence)
            raise
        sequence.pages += self.allocator.take(needed, kept[-1] if kept else None)
        self.allocator.refs[sequence.pages[len(kept) :]] += 1
        if copied is not None:  # the first new page receives the copy: its positions count as reused
            copied = (copied, sequence.pages[len(kept)])
        if branch_of:
            sequence.branch_of, sequence.context_len = branch_of, len(tokens)
            self.branches.setdefault(branch_of, []).append(sequence)
        else:
            self.bind(sequence, session, len(tokens))
        shared = min(reuse, len(newly) * size)
        self.counters.shared_tokens += shared
        return Placement(sequence, reuse, shared, evicted, copied)

    def reuse_estimate(self, tokens: np.ndarray, session: str | None) -> int:
        """About how many of the context's tokens `place` would find cached, by its cheap paths only: the
        sequence the session names, or the one placed last if the request continues it (no hashing: the
        prefix index may find more). For deciding where a request runs, never for placing it; read only
        while no batch is being placed."""
        target, own = hinted(self.by_session, tokens, session, set())
        if target is None:
            target, own = continues_latest(self.latest, self.page_size, tokens, session, set(), 0)
        return max(own, 0)

    def bind(self, sequence: Sequence, session: str | None, context_len: int) -> None:
        if sequence.session is not None and self.by_session.get(sequence.session) is sequence:
            del self.by_session[sequence.session]
        if session is not None:
            previous = self.by_session.get(session)
            if previous is not None and previous is not sequence:
                previous.session = None
            self.by_session[session] = sequence
        sequence.session, sequence.context_len = session, context_len
        self.tick += 1
        sequence.last_used = self.tick
        self.latest = sequence

    def commit(self, placement: Placement, tokens: np.ndarray) -> None:
        """After a successful draft: the sequence's pages hold keys/values for exactly `tokens`."""
        sequence = placement.sequence
        sequence.tokens = tokens
        self.index.record(sequence.pages, tokens, placement.reuse)

    # -- pages ----------------------------------------------------------------------------------------

    def hold(self, pages: list[int]) -> None:
        for page in pages:
            self.index.idle.pop(page, None)
        self.allocator.refs[pages] += 1

    def release(self, pages: list[int]) -> None:
        """Pages a sequence no longer holds: findable while idle if indexed, else free at once."""
        if not pages:
            return
        self.allocator.refs[pages] -= 1
        unheld = [page for page in pages if self.allocator.refs[page] == 0]
        for page in unheld:
            if self.index.is_indexed(page):
                self.index.idle[page] = None
        self.allocator.give_back([page for page in unheld if not self.index.is_indexed(page)])

    def reclaim_after(self, page: int, count: int) -> None:
        """Free the idle pages right after `page`, so the sequence ending there grows onto consecutive pages
        (which the CPU attention reads as a view). They are typically its own rejected drafts, released a
        moment ago: worth less than keeping a growing conversation contiguous."""
        for following in range(page + 1, min(page + 1 + count, len(self.allocator.free))):
            if following not in self.index.idle:
                return
            self.index.forget(following)
            self.allocator.give_back([following])
            self.counters.evicted_pages += 1

    def make_room(self, needed: int, taken: set[int], evict_sequences: bool = True) -> int:
        """Free pages until `needed` are free: branches first, then idle pages, then idle sequences, LRU
        first (only branches and idle pages unless `evict_sequences`)."""
        evicted = 0
        while self.allocator.num_free < needed:
            branch = next((b for bs in self.branches.values() for b in bs if id(b) not in taken), None)
            if branch is not None:
                self.drop(branch)
                self.counters.evicted_branches += 1
                continue
            if self.index.idle:
                page = next(iter(self.index.idle))
                self.index.forget(page)
                self.allocator.give_back([page])
                self.counters.evicted_pages += 1
                continue
            idle = [s for s in self.sequences if id(s) not in taken] if evict_sequences else []
            if not idle:
                raise CacheFull(f"{needed} pages needed, {self.allocator.num_free} free")
            self.drop(min(idle, key=lambda s: s.last_used))
            evicted += 1
            self.counters.evicted_sequences += 1
        return evicted

    def drop(self, sequence: Sequence) -> None:
        self.release(sequence.pages)
        sequence.pages, sequence.tokens = [], sequence.tokens[:0]
        self.sequences.remove(sequence)
        if sequence.branch_of is not None:
            siblings = self.branches.get(sequence.branch_of, [])
            if sequence in siblings:
                siblings.remove(sequence)
            if not siblings:
                self.branches.pop(sequence.branch_of, None)
        if self.latest is sequence:
            self.latest = None
        if sequence.session is not None and self.by_session.get(sequence.session) is sequence:
            del self.by_session[sequence.session]

    # -- branches -------------------------------------------------------------------------------------

    def drop_branches(self, session: str) -> None:
        for branch in list(self.branches.get(session, ())):
            self.drop(branch)

    def adopt(self, session: str, branch: Sequence) -> bool:
        """The session's next call matched `branch`: it becomes the session's sequence, and the session's old
        sequence and other branches go (their pages shared with it stay, counted). False if it was evicted."""
        if branch not in self.branches.get(session, ()):
            return False
        self.branches[session].remove(branch)
        self.drop_branches(session)
        old = self.by_session.get(session)
        if old is not None:
            self.drop(old)
        branch.branch_of = None
        self.bind(branch, session, branch.context_len)
        return True

    @property
    def branch_pages(self) -> int:
        """Pages held by branches and by nothing else."""
        pages = [page for bs in self.branches.values() for b in bs for page in b.pages]
        return (
            int((self.allocator.refs[np.unique(np.asarray(pages, dtype=np.int64))] == 1).sum())
            if pages
            else 0
        )

    @property
    def pages_in_use(self) -> int:
        return int((self.allocator.refs > 0).sum())
