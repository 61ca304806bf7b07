"""The k-step greedy decode loop over static buffers, shared by every execution path.

A batch bucket owns fixed input buffers (last context token, its position, the row's page table) and fixed
output buffers ([bucket, max_draft_tokens] tokens and probabilities). `run_loop` reads the inputs and writes
the outputs in place, feeding each argmax into the next step without leaving the device, so the same
function runs eagerly on CPU, compiled, or captured once into a CUDA graph and replayed (see
`engine/cuda_graphs.py`). Rows past the real batch are padding: their page table is all scratch page.
An engine that drafts ahead (engine/ahead.py) also keeps each step's top choices and their probabilities:
the likeliest tokens a target may put where it rejects a draft.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.attention import FlexReads, SdpaReads, gather_slots, physical_to_logical
from engine.model.qwen3 import Qwen3

StepFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def greedy_step(
    model: Qwen3,
    attention: str,  # "sdpa" | "flex"
    page_size: int,
    top_choices: int,  # 0: none
    tokens: torch.Tensor,  # [B] the token at `positions`
    positions: torch.Tensor,  # [B]
    page_table: torch.Tensor,  # [B, max_pages]
    inverse: torch.Tensor | None,  # [B, num_pages] physical_to_logical, for flex
    kv_len: int,  # sdpa: positions read per row
    rope: tuple[torch.Tensor, torch.Tensor],
    cache: tuple[torch.Tensor, torch.Tensor],
    view: slice | None = None,  # sdpa, one row on consecutive pages: its flat slots as a slice
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:  # next [B], its prob [B], top [B, 2n]
    query_positions = positions[:, None]  # [B, 1]
    write_index = page_table.gather(1, query_positions // page_size) * page_size + query_positions % page_size
    if attention == "flex":
        reads = FlexReads(page_table, inverse, query_positions, page_size, cache[0][0].shape[0])
    else:
        slots = view if view is not None else gather_slots(page_table, kv_len, page_size)
        reads = SdpaReads(slots, query_positions, kv_len)
    hidden = model(tokens[:, None], query_positions, write_index, reads, rope, cache)
    logits = model.logits(hidden[:, -1])  # [B, vocab] fp32
    best = logits.max(dim=-1)
    # argmax of the logits (first index on ties, as transformers' greedy search), and its softmax mass.
    next_tokens = logits.argmax(dim=-1)
    log_total = torch.logsumexp(logits, dim=-1)
    top = None
    if top_choices:  # ids and probabilities side by side, float32 (ids < 2**24 are exact): one output
        values, ids = logits.topk(top_choices, dim=-1)
        top = torch.cat((ids.float(), torch.exp(values - log_total[:, None])), 1)
    return next_tokens, torch.exp(best.values - log_total), top


class DecodeBuffers:
    """Static inputs and outputs of one batch bucket; filled in place by one host-to-device copy."""

    def __init__(self, bucket: int, max_steps: int, max_pages: int, device, top_choices: int = 0):
        self.bucket = bucket
        # One flat buffer, so one copy fills every input; each input a contiguous view of it.
        self.inputs = torch.zeros(bucket * (2 + max_pages), dtype=torch.long, device=device)
        self.tokens = self.inputs[:bucket]  # [bucket]
        self.positions = self.inputs[bucket : 2 * bucket]  # [bucket]
        self.page_table = self.inputs[2 * bucket :].view(bucket, max_pages)  # scratch page 0 past the end
        self.out_tokens = torch.zeros(bucket, max_steps, dtype=torch.long, device=device)
        self.out_probs = torch.zeros(bucket, max_steps, dtype=torch.float32, device=device)
        # [bucket, steps, 2 * top_choices]: each step's top ids (as floats), then their probabilities
        self.out_top = torch.zeros(bucket, max_steps, 2 * top_choices, dtype=torch.float32, device=device)
        pinned = torch.device(device).type == "cuda"
        self.host = torch.zeros(bucket * (2 + max_pages), dtype=torch.long, pin_memory=pinned)
        # Written through numpy: a few small writes cost ~1 us each there, ~4 us each as torch ops.
        self.host_array = self.host.numpy()
        self.max_pages = max_pages

    def fill(self, tokens: list[int], positions: list[int], page_tables: list[list[int]]) -> None:
        host, bucket = self.host_array, self.bucket
        host[:] = 0  # padding rows: token 0 at position 0 on the scratch page
        host[: len(tokens)] = tokens
        host[bucket : bucket + len(positions)] = positions
        table = host[2 * bucket :].reshape(bucket, self.max_pages)
        for row, pages in enumerate(page_tables):
            table[row, : len(pages)] = pages
        self.inputs.copy_(self.host, non_blocking=True)


def run_loop(
    step: StepFn,
    buffers: DecodeBuffers,
    num_steps: int,
    kv_len: int,
    rope,
    cache,
    view: slice | None = None,  # one row's kv_len flat slots, when on consecutive pages (every step's)
    flex_pages: int | None = None,  # the pool's page count when attention is flex
    stop: Callable[[], bool] | None = None,  # asked between steps (Python-driven loops only)
) -> int:
    """`num_steps` greedy steps from the buffers' inputs into their outputs; no host sync inside. Returns the
    steps run: fewer when `stop` said so between two steps."""
    # Fresh tensors, like the ones each step returns: compiled code guards on whether an input is a view.
    tokens, positions = buffers.tokens.clone(), buffers.positions.clone()
    inverse = None if flex_pages is None else physical_to_logical(buffers.page_table, flex_pages)
    extra = {} if view is None else {"view": view}
    for i in range(num_steps):
        if stop is not None and i and stop():
            return i
        tokens, probs, top = step(
            tokens, positions, buffers.page_table, inverse, kv_len, rope, cache, **extra
        )
        buffers.out_tokens[:, i].copy_(tokens)
        buffers.out_probs[:, i].copy_(probs)
        if top is not None:
            buffers.out_top[:, i].copy_(top)
        positions = positions + 1
    return num_steps
