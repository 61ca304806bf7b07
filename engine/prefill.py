"""Prefill: write the keys/values of requests' new context tokens into their slots, in few forward passes.

Each pass takes up to `chunk` tokens from each of several sequences, padded to a rectangle; padding tokens
write to the scratch slot so they never touch a conversation. A long context is split into chunks, which
bounds the activation memory of one pass whatever the context length.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.model import Qwen3


@dataclass(frozen=True, slots=True)
class PrefillRow:
    slot: int
    tokens: np.ndarray  # [n] ids to write
    start: int  # position of tokens[0]


def prefill(
    model: Qwen3,
    rows: list[PrefillRow],
    chunk: int,
    scratch_slot: int,
    rope,
    cache,
) -> int:
    """Run the passes; returns how many forward passes it took."""
    done = [0] * len(rows)
    device = cache[0].device
    passes = 0
    while True:
        active = [i for i, row in enumerate(rows) if done[i] < len(row.tokens)]
        if not active:
            return passes
        width = min(chunk, max(len(rows[i].tokens) - done[i] for i in active))
        active = active[: max(1, chunk // width)]  # at most `chunk` query tokens a pass
        ids = np.zeros((len(active), width), dtype=np.int64)
        positions = np.zeros((len(active), width), dtype=np.int64)
        write_slots = np.full((len(active), width), scratch_slot, dtype=np.int64)
        read_slots = np.array([rows[i].slot for i in active], dtype=np.int64)
        end = 0
        for r, i in enumerate(active):
            row, offset = rows[i], done[i]
            piece = row.tokens[offset : offset + width]
            n = len(piece)
            ids[r, :n] = piece
            positions[r, :n] = np.arange(row.start + offset, row.start + offset + n)
            write_slots[r, :n] = row.slot
            done[i] += n
            end = max(end, row.start + offset + n)
        to_device = lambda a: torch.from_numpy(a).to(device, non_blocking=True)  # noqa: E731
        model(
            to_device(ids),
            to_device(positions),
            to_device(write_slots),
            to_device(read_slots),
            end,  # prefill is always eager: attend over exactly the positions written so far
            rope,
            cache,
        )
        passes += 1
