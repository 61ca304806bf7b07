"""The k-step greedy decode loop over static buffers, shared by every execution path.

A batch bucket owns fixed input buffers (last context token, its position, the slot to read/write) and
fixed output buffers ([bucket, max_draft_tokens] tokens and probabilities). `run_loop` reads the inputs and
writes the outputs in place, feeding each argmax into the next step without leaving the device, so the
same function runs eagerly on CPU, compiled, or captured once into a CUDA graph and replayed (see
`engine/cuda_graphs.py`). Rows past the real batch are padding: they read and write the scratch slot.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.model import Qwen3

StepFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def greedy_step(
    model: Qwen3,
    tokens: torch.Tensor,  # [B] the token at `positions`
    positions: torch.Tensor,  # [B]
    slots: torch.Tensor,  # [B]
    kv_len: int,
    rope: tuple[torch.Tensor, torch.Tensor],
    cache: tuple[torch.Tensor, torch.Tensor],
    read_slots: torch.Tensor | slice | None = None,  # `slots` as a range, when they are contiguous
) -> tuple[torch.Tensor, torch.Tensor]:  # next token [B], its probability [B]
    reads = slots if read_slots is None else read_slots
    hidden = model(tokens[:, None], positions[:, None], slots[:, None], reads, kv_len, rope, cache)
    logits = model.logits(hidden[:, -1])  # [B, vocab] fp32
    best = logits.max(dim=-1)
    # argmax of the logits (first index on ties, as transformers' greedy search), and its softmax mass.
    next_tokens = logits.argmax(dim=-1)
    return next_tokens, torch.exp(best.values - torch.logsumexp(logits, dim=-1))


class DecodeBuffers:
    """Static inputs and outputs of one batch bucket; filled in place, never reallocated."""

    def __init__(self, bucket: int, max_steps: int, scratch_slot: int, device):
        self.bucket = bucket
        self.scratch_slot = scratch_slot
        self.tokens = torch.zeros(bucket, dtype=torch.long, device=device)  # [bucket]
        self.positions = torch.zeros(bucket, dtype=torch.long, device=device)  # [bucket]
        self.slots = torch.full((bucket,), scratch_slot, dtype=torch.long, device=device)  # [bucket]
        self.out_tokens = torch.zeros(bucket, max_steps, dtype=torch.long, device=device)
        self.out_probs = torch.zeros(bucket, max_steps, dtype=torch.float32, device=device)

    def fill(self, tokens: list[int], positions: list[int], slots: list[int]) -> None:
        n = len(tokens)
        pad = self.bucket - n
        host = torch.tensor(
            [tokens + [0] * pad, positions + [0] * pad, slots + [self.scratch_slot] * pad], dtype=torch.long
        )
        self.tokens.copy_(host[0], non_blocking=True)
        self.positions.copy_(host[1], non_blocking=True)
        self.slots.copy_(host[2], non_blocking=True)


def run_loop(
    step: StepFn, buffers: DecodeBuffers, num_steps: int, kv_len: int, rope, cache, read_slots=None
) -> None:
    """`num_steps` greedy steps from the buffers' inputs into their outputs; no host sync inside."""
    tokens, positions = buffers.tokens, buffers.positions
    extra = {} if read_slots is None else {"read_slots": read_slots}
    for i in range(num_steps):
        tokens, probs = step(tokens, positions, buffers.slots, kv_len, rope, cache, **extra)
        buffers.out_tokens[:, i].copy_(tokens)
        buffers.out_probs[:, i].copy_(probs)
        positions = positions + 1
