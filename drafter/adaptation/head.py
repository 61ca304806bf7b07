"""The lm_head over a real vocabulary a slice of its rows at a time, asking `stop()` between two slices.

The trainer and the scorer run the head in fp32: on Qwen2.5-Coder-0.5B (151,936 tokens) its weight is 545 MB,
and one pass over it for 16 to 64 positions took 0.10-0.16 s on 2 cores, the longest piece of a training step
or a scored example that a request arriving meanwhile waited for (bench/adapt/preempt.py). A slice holds
about SLICE_LOGITS logits (rows times positions), ~2 GFLOP. The head's weight is frozen (the trainer never
trains the embedding or the head), so its backward is the gradient of the hidden states alone, sliced alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from drafter.adaptation.preempt import Preempted

SLICE_LOGITS = 1 << 20
MIN_ROWS = 1024


def row_slices(head: nn.Linear, num_positions: int, stop: Callable[[], bool]) -> Iterator[slice]:
    """The head's rows a slice at a time; Preempted before one once `stop()` says so."""
    step = max(MIN_ROWS, SLICE_LOGITS // max(num_positions, 1))
    for start in range(0, head.out_features, step):
        if stop():
            raise Preempted
        yield slice(start, start + step)


def logits(head: nn.Linear, hidden: torch.Tensor, stop: Callable[[], bool]) -> torch.Tensor:
    """`head(hidden)` for hidden states [positions, hidden] (no gradient), in slices of the vocabulary."""
    bias = head.bias
    with torch.no_grad():
        return torch.cat(
            [
                F.linear(hidden, head.weight[rows], None if bias is None else bias[rows])
                for rows in row_slices(head, len(hidden), stop)
            ],
            dim=-1,
        )


def hidden_gradient(head: nn.Linear, logits_gradient: torch.Tensor, stop: Callable[[], bool]) -> torch.Tensor:
    """The gradient of the hidden states given that of the head's logits [positions, vocabulary]."""
    total = None
    with torch.no_grad():
        for rows in row_slices(head, len(logits_gradient), stop):
            part = logits_gradient[:, rows] @ head.weight[rows]
            total = part if total is None else total.add_(part)
    return total


def cross_entropy_backward(
    head: nn.Linear, hidden: torch.Tensor, targets: torch.Tensor, stop: Callable[[], bool]
) -> float:
    """The mean cross-entropy of `head(hidden)` against `targets`, its gradient sent back into `hidden`
    (a tensor of the model's graph), the head's passes in slices."""
    scores = logits(head, hidden.detach(), stop).float()
    with torch.no_grad():
        log_probs = scores.log_softmax(-1)
        rows = torch.arange(len(targets), device=scores.device)
        loss = -log_probs[rows, targets].mean()
        gradient = log_probs.exp_()  # softmax - one-hot, over the mean's count
        gradient[rows, targets] -= 1.0
        gradient /= len(targets)
    hidden.backward(hidden_gradient(head, gradient.to(hidden.dtype), stop))
    return loss.item()
