"""A transformers target to try speculation with: an HF checkpoint directory, or a preset name (`tiny`,
`bench-cpu`) giving the same random weights as the server's `--model tiny`, so a target and its drafter
need no download. Used by `python -m drafter.client` and bench/acceptance.py; imports torch."""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from engine.model.presets import is_preset, write_preset


def load_target(source: str | Path, device: str, dtype: str):
    """The model in eval mode on `device`; ValueError with one line saying why it cannot be loaded."""
    from transformers import AutoModelForCausalLM

    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    if is_preset(str(source)):
        with tempfile.TemporaryDirectory(prefix="drafter-target-") as scratch:
            return load_target(write_preset(str(source), scratch), device, dtype)
    directory = Path(source)
    if not directory.is_dir():
        raise ValueError(f"target {str(source)!r} is not a directory (nor a preset: tiny, bench-cpu)")
    try:
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=getattr(torch, dtype))
    except (OSError, ValueError) as error:
        raise ValueError(f"cannot load the target from {str(source)!r}: {error}") from None
    return model.to(device).eval()
