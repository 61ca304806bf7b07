"""The lm_head a slice of the vocabulary at a time (drafter/adaptation/head.py): the trainer's loss and its
gradient, and the scorer's logits, are what the whole head gives, and a request cuts them short between two
slices."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from drafter.adaptation import head
from drafter.adaptation.preempt import Preempted


@pytest.fixture
def small_slices(monkeypatch):
    """Slices of 100 rows for 10 positions: a 1,000-token head in 10 pieces."""
    monkeypatch.setattr(head, "SLICE_LOGITS", 1000)
    monkeypatch.setattr(head, "MIN_ROWS", 1)


def make_head(bias: bool) -> tuple[torch.nn.Linear, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    lm_head = torch.nn.Linear(32, 1000, bias=bias).requires_grad_(False)
    return lm_head, torch.randn(10, 32), torch.randint(0, 1000, (10,))


@pytest.mark.parametrize("bias", [False, True])
def test_sliced_logits_and_gradient_are_the_whole_heads(bias, small_slices):
    lm_head, hidden, targets = make_head(bias)
    checks = []
    sliced = head.logits(lm_head, hidden, lambda: checks.append(1) and False)
    assert len(checks) == 10
    assert torch.allclose(sliced, lm_head(hidden), rtol=0, atol=1e-6)

    x = hidden.clone().requires_grad_()
    expected = F.cross_entropy(lm_head(x), targets)
    expected.backward()
    y = hidden.clone().requires_grad_()
    loss = head.cross_entropy_backward(lm_head, y * 1.0, targets, lambda: False)
    assert loss == pytest.approx(expected.item(), rel=1e-6)
    assert torch.allclose(y.grad, x.grad, rtol=1e-5, atol=1e-7)


def test_a_request_cuts_the_head_short_between_slices(small_slices):
    lm_head, hidden, targets = make_head(False)
    checks = []
    hidden = hidden.requires_grad_()
    with pytest.raises(Preempted):  # the fourth slice of the logits' pass is not begun
        head.cross_entropy_backward(
            lm_head, hidden * 1.0, targets, lambda: len(checks) > 3 or checks.append(1)
        )
    assert hidden.grad is None
    checks.clear()
    with pytest.raises(Preempted):  # nor the backward's: 10 slices forward, then 3 of it
        head.cross_entropy_backward(
            lm_head, hidden * 1.0, targets, lambda: len(checks) > 12 or checks.append(1)
        )
    assert hidden.grad is None
