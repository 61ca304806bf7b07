"""The drafting engine: token ids in, greedy draft token ids out.

It owns the model, the static KV cache and the slot table, and runs on one thread that owns the device
(compiled and graph-captured code is not thread-safe). A batch of requests is served as: match each to a
slot and keep the cached prefix, prefill only the new tokens, then one k-step greedy decode loop for the
whole batch with a single host sync at the end. The engine knows nothing of HTTP or tokenizers.
"""

from __future__ import annotations

import bisect
import functools
import logging
import time

import numpy as np
import torch

from engine import compile as compile_step
from engine.config import EngineConfig
from engine.decode import DecodeBuffers, greedy_step, run_loop
from engine.kv_cache import KVCache
from engine.lifecycle import Lifecycle, State
from engine.loader import LoadedModel, load_model
from engine.model import rope_table
from engine.prefill import PrefillRow, prefill
from engine.requests import DraftError, DraftRequest, DraftResult, EngineStats, as_token_array
from engine.slots import SlotTable

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class Engine:
    def __init__(self, loaded: LoadedModel, config: EngineConfig, lifecycle: Lifecycle | None = None):
        self.config = config
        self.loaded = loaded
        self.model = loaded.model
        self.lifecycle = lifecycle or Lifecycle()
        self.device = torch.device(config.device)
        model_config = loaded.config
        self.cache = KVCache(
            model_config, config.max_slots, config.cache_len, DTYPES[config.dtype], self.device
        )
        self.rope = tuple(t.to(self.device) for t in rope_table(model_config, config.cache_len))
        self.slots = SlotTable(config.max_slots, config.cache_len)
        self.buffers = {
            b: DecodeBuffers(b, config.max_draft_tokens, self.cache.scratch_slot, self.device)
            for b in config.buckets
        }
        self.step = functools.partial(greedy_step, self.model)
        self.graphs = None  # CapturedLoops once captured
        self.static_shapes = False  # compiled or captured: every loop runs in a padded batch bucket
        self.eager_buffers: dict[int, DecodeBuffers] = {}
        self.stats = EngineStats()

    @classmethod
    def load(cls, source: str, config: EngineConfig, lifecycle: Lifecycle | None = None) -> Engine:
        lifecycle = lifecycle or Lifecycle()
        with lifecycle.stage(State.LOADING):
            loaded = load_model(source, DTYPES[config.dtype], config.device)
            return cls(loaded, config, lifecycle)

    # -- warmup ---------------------------------------------------------------------------------------

    def warmup(self) -> dict:
        """Compile and capture everything the hot path will run, so no request pays for it; observable
        through `lifecycle`. A failed compile or capture falls back to the slower path instead of failing."""
        try:
            if self.config.compile:
                with self.lifecycle.stage(State.COMPILING):
                    self.compile()
            if self.config.cuda_graphs:
                with self.lifecycle.stage(State.CAPTURING):
                    self.capture_cuda_graphs()
            self.run_warmup_draft()
        except Exception as error:  # noqa: BLE001 - anything here leaves the engine unusable
            self.lifecycle.fail(f"warmup failed: {type(error).__name__}: {error}")
            raise
        self.lifecycle.state = State.READY
        return self.lifecycle.snapshot()

    def compile(self) -> None:
        try:
            step = compile_step.compiled(
                self.step, num_shapes=len(self.buffers) * len(self.config.kv_buckets)
            )
            for bucket in self.buffers.values():
                for kv_len in self.config.kv_buckets:
                    self.reset_buffers(bucket)
                    run_loop(step, bucket, 1, kv_len, self.rope, self.cache.tensors)
            self.step, self.static_shapes = step, True
        except Exception as error:  # noqa: BLE001 - compile failures vary by backend; eager still works
            self.lifecycle.fall_back(f"torch.compile failed, serving eager: {type(error).__name__}: {error}")

    def capture_cuda_graphs(self) -> None:
        from engine.cuda_graphs import CapturedLoops

        graphs = CapturedLoops()
        try:
            for bucket in self.buffers.values():
                self.reset_buffers(bucket)
            graphs.capture(
                self.step,
                self.buffers,
                self.config.kv_buckets,
                self.config.max_draft_tokens,
                self.rope,
                self.cache.tensors,
            )
        except Exception as error:  # noqa: BLE001 - a failed capture must not take the server down
            self.lifecycle.fall_back(f"CUDA graph capture failed, serving without graphs: {error}")
            return
        self.graphs, self.static_shapes = graphs, True
        self.lifecycle.captured = {
            "batch_buckets": sorted(self.buffers),
            "kv_buckets": list(self.config.kv_buckets),
            "num_draft_tokens": self.config.max_draft_tokens,
            "num_graphs": len(graphs.graphs),
            "memory_bytes": graphs.memory_bytes,
        }

    def reset_buffers(self, buffers: DecodeBuffers) -> None:
        """Point every row at the scratch slot, so warmup and capture never write a conversation's cache."""
        buffers.fill([], [], [])

    def run_warmup_draft(self) -> None:
        """One prefill pass and one decode loop on the scratch slot: first-call costs (allocator, kernels)."""
        scratch = self.cache.scratch_slot
        prefill(
            self.model,
            [PrefillRow(scratch, np.zeros(8, dtype=np.int64), 0)],
            self.config.prefill_chunk,
            scratch,
            self.rope,
            self.cache.tensors,
        )
        bucket = self.buffers[self.config.buckets[0]]
        self.reset_buffers(bucket)
        self.run_decode(bucket, self.config.max_draft_tokens, self.kv_span(self.config.max_draft_tokens))

    # -- drafting -------------------------------------------------------------------------------------

    def kv_span(self, num_positions: int) -> int:
        """Positions a decode loop attends over. Eager reads exactly those (rounding 4.1k up to 8k costs
        1.3x per call on CPU); compiled and captured loops round up to a span they were built for."""
        if not self.static_shapes:
            return num_positions
        spans = self.config.kv_buckets
        return spans[bisect.bisect_left(spans, num_positions)]

    def draft(self, tokens, num_draft_tokens: int, session: str | None = None) -> list[int]:
        return self.draft_batch([DraftRequest(tokens, num_draft_tokens, session)])[0].tokens

    def draft_batch(self, requests: list[DraftRequest]) -> list[DraftResult]:
        """Greedy drafts for up to max_batch_size requests in one decode loop."""
        cfg = self.config
        if not 1 <= len(requests) <= cfg.max_batch_size:
            raise DraftError(f"a batch holds 1 to {cfg.max_batch_size} requests, got {len(requests)}")
        vocab = self.loaded.config.vocab_size
        contexts = [as_token_array(r, vocab, cfg.max_seq_len, cfg.max_draft_tokens) for r in requests]
        assignments = self.slots.assign([(c, r.session) for c, r in zip(contexts, requests, strict=True)])
        for assignment, request in zip(assignments, requests, strict=True):
            self.slots.begin(assignment, request.session)

        start = time.perf_counter()
        rows = [
            PrefillRow(a.slot, c[a.reuse : len(c) - 1], a.reuse)
            for a, c in zip(assignments, contexts, strict=True)
        ]
        rows = [row for row in rows if len(row.tokens)]
        prefill(
            self.model,
            rows,
            cfg.prefill_chunk,
            self.cache.scratch_slot,
            self.rope,
            self.cache.tensors,
        )
        self.sync()
        prefilled = time.perf_counter()

        # Graphs always run max_draft_tokens steps; eager runs only as many as the batch asks for.
        num_steps = cfg.max_draft_tokens if self.graphs else max(r.num_draft_tokens for r in requests)
        slots = [a.slot for a in assignments]
        buffers = self.decode_buffers(len(requests))
        buffers.fill([int(c[-1]) for c in contexts], [len(c) - 1 for c in contexts], slots)
        kv_len = self.kv_span(max(len(c) for c in contexts) - 1 + num_steps)
        self.run_decode(buffers, num_steps, kv_len, self.contiguous_reads(buffers, slots))
        drafts = buffers.out_tokens[: len(requests), :num_steps].tolist()  # the one host sync of the loop
        probs = buffers.out_probs[: len(requests), :num_steps].tolist()
        decoded = time.perf_counter()

        results = []
        for request, context, assignment, draft, prob in zip(
            requests, contexts, assignments, drafts, probs, strict=True
        ):
            # The slot now holds the context and every draft token fed back into the loop.
            self.slots.commit(
                assignment.slot, np.concatenate([context, np.asarray(draft[:-1], dtype=np.int64)])
            )
            k = request.num_draft_tokens
            results.append(
                DraftResult(
                    tokens=draft[:k],
                    probs=prob[:k],
                    cached=assignment.reuse,
                    prefilled=len(context) - assignment.reuse,
                    evicted=assignment.evicted,
                    prefill_ms=(prefilled - start) * 1e3,
                    decode_ms=(decoded - prefilled) * 1e3,
                )
            )
        self.count(results)
        return results

    def decode_buffers(self, batch: int) -> DecodeBuffers:
        """Static shapes (compiled, graphs) pad to a bucket; eager runs the exact batch, no padded rows."""
        if self.static_shapes:
            return self.buffers[self.config.buckets[bisect.bisect_left(self.config.buckets, batch)]]
        if batch not in self.eager_buffers:
            self.eager_buffers[batch] = DecodeBuffers(
                batch, self.config.max_draft_tokens, self.cache.scratch_slot, self.device
            )
        return self.eager_buffers[batch]

    def contiguous_reads(self, buffers: DecodeBuffers, slots: list[int]) -> slice | None:
        """Eager batches over consecutive slots (every single request) attend over a view of the cache."""
        if self.static_shapes or slots != list(range(slots[0], slots[0] + buffers.bucket)):
            return None
        return slice(slots[0], slots[0] + buffers.bucket)

    def run_decode(self, buffers: DecodeBuffers, num_steps: int, kv_len: int, read_slots=None) -> None:
        if self.graphs is not None:
            self.graphs.replay(buffers.bucket, kv_len)
        else:
            run_loop(self.step, buffers, num_steps, kv_len, self.rope, self.cache.tensors, read_slots)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def count(self, results: list[DraftResult]) -> None:
        stats = self.stats
        stats.requests += len(results)
        stats.batch_sizes[len(results)] += 1
        for result in results:
            stats.tokens_reused += result.cached
            stats.tokens_prefilled += result.prefilled
            stats.draft_tokens += len(result.tokens)
            stats.evictions += result.evicted

    def info(self) -> dict:
        cfg, model_cfg = self.config, self.loaded.config
        return {
            "model": self.loaded.source,
            "random_weights": self.loaded.is_random_preset,
            "vocab_size": model_cfg.vocab_size,
            "max_context": cfg.max_seq_len,
            "max_draft_tokens": cfg.max_draft_tokens,
            "max_batch_size": cfg.max_batch_size,
            "max_slots": cfg.max_slots,
            "quantization": self.loaded.quantization,
            "device": cfg.device,
            "dtype": cfg.dtype,
            "compile": cfg.compile,
            "cuda_graphs": self.graphs is not None,
            "batch_buckets": list(cfg.buckets),
            "kv_buckets": list(cfg.kv_buckets),
            "kv_cache_bytes": self.cache.num_bytes,
        }
