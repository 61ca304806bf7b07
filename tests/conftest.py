"""Shared test fixtures: tiny random transformers Qwen3 and Qwen2 checkpoints (the oracle) written to temp
dirs, and the tiny preset and a Qwen2 checkpoint exported to FP8 in both modes, with per-tensor and (the
`_channel` fixtures) per-channel weight scales."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import torch

from tests.oracle import make_hf_model
from tests.server_process import ServerProcess

# The target of the speculative-decoding tests: tied embeddings, like the Qwen3-0.6B drafter.
TARGET_MODEL = "gqa4-tied-odd"
TARGET_SERVER_ARGS = [
    "--device=cpu",
    "--dtype=float32",
    "--no-compile",
    "--max-seq-len=512",
    "--draft-source=model",  # own-weights tests expect every draft accepted: the model's drafts only
]

# The Qwen2 checkpoint the FP8 export tests run on beside the tiny preset: what Qwen3 lacks (q/k/v biases,
# which stay bf16 beside the fp8 weights) and an untied lm_head, which the export keeps in bf16.
QWEN2_EXPORT = "qwen2-gqa4-untied-odd"

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


@pytest.fixture(scope="module")
def one_thread():
    """For small models one thread is as fast, and does not stall when other processes hold the cores (two
    spinning OpenMP threads on a busy 2-core machine make every small matmul 5-10x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def export_both_modes(source: str, root: Path, weight_scales: str = "tensor") -> dict:
    """mode -> (directory, report) of `source` exported with `python -m export`'s run_export."""
    from export.__main__ import run_export
    from tests.export_helpers import MODES

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {
            mode: (root / mode, run_export(source, root / mode, mode, weight_scales=weight_scales))
            for mode in MODES
        }
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def exported(tmp_path_factory):
    """mode -> (directory, report) of the tiny preset (Qwen3, tied) exported to FP8."""
    return export_both_modes("tiny", tmp_path_factory.mktemp("export"))


@pytest.fixture(scope="session")
def exported_qwen2(hf_checkpoint, tmp_path_factory):
    """mode -> (directory, report) of a Qwen2 checkpoint (untied, odd sizes, q/k/v biases) exported to FP8."""
    _, directory = hf_checkpoint(QWEN2_EXPORT)
    return export_both_modes(str(directory), tmp_path_factory.mktemp("export-qwen2"))


@pytest.fixture(scope="session")
def exported_channel(tmp_path_factory):
    """`exported` with one weight scale per output channel (`--scales channel`)."""
    return export_both_modes("tiny", tmp_path_factory.mktemp("export-channel"), "channel")


@pytest.fixture(scope="session")
def exported_qwen2_channel(hf_checkpoint, tmp_path_factory):
    """`exported_qwen2` with one weight scale per output channel (`--scales channel`)."""
    _, directory = hf_checkpoint(QWEN2_EXPORT)
    return export_both_modes(str(directory), tmp_path_factory.mktemp("export-qwen2-channel"), "channel")


@pytest.fixture(scope="session")
def target_drafters(hf_checkpoint, tmp_path_factory):
    """{"same": a server of the target's own weights (every draft accepted), "fp8": one of their FP8 export
    (some drafts rejected)}, started together once for every module that speculates against them."""
    from export.__main__ import main as export_main

    _, directory = hf_checkpoint(TARGET_MODEL)
    fp8 = tmp_path_factory.mktemp("fp8") / "export"
    assert export_main([str(directory), str(fp8)]) == 0
    servers = {
        name: ServerProcess(["--model", str(path), *TARGET_SERVER_ARGS])
        for name, path in (("same", directory), ("fp8", fp8))
    }
    try:
        yield {name: server.wait_ready() for name, server in servers.items()}
    finally:
        for server in servers.values():
            server.close()


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
