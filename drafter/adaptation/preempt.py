"""Cutting a training step or a scoring pass short when a request arrives, between two decoder layers.

A step of a real drafter on a CPU takes a second or more (docs/adaptation.md), and the cycle can only stop
between steps: a request arriving during one would wait for all of it. Inside `preemptible`, every decoder
layer's forward and backward first asks `stop()`, and raises `Preempted` when it says so; the step is then
abandoned (its gradients dropped, no weight changed) and a request waits for at most one layer's work.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from torch import nn


class Preempted(Exception):
    """A request is waiting: the step or pass under way was abandoned."""


@contextmanager
def preemptible(model: nn.Module, stop: Callable[[], bool]) -> Iterator[None]:
    """Within it, `model`'s decoder layers raise Preempted before their forward or backward once `stop()`."""

    def check(*_) -> None:
        if stop():
            raise Preempted

    def check_before_backward(module, args, output) -> None:
        # A hook on the layer's output runs when its gradient arrives, just before the layer's backward.
        # (A module backward hook would warn on the first layer, whose input, the frozen embedding's
        # output, needs no gradient.)
        hidden = output[0] if isinstance(output, tuple) else output
        if hidden.requires_grad:
            hidden.register_hook(check)

    handles = []
    for layer in model.model.layers:
        handles.append(layer.register_forward_pre_hook(check))
        handles.append(layer.register_forward_hook(check_before_backward))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
