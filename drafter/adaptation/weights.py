"""The weights a server starts from, as online adaptation's version 0: the served checkpoint's tensors in the
served layout (export/versions.py) and its HF config, read again from the engine's source (the engine keeps
no plain copy: its CPU linears are packed)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from engine.model.loader import LoadedModel, checkpoint_files, read_tensors
from engine.model.presets import is_preset, preset_state_dict
from export.versions import served_tensors


def source_hf_config(loaded: LoadedModel) -> dict:
    """The HF config.json of what the engine serves (a preset's, for a preset)."""
    if is_preset(loaded.source):
        return loaded.config.to_hf()
    return json.loads((Path(loaded.source) / "config.json").read_text())


def source_tensors(loaded: LoadedModel, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Version 0: the checkpoint's tensors as the engine serves them (an FP8 export's are already so)."""
    if is_preset(loaded.source):
        state = preset_state_dict(loaded.source)
    else:
        state = read_tensors(checkpoint_files(Path(loaded.source)))
    if loaded.quantization != "none":
        return state
    return served_tensors(state, "none", dtype, loaded.config.tie_word_embeddings)
