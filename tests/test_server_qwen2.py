"""`python -m drafter --model DIR` serves the Qwen2 family: a plain HF Qwen2 directory (its drafts are
transformers' greedy ones) and an FP8 export of one (the engine's drafts, which test_export_accuracy ties to
transformers + compressed-tensors)."""

from __future__ import annotations

import httpx
import pytest
import torch

from engine.engine import Engine
from tests.export_helpers import ENGINE
from tests.oracle import hf_greedy
from tests.server_process import ServerProcess

ARGS = ["--device=cpu", "--dtype=float32", "--no-compile", "--max-seq-len=256", "--draft-source=model"]


@pytest.fixture(scope="module")
def served(hf_checkpoint, exported_qwen2):
    """{"plain": (transformers model, url), "fp8": (export directory, url)}, the two servers started
    together."""
    model, directory = hf_checkpoint("qwen2-gqa2-tied")
    fp8, _ = exported_qwen2["weight-only"]
    servers = {
        name: ServerProcess(["--model", str(path), *ARGS])
        for name, path in (("plain", directory), ("fp8", fp8))
    }
    try:
        urls = {name: server.wait_ready() for name, server in servers.items()}
        yield {"plain": (model, urls["plain"]), "fp8": (fp8, urls["fp8"])}
    finally:
        for server in servers.values():
            server.close()


def drafts(url: str, context: list[int], k: int) -> list[int]:
    response = httpx.post(f"{url}/draft", json={"tokens": context, "num_draft_tokens": k}, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()["tokens"]


def test_server_serves_a_plain_qwen2_directory_and_its_fp8_export(served):
    model, url = served["plain"]
    info = httpx.get(f"{url}/info").json()
    assert (info["model_type"], info["quantization"]) == ("qwen2", "none")
    generator = torch.Generator().manual_seed(21)
    context = torch.randint(0, model.config.vocab_size, (70,), generator=generator).tolist()
    for _ in range(2):  # the second call is served from the first's pages
        ours = drafts(url, context, 8)
        assert ours == hf_greedy(model, context, 8)
        context = context + ours[:3] + [5]

    directory, url = served["fp8"]
    info = httpx.get(f"{url}/info").json()
    assert (info["model_type"], info["quantization"]) == ("qwen2", "fp8-weight-only")
    engine = Engine.load(str(directory), ENGINE)
    context = torch.randint(0, engine.loaded.config.vocab_size, (50,), generator=generator).tolist()
    assert drafts(url, context, 8) == engine.draft(context, 8)
