"""What a compiled decode step does, read from the graphs themselves rather than timed.

- Its work does not grow with the KV pool: inductor's code for a step allocates nothing the size of a
  layer's pool tensor (a write through a view of one stacked pool tensor was traced as a functional
  scatter that cloned every layer's pool and copied it back, every step).
- Flex attention compiles a static batch for every bucket: inductor uses its split-K decoding kernel
  only for a static batch (engine/compile.py).
"""

from __future__ import annotations

import re

import pytest
import torch
from torch._inductor.utils import run_and_get_code

from engine import compile as compile_step
from engine.config import EngineConfig
from engine.decode import run_loop
from engine.engine import Engine

ALLOCATION = re.compile(r"empty_strided_cpu\(\(([0-9, ]*)\)")


@pytest.mark.slow
def test_compiled_step_allocates_nothing_the_size_of_the_pool():
    config = EngineConfig(
        max_seq_len=480, max_batch_size=1, batch_buckets=(1,), max_draft_tokens=4, compile=True
    )
    engine = Engine.load("tiny", config)
    step = compile_step.compiled(engine.step, num_shapes=1)
    buffers = engine.buffers[1]
    engine.reset_buffers(buffers)
    pool_elements = engine.pool.k[0].numel()

    def one_step():
        run_loop(step, buffers, 1, engine.spans[0], engine.rope, engine.pool.tensors)

    _, sources = run_and_get_code(one_step)
    sizes = [
        [int(n) for n in m.group(1).replace(" ", "").split(",") if n]
        for s in sources
        for m in ALLOCATION.finditer(s)
    ]
    assert sizes, "no inductor code was generated"
    largest = max(int(torch.tensor(size or [1]).prod()) for size in sizes)
    assert largest < pool_elements / 4, (
        f"a buffer of {largest} elements; a layer's pool holds {pool_elements}"
    )
    written = torch.stack([layer[: config.page_size].abs().sum() for layer in engine.pool.k])
    assert torch.isfinite(written).all()  # the scratch page took the padding row's keys, in place


def test_flex_compiles_a_static_batch_for_every_bucket():
    """Traced with a backend that records each graph's input shapes (dynamo only: no inductor on CPU)."""
    graphs: list[list] = []

    def record(gm: torch.fx.GraphModule, example_inputs):
        shapes = []
        for node in gm.graph.nodes:
            value = node.meta.get("example_value")
            if node.op == "placeholder" and isinstance(value, torch.Tensor):
                shapes.append(tuple(value.shape))
            elif node.op == "placeholder":
                shapes.append(value)
        graphs.append(shapes)
        return gm.forward

    torch._dynamo.reset()
    config = EngineConfig(
        max_seq_len=200, max_batch_size=4, batch_buckets=(1, 2, 4), max_draft_tokens=4, compile=True,
        attention="flex", kv_cache_tokens=512,
    )  # fmt: skip
    engine = Engine.load("tiny", config)
    engine.compile(backend=record)
    assert engine.lifecycle.fallbacks == [] and engine.static_shapes
    assert len(graphs) == len(config.buckets), "one graph per batch bucket"
    batches = set()
    for shapes in graphs:
        symbolic = [
            s for s in shapes if not isinstance(s, tuple) or any(isinstance(d, torch.SymInt) for d in s)
        ]
        assert symbolic == [], f"symbolic inputs {symbolic}"
        batches.add(next(s[0] for s in shapes if isinstance(s, tuple) and len(s) == 1))  # tokens: [B]
    assert batches == set(config.buckets)
