"""Shared test fixtures: tiny random transformers Qwen3 checkpoints (the oracle) written to temp dirs."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import torch

from tests.oracle import make_hf_model

# Compiled tests share one inductor cache inside the ignored build folder, so reruns take seconds.
os.environ.setdefault(
    "TORCHINDUCTOR_CACHE_DIR", str(Path(__file__).resolve().parents[1] / "build" / "inductor")
)
# torchao logs that its CUDA-only extensions do not load on CPU; that is expected here, not news.
logging.getLogger("torchao").setLevel(logging.ERROR)


@pytest.fixture(scope="session")
def hf_checkpoint(tmp_path_factory):
    """name -> (transformers model in fp32, directory it was saved to with save_pretrained)."""
    made = {}

    def get(name: str = "gqa2-untied"):
        if name not in made:
            model = make_hf_model(name)
            directory = tmp_path_factory.mktemp(name)
            model.save_pretrained(directory)
            made[name] = (model, directory)
        return made[name]

    return get


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
