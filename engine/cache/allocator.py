"""Which pages of the pool are free, and how many sequences hold each page.

A page held by no sequence is either free or idle in the prefix index (its contents still findable by
content, evicted least recently used first; see `prefix_index.py`). Allocation keeps a sequence's pages
consecutive where it can: a conversation that grows page by page gets the page after its last one, and a
new run starts in the largest free gap, a little after its start, so the run before it keeps room to grow
(`GROWTH_ROOM` pages, ~30 rounds of 16 drafts at 64 positions a page) while the rest of the gap stays whole
for long contexts to come (centring new runs halved the largest gap each time: three cases of 2k, 8k and
32k split the 32k one, which then gathered a copy every step, 1.55x slower on bench-cpu). Consecutive pages
are one contiguous slice of the flat pool, which the CPU attention reads as a view instead of a gather.
"""

from __future__ import annotations

import numpy as np

from engine.cache.pool import SCRATCH_PAGE

GROWTH_ROOM = 16  # pages left free after the previous run when a new one starts


class PageAllocator:
    def __init__(self, num_pages: int):
        self.free = np.ones(num_pages, dtype=bool)  # [num_pages]
        self.free[SCRATCH_PAGE] = False
        self.refs = np.zeros(num_pages, dtype=np.int32)  # [num_pages] sequences holding each page
        self.num_free = num_pages - 1

    def take(self, count: int, after: int | None) -> list[int]:
        """`count` free pages, continuing after page `after` where those are free; the caller has made sure
        at least `count` are free."""
        pages: list[int] = []
        page = None if after is None else after + 1
        while len(pages) < count:
            if page is None or page >= len(self.free) or not self.free[page]:
                page = self.gap_start(count - len(pages))
            self.free[page] = False
            pages.append(page)
            page += 1
        self.num_free -= count
        return pages

    def gap_start(self, count: int) -> int:
        """Where to start a run of `count` pages: in the largest free gap, GROWTH_ROOM pages in when it has
        them to spare (a gap at the pool's start has no run before it to grow)."""
        edges = np.diff(np.concatenate(([0], self.free.view(np.int8), [0])))
        starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
        widest = int(np.argmax(ends - starts))
        start, spare = int(starts[widest]), int(ends[widest] - starts[widest] - count)
        after_a_run = start > SCRATCH_PAGE + 1
        return start + (min(GROWTH_ROOM, spare // 2) if after_a_run and spare > 0 else 0)

    def give_back(self, pages) -> None:
        self.free[pages] = True
        self.num_free += len(pages)
