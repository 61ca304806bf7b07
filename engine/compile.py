"""torch.compile of the decode step with static shapes: one graph per (batch bucket, attention span)."""

from __future__ import annotations

import torch
import torch._dynamo


def compiled(step, num_shapes: int):
    """Compile `step`; every bucket/span pair is its own static-shape graph, so allow that many."""
    # Dynamo's recompile limit is global; raise it (never lower it) to the number of shapes we warm up.
    limit = max(torch._dynamo.config.recompile_limit, num_shapes + 1)
    torch._dynamo.config.recompile_limit = limit
    torch._dynamo.config.accumulated_recompile_limit = max(
        torch._dynamo.config.accumulated_recompile_limit, limit * 4
    )
    return torch.compile(step, fullgraph=True, dynamic=False)
