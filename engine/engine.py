"""The drafting engine: token ids in, greedy draft token ids out.

It owns the model, the paged KV cache (the page pool and the sequence table over it) and is called by one
thread at a time (compiled and graph-captured code is not thread-safe; the server's engine thread, or its
event loop for a lone short draft while that thread is idle). A batch of requests is served
as: place each on a sequence and keep the longest cached prefix (its own, or any conversation's full pages),
prefill only the new tokens, then one k-step greedy decode loop for the whole batch with a single host sync
at the end. The engine knows nothing of HTTP or tokenizers.
"""

from __future__ import annotations

import bisect
import functools
import logging
import time
from collections.abc import Collection, Generator

import numpy as np
import torch

from engine.ahead import BranchOps, DraftingAhead, top_choices
from engine.cache.pool import PagePool, bytes_per_token
from engine.cache.sequences import CacheFull, SequenceTable
from engine.config import ConfigError, EngineConfig
from engine.decode import DecodeBuffers, greedy_step, run_loop
from engine.describe import describe
from engine.lifecycle import Lifecycle, State
from engine.model.cpu_linears import use_cpu_linears
from engine.model.loader import LoadedModel, load_model
from engine.model.qwen3 import rope_table
from engine.prefill import PrefillRow, contiguous, prefill
from engine.recompiles import RecompileGuard
from engine.requests import DraftError, DraftRequest, DraftResult, EngineStats, as_token_array
from engine.swap import WeightSwap, run_through
from engine.tiers import decode_steps
from engine.warmup import Warmup

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class Engine(Warmup, DraftingAhead):
    def __init__(self, loaded: LoadedModel, config: EngineConfig, lifecycle: Lifecycle | None = None):
        self.config = config
        self.loaded = loaded
        self.model = loaded.model
        self.lifecycle = lifecycle or Lifecycle()
        for why in loaded.fallbacks:
            self.lifecycle.fall_back(why)
        self.device = torch.device(config.device)
        model_config, dtype = loaded.config, DTYPES[config.dtype]
        # Eager on the CPU: decode-speed linears (engine/model/cpu_linears.py). The GPU keeps the model as loaded,
        # and so does torch.compile (inductor cannot lower an opaque oneDNN weight that is a graph input).
        on_cpu_eager = self.device.type == "cpu" and not config.compile
        self.packed_linears, why_dequantized = (
            use_cpu_linears(self.model, dtype) if on_cpu_eager else (0, None)
        )
        if why_dequantized:
            self.lifecycle.fall_back(why_dequantized)
        budget_tokens = config.kv_cache_tokens or int(
            config.budget_gb * 2**30 / bytes_per_token(model_config, dtype)
        )
        num_pages = budget_tokens // config.page_size + 1  # + the scratch page
        if num_pages - 1 < config.max_pages_per_seq:
            raise ConfigError(
                f"the KV-cache budget holds {budget_tokens} positions, fewer than one request of max_seq_len + "
                f"max_draft_tokens ({config.cache_len}): raise --kv-cache-gb or lower --max-seq-len"
            )
        self.pool = PagePool(
            model_config, num_pages, config.page_size, dtype, self.device, zeroed=config.attention == "flex"
        )
        self.reset_cache()
        self.rope = tuple(t.to(self.device) for t in rope_table(model_config, config.cache_len))
        self.buffers = {
            b: DecodeBuffers(
                b, config.max_draft_tokens + 1, config.max_pages_per_seq, self.device, config.top_choices
            )
            for b in config.buckets
        }
        self.step = functools.partial(
            greedy_step, self.model, config.attention, config.page_size, config.top_choices
        )
        # Eager loops rank top choices only for batches that ask (`DraftRequest.choices`).
        self.plain_step = functools.partial(greedy_step, self.model, config.attention, config.page_size, 0)
        self.flex_pages = num_pages if config.attention == "flex" else None
        self.graphs = None  # CapturedLoops once captured
        self.static_shapes = False  # compiled or captured: every loop runs in a padded batch bucket
        self.eager_buffers: dict[int, DecodeBuffers] = {}
        self.stats = EngineStats()
        self.recompiles = RecompileGuard()
        self.branch_ops = BranchOps()  # adoptions and drops asked from other threads, applied by the next job
        self.branch_pages = 0
        self.ahead_step_ms: float | None = None  # wall time per step of ahead loops, a moving average
        self.weights_version = 0  # 0 as loaded, +1 per swap committed

    @classmethod
    def load(cls, source: str, config: EngineConfig, lifecycle: Lifecycle | None = None) -> Engine:
        lifecycle = lifecycle or Lifecycle()
        with lifecycle.stage(State.LOADING):
            loaded = load_model(source, DTYPES[config.dtype], config.device)
            return cls(loaded, config, lifecycle)

    def reset_cache(self) -> None:
        """Forget every cached conversation (the pool's contents are simply no longer referenced)."""
        cfg = self.config
        self.table = SequenceTable(self.pool.num_pages, cfg.page_size, cfg.max_pages_per_seq)

    def swap_weights(self, tensors: dict[str, torch.Tensor], shared: Collection[str] = ()) -> int:
        """Serve new weights from the next batch on (`weight_swap` in one go). Returns the new weights
        version."""
        return run_through(self.weight_swap(tensors, shared))

    def weight_swap(
        self, tensors: dict[str, torch.Tensor], shared: Collection[str] = ()
    ) -> Generator[None, None, int]:
        """New weights, a checkpoint's tensors in the served layout (export/versions.py), made ready beside
        the live ones a piece at a time (engine/swap.py: between two pieces, a yield, batches may run on the
        old weights), then committed: copied into the live tensors, so compiled code and graphs stay valid.
        `shared`: names of tensors whose values the engine serves already (what a new version shares with
        the live one): checked like the rest, neither made again nor copied. Every cached sequence,
        prefix-index entry and drafted-ahead branch holds keys and values of the old weights, so all are
        dropped, with queued branch adoptions (they name the old table's sequences). Run it on the thread
        that drafts, between batches. Returns the new weights version."""
        swap = WeightSwap(self.loaded, tensors, DTYPES[self.config.dtype], self.device, shared)
        yield from swap.pieces()
        began = time.perf_counter()
        # Raised before the copy: a drafted-ahead answer read meanwhile on the event loop is then stale.
        self.weights_version += 1
        swap.commit()
        self.branch_ops.queue.clear()
        self.reset_cache()
        self.count_branch_pages()
        self.sync()
        commit_ms = (time.perf_counter() - began) * 1e3
        log.info("weights version %d in (commit %.1f ms)", self.weights_version, commit_ms)
        return self.weights_version

    # -- drafting -------------------------------------------------------------------------------------

    def kv_span(self, num_positions: int) -> int:
        """Positions an sdpa decode loop attends over. Eager reads exactly those (rounding 4.1k up to 8k costs
        1.3x per call on CPU); compiled and captured loops round up to a span they were built for; flex
        reads each row's own pages at its exact length whatever the path."""
        if self.flex_pages:
            return 0
        if not self.static_shapes:
            return num_positions
        spans = self.config.kv_buckets
        return spans[bisect.bisect_left(spans, num_positions)]

    def decode_steps(self, num_draft_tokens: int, choices: bool = False) -> int:
        """Steps of the loop for a batch whose largest k is `num_draft_tokens` (engine/tiers.py): a captured
        tier on graphs, one step ahead on every static-shape path, exact k eagerly unless the batch keeps
        top choices (drafting ahead needs those after the last draft too)."""
        tiers = self.config.tiers if self.graphs is not None else None
        return decode_steps(num_draft_tokens, tiers, ahead=self.static_shapes or choices)

    def keeps_choices(self, requests: list[DraftRequest]) -> bool:
        """Whether this batch's loop ranks top choices: static-shape loops were built with them (when the
        config has any), eager loops rank them only when a request asks."""
        if not self.config.top_choices:
            return False
        return self.static_shapes or any(r.choices for r in requests)

    def expected_prefill(self, request: DraftRequest) -> int:
        """About how many context tokens `draft_batch` would compute for this request alone (the rest it
        finds cached): cheap, and read while no batch runs (see SequenceTable.reuse_estimate)."""
        tokens = np.asarray(request.tokens)
        return len(tokens) - self.table.reuse_estimate(tokens, request.session)

    def draft(self, tokens, num_draft_tokens: int, session: str | None = None) -> list[int]:
        return self.draft_batch([DraftRequest(tokens, num_draft_tokens, session)])[0].tokens

    def draft_batch(self, requests: list[DraftRequest], counted: bool = True) -> list[DraftResult]:
        """Greedy drafts for up to max_batch_size requests in one decode loop; a batch whose pages do not fit
        the pool together is drafted in halves (one request always fits: the config guarantees it); not
        `counted` in `stats` when the server's own (a conversation cached again after a swap)."""
        cfg = self.config
        if not 1 <= len(requests) <= cfg.max_batch_size:
            raise DraftError(f"a batch holds 1 to {cfg.max_batch_size} requests, got {len(requests)}")
        self.branch_ops.apply(self.table)
        vocab = self.loaded.config.vocab_size
        contexts = [as_token_array(r, vocab, cfg.max_seq_len, cfg.max_draft_tokens) for r in requests]
        try:
            results, _ = self.run(contexts, requests)
        except CacheFull:
            if len(requests) == 1:
                raise
            half = len(requests) // 2
            return self.draft_batch(requests[:half], counted) + self.draft_batch(requests[half:], counted)
        if counted:
            self.stats.add(results)
        self.count_branch_pages()
        return results

    def count_branch_pages(self) -> None:
        """For /metrics, which must not walk the table while this thread changes it."""
        self.branch_pages = self.table.branch_pages if self.table.branches else 0

    def run(self, contexts, requests, branch_of: str | None = None, stop=None):
        """Place, prefill, decode, read back and commit one batch: (results, placements), or (None, None)
        when `stop` cut the decode loop short."""
        cfg = self.config
        began = time.perf_counter()
        choices = self.keeps_choices(requests)
        num_steps = self.decode_steps(max(r.num_draft_tokens for r in requests), choices)
        placements = self.table.place(
            [(c, r.session, len(c) - 1 + num_steps) for c, r in zip(contexts, requests, strict=True)],
            branch_of,
        )

        self.pool.clear_new([page for p in placements for page in p.sequence.pages])
        self.pool.copy_pages([p.copy for p in placements if p.copy is not None])
        start = time.perf_counter()
        rows = [
            PrefillRow(p.sequence.pages, c[p.reuse : len(c) - 1], p.reuse)
            for p, c in zip(placements, contexts, strict=True)
        ]
        rows = [row for row in rows if len(row.tokens)]
        if rows:  # a growing conversation decoding ahead has nothing to prefill: no forward, no sync
            prefill(self.model, rows, cfg.prefill_chunk, cfg.page_size, self.rope, self.pool.tensors)
            self.sync()  # so prefill_ms is the prefill's own time
        prefilled = time.perf_counter()

        page_tables = [p.sequence.pages for p in placements]
        buffers = self.decode_buffers(len(requests))
        buffers.fill([int(c[-1]) for c in contexts], [len(c) - 1 for c in contexts], page_tables)
        kv_len = self.kv_span(max(len(c) for c in contexts) - 1 + num_steps)
        view = None
        if not self.static_shapes and not self.flex_pages and len(requests) == 1:
            view = contiguous(page_tables[0], kv_len, cfg.page_size)
        if self.run_decode(buffers, num_steps, kv_len, view, stop, choices) < num_steps:
            return None, None
        # One readback (the loop's one host sync) of tokens, probabilities and top choices together: token
        # ids < 2**24 are exact in float32.
        real = slice(0, len(requests))  # rows past it are the bucket's padding
        parts = (buffers.out_tokens[real, :num_steps].float(), buffers.out_probs[real, :num_steps])
        if choices:  # drafting ahead: each step's top choices too
            parts += (buffers.out_top[real, :num_steps].flatten(1),)
        both = torch.cat(parts, 1)
        rows = both.cpu().tolist()
        drafts = [[int(token) for token in row[:num_steps]] for row in rows]
        probs = [row[num_steps : 2 * num_steps] for row in rows]
        tops = [top_choices(row[2 * num_steps :], cfg.top_choices if choices else 0) for row in rows]
        decoded = time.perf_counter()

        for context, placement, draft in zip(contexts, placements, drafts, strict=True):
            # The sequence now holds the context and every draft token fed back into the loop.
            self.table.commit(placement, np.concatenate([context, np.asarray(draft[:-1], dtype=np.int64)]))
        engine_ms = (time.perf_counter() - began) * 1e3
        results = [
            DraftResult(
                tokens=draft[: request.num_draft_tokens],
                probs=prob[: request.num_draft_tokens],
                cached=placement.reuse,
                prefilled=len(context) - placement.reuse,
                evicted=placement.evicted > 0,
                prefill_ms=(prefilled - start) * 1e3,
                decode_ms=(decoded - prefilled) * 1e3,
                engine_ms=engine_ms,
                shared=placement.shared,
                num_steps=num_steps,
                choices=choice[: request.num_draft_tokens + 1],
                weights_version=self.weights_version,
            )
            for request, context, placement, draft, prob, choice in zip(
                requests, contexts, placements, drafts, probs, tops, strict=True
            )
        ]
        return results, placements

    def decode_buffers(self, batch: int) -> DecodeBuffers:
        """Static shapes (compiled, graphs) pad to a bucket; eager runs the exact batch, no padded rows."""
        if self.static_shapes:
            return self.buffers[self.config.buckets[bisect.bisect_left(self.config.buckets, batch)]]
        if batch not in self.eager_buffers:
            self.eager_buffers[batch] = DecodeBuffers(
                batch,
                self.config.max_draft_tokens + 1,
                self.config.max_pages_per_seq,
                self.device,
                self.config.top_choices,
            )
        return self.eager_buffers[batch]

    def run_decode(
        self, buffers: DecodeBuffers, num_steps: int, kv_len: int, view=None, stop=None, choices=True
    ) -> int:
        """The decode loop; the steps it ran (fewer than `num_steps` only if `stop` cut it short; a captured
        loop replays whole). Eager loops skip ranking top choices unless `choices`."""
        if self.graphs is not None:
            self.graphs.replay(buffers.bucket, kv_len, num_steps)
            return num_steps
        with self.recompiles.watching():
            return run_loop(
                self.step if choices or self.static_shapes else self.plain_step,
                buffers,
                num_steps,
                kv_len,
                self.rope,
                self.pool.tensors,
                view,
                self.flex_pages,
                stop,
            )

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def info(self) -> dict:
        return describe(self)
