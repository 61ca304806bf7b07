"""The engine's warmup: compile and capture everything the hot path will run, then one prefill and one decode
loop on the scratch page, so no request pays for first-call costs. A base of `Engine` (engine/engine.py), which
owns the state these methods read: its config, model, buffers, pool, rope tables and lifecycle."""

from __future__ import annotations

import numpy as np

from engine import compile as compile_step
from engine.decode import DecodeBuffers, run_loop
from engine.lifecycle import State
from engine.prefill import PrefillRow, prefill
from engine.tiers import decode_steps


class Warmup:
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
            if self.static_shapes:
                self.recompiles.arm()  # every shape has run once: any compile from now on is a miss
        except Exception as error:  # noqa: BLE001 - anything here leaves the engine unusable
            self.lifecycle.fail(f"warmup failed: {type(error).__name__}: {error}")
            raise
        self.lifecycle.state = State.READY
        return self.lifecycle.snapshot()

    @property
    def spans(self) -> tuple[int, ...]:
        """The kv_len values static-shape loops are built for: sdpa's power-of-two spans, or flex's one."""
        return (0,) if self.flex_pages else self.config.kv_buckets

    def compile(self, backend="inductor") -> None:
        """Compile the decode step and run every shape warmup covers once (a graph per batch bucket and
        span); `backend` is for tests that trace the graphs."""
        try:
            step = compile_step.compiled(
                self.step,
                num_shapes=len(self.buffers) * len(self.spans),
                static=self.flex_pages is not None,
                backend=backend,
            )
            for bucket in self.buffers.values():
                for kv_len in self.spans:
                    self.reset_buffers(bucket)
                    run_loop(
                        step, bucket, 1, kv_len, self.rope, self.pool.tensors, flex_pages=self.flex_pages
                    )
            self.step, self.static_shapes = step, True
        except Exception as error:  # noqa: BLE001 - compile failures vary by backend; eager still works
            self.lifecycle.fall_back(f"torch.compile failed, serving eager: {type(error).__name__}: {error}")

    def capture_cuda_graphs(self) -> None:
        from engine.cuda_graphs import CapturedLoops

        graphs = CapturedLoops()
        try:
            for bucket in self.buffers.values():
                self.reset_buffers(bucket)
            steps = [decode_steps(tier, None, ahead=True) for tier in self.config.tiers]
            graphs.capture(
                self.step, self.buffers, self.spans, steps, self.rope, self.pool.tensors, self.flex_pages
            )
        except Exception as error:  # noqa: BLE001 - a failed capture must not take the server down
            self.lifecycle.fall_back(f"CUDA graph capture failed, serving without graphs: {error}")
            return
        self.graphs, self.static_shapes = graphs, True
        self.lifecycle.captured = graphs.describe(self.spans, self.config.tiers)

    def reset_buffers(self, buffers: DecodeBuffers) -> None:
        """Point every row at the scratch page, so warmup and capture never write a conversation's cache."""
        buffers.fill([], [], [])

    def run_warmup_draft(self) -> None:
        """One prefill pass and one decode loop on the scratch page: first-call costs (allocator, kernels)."""
        scratch = [0] * self.config.max_pages_per_seq
        prefill(
            self.model,
            [PrefillRow(scratch, np.zeros(8, dtype=np.int64), 0)],
            self.config.prefill_chunk,
            self.config.page_size,
            self.rope,
            self.pool.tensors,
        )
        bucket = self.buffers[self.config.buckets[0]]
        self.reset_buffers(bucket)
        steps = self.decode_steps(self.config.max_draft_tokens)
        self.run_decode(bucket, steps, self.kv_span(steps))
