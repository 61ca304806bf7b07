"""torch.compile of the decode step.

Every (batch bucket, attention span) pair is a distinct shape. Rather than one static graph for each
(12 compiles for 3 buckets x 4 spans, each ~15 s on CPU and longer for a 28-layer model on CUDA), dynamo's
automatic dynamic shapes compile a shape statically the first time and generalize the dimension that
changed the second time: the same 12 shapes measured 5 graphs. Warmup runs every shape once, so after it
nothing recompiles (tests assert it with `error_on_recompile`).

Flex attention compiles every batch bucket statically instead (`dynamic=False`: one graph per bucket, and
it has one span). Inductor lowers a decode-length flex call to its split-K decoding kernel only when the
batch is static (`torch/_inductor/kernel/flex/flex_decoding.py`, `static_batch`); a symbolic batch takes the
main flex kernel, which wants other block sizes and is the slower kernel for one query token.
"""

from __future__ import annotations

import torch
import torch._dynamo


def compiled(step, num_shapes: int, static: bool = False, backend="inductor"):
    """Compile `step`, allowing at least as many recompiles as warmup has shapes (the limit is global);
    `static`: a graph per shape, no dimension made symbolic."""
    limit = max(torch._dynamo.config.recompile_limit, num_shapes + 1)
    torch._dynamo.config.recompile_limit = limit
    torch._dynamo.config.accumulated_recompile_limit = max(
        torch._dynamo.config.accumulated_recompile_limit, limit * 4
    )
    return torch.compile(step, fullgraph=True, dynamic=False if static else None, backend=backend)
