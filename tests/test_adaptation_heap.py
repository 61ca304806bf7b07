"""drafter/adaptation/heap.py: after tensors are freed, glibc may keep their pages; releasing returns them."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest
import torch

from drafter.adaptation.heap import release_freed_memory


def resident_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 2**20


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_freed_tensors_pages_go_back_to_the_system():
    # A large block freed raises glibc's mmap threshold (up to 32 MB): the 2 MB tensors after it come from its heap, and
    # one kept at the heap's top stops the heap shrinking by itself when the others are freed.
    large = torch.ones(16 * 2**20, dtype=torch.uint8)
    del large
    tensors = [torch.ones(2 * 2**20, dtype=torch.uint8) for _ in range(200)]
    kept = tensors.pop()
    del tensors
    held = resident_mb()
    release_freed_memory()
    assert resident_mb() < held - 200, (held, resident_mb())
    assert kept.sum() == kept.numel()
