"""Prefill: write the keys/values of requests' new context tokens into their pages, in few forward passes.

Each pass takes up to `chunk` tokens from each of several sequences, padded to a rectangle; padding tokens
write to the scratch page so they never touch a conversation. A long context is split into chunks, which
bounds the activation memory of one pass whatever the context length. Prefill is eager on every device and
reads through the SDPA path at exact lengths: a row on consecutive pages as a view, others gathered.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.attention import SdpaReads
from engine.model.qwen3 import Qwen3


@dataclass(frozen=True, slots=True)
class PrefillRow:
    pages: list[int]  # the sequence's page table
    tokens: np.ndarray  # [n] ids to write
    start: int  # position of tokens[0]


def flat_slots(pages: np.ndarray, positions: np.ndarray, page_size: int) -> np.ndarray:
    """Flat pool slot of each logical position of a sequence whose page table is `pages`."""
    return pages[positions // page_size] * page_size + positions % page_size


def contiguous(pages: list[int], num_positions: int, page_size: int) -> slice | None:
    """The flat slots of positions [0, num_positions) as a slice, if they lie on consecutive pages."""
    used = -(-num_positions // page_size)
    if (
        used
        and pages[used - 1] - pages[0] == used - 1
        and all(b - a == 1 for a, b in zip(pages[: used - 1], pages[1:used], strict=True))
    ):
        start = pages[0] * page_size
        return slice(start, start + num_positions)
    return None


def prefill(model: Qwen3, rows: list[PrefillRow], chunk: int, page_size: int, rope, cache) -> int:
    """Run the passes; returns how many forward passes it took."""
    done = [0] * len(rows)
    device = cache[0][0].device  # layer 0's keys
    passes = 0
    while True:
        active = [i for i, row in enumerate(rows) if done[i] < len(row.tokens)]
        if not active:
            return passes
        width = min(chunk, max(len(rows[i].tokens) - done[i] for i in active))
        active = active[: max(1, chunk // width)]  # at most `chunk` query tokens a pass
        ids = np.zeros((len(active), width), dtype=np.int64)
        positions = np.zeros((len(active), width), dtype=np.int64)
        write_index = np.tile(np.arange(width) % page_size, (len(active), 1))  # padding: the scratch page
        ends = []
        for r, i in enumerate(active):
            row, offset = rows[i], done[i]
            piece = row.tokens[offset : offset + width]
            n = len(piece)
            ids[r, :n] = piece
            positions[r, :n] = np.arange(row.start + offset, row.start + offset + n)
            write_index[r, :n] = flat_slots(np.asarray(row.pages), positions[r, :n], page_size)
            done[i] += n
            ends.append(row.start + offset + n)
        kv_len = max(ends)  # attend over exactly the positions written so far
        view = contiguous(rows[active[0]].pages, kv_len, page_size) if len(active) == 1 else None
        if view is None:
            read_slots = np.zeros((len(active), kv_len), dtype=np.int64)
            for r, i in enumerate(active):
                span = np.arange(ends[r])
                read_slots[r, : ends[r]] = flat_slots(np.asarray(rows[i].pages), span, page_size)
                read_slots[r, ends[r] :] = np.arange(ends[r], kv_len) % page_size  # masked, on scratch
        to_device = lambda a: torch.from_numpy(a).to(device, non_blocking=True)  # noqa: E731
        query_positions = to_device(positions)
        reads = SdpaReads(view if view is not None else to_device(read_slots), query_positions, kv_len)
        model(to_device(ids), query_positions, to_device(write_index), reads, rope, cache)
        passes += 1
