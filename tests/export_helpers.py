"""What the export tests share: the two modes, a small engine config, and readers of an exported checkpoint.
The exports themselves are the session fixtures `exported` (the tiny preset) and `exported_qwen2` in
conftest.py, and their `_channel` twins with per-channel weight scales; `EXPORTS` names them by the family
and weight scales they test."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from engine.config import EngineConfig
from engine.model.fp8 import LINEAR_NAMES
from engine.model.presets import PRESETS

MODES = ("weight-only", "dynamic")
EXPORTS = {"qwen3": "exported", "qwen2": "exported_qwen2"}  # family -> session fixture of its export
WEIGHT_SCALES = ("tensor", "channel")


def export_fixture(family: str, weight_scales: str) -> str:
    """The session fixture of `family`'s export with `weight_scales`."""
    return EXPORTS[family] + ("_channel" if weight_scales == "channel" else "")


ENGINE = EngineConfig(max_seq_len=128, max_batch_size=1, max_draft_tokens=8)


def read_file(directory: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(directory / "model.safetensors"), framework="pt") as f:
        return {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118


def linear_names(config=PRESETS["tiny"]):
    return [f"model.layers.{n}.{name}" for n in range(config.num_hidden_layers) for name in LINEAR_NAMES]
