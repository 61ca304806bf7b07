"""CUDA-only: capture the whole decode loop of each (batch bucket, attention span, step count) once, replay
it. With flex attention there is one span (0: every row reads its own pages at its exact length); step
counts are the draft-length tiers plus the step ahead (engine/tiers.py).

We capture by hand over the (optionally compiled) step rather than use torch.compile's `reduce-overhead`
mode: reduce-overhead graphs one call of the compiled function, which would leave one launch and a Python
round trip per draft token; capturing the loop makes all k steps one replay with a single readout, and
gives us the bucket order, the shared memory pool and the static buffers explicitly (as nano-vllm does).
Everything around the capture (buffers, padding, bucket choice) is ordinary code tested on CPU.
"""

from __future__ import annotations

import time

import torch

from engine.decode import DecodeBuffers, StepFn, run_loop


class CapturedLoops:
    def __init__(self):
        self.graphs: dict[tuple[int, int, int], torch.cuda.CUDAGraph] = {}
        self.memory_bytes = 0
        self.capture_seconds = 0.0

    def capture(
        self,
        step: StepFn,
        buffers: dict[int, DecodeBuffers],
        kv_buckets,
        step_counts,  # steps of each captured loop: the tiers, each plus the step ahead
        rope,
        cache,
        flex_pages,
    ):
        """Largest first so smaller graphs reuse the shared pool; a warmup run precedes each capture."""
        started = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        torch.cuda.synchronize()
        free_before = torch.cuda.mem_get_info()[0]
        for bucket in sorted(buffers, reverse=True):
            for kv_len in sorted(kv_buckets, reverse=True):
                for num_steps in sorted(step_counts, reverse=True):
                    bufs = buffers[bucket]
                    run_loop(
                        step, bufs, num_steps, kv_len, rope, cache, flex_pages=flex_pages
                    )  # warmup: compile, autotune, allocate
                    torch.cuda.synchronize()
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool):
                        run_loop(step, bufs, num_steps, kv_len, rope, cache, flex_pages=flex_pages)
                    self.graphs[(bucket, kv_len, num_steps)] = graph
        torch.cuda.synchronize()
        self.memory_bytes = max(0, free_before - torch.cuda.mem_get_info()[0])
        self.capture_seconds = time.perf_counter() - started

    def describe(self, spans, tiers) -> dict:
        """What readiness and /info show of the capture."""
        return {
            "batch_buckets": sorted({bucket for bucket, _, _ in self.graphs}),
            "kv_buckets": list(spans),
            "draft_length_tiers": list(tiers),
            "num_graphs": len(self.graphs),
            "memory_bytes": self.memory_bytes,
            "capture_seconds": self.capture_seconds,
        }

    def replay(self, bucket: int, kv_len: int, num_steps: int) -> None:
        self.graphs[(bucket, kv_len, num_steps)].replay()
