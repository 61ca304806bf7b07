"""Over HTTP, `./serve.sh --model DIR` serves exactly the drafts transformers' greedy generate produces."""

from __future__ import annotations

import sys

import httpx
import pytest
import torch

from tests.oracle import hf_greedy
from tests.server_process import REPO, ServerProcess


@pytest.fixture(scope="module")
def served(hf_checkpoint):
    model, directory = hf_checkpoint("gqa4-tied-odd")
    args = [
        "--model",
        str(directory),
        "--dtype",
        "float32",
        "--device",
        "cpu",
        "--no-compile",
        "--port",
        "0",
        "--max-seq-len",
        "1024",
    ]
    # PYTHON: serve.sh runs this test's interpreter, not whatever .venv or python the checkout has.
    server = ServerProcess(args, command=[str(REPO / "serve.sh")], env={"PYTHON": sys.executable})
    try:
        yield model, server.wait_ready()
    finally:
        server.close()


def test_serve_sh_drafts_equal_transformers_generate(served):
    model, url = served
    generator = torch.Generator().manual_seed(11)
    with httpx.Client(base_url=url, timeout=30) as client:
        context = torch.randint(0, model.config.vocab_size, (120,), generator=generator).tolist()
        for _ in range(4):  # a growing conversation: later calls are served from the KV cache
            response = client.post("/draft", json={"tokens": context, "num_draft_tokens": 10})
            assert response.status_code == 200, response.text
            drafts = response.json()["tokens"]
            assert drafts == hf_greedy(model, context, 10)
            context = context + drafts[:4] + [int(torch.randint(0, model.config.vocab_size, (1,)))]
        assert response.json()["cached"] > 100


def test_conversations_sharing_a_system_prompt_draft_like_transformers(served):
    """Two conversations over one 130-token prefix: the second is served from the first's pages."""
    model, url = served
    generator = torch.Generator().manual_seed(12)
    prompt = torch.randint(0, model.config.vocab_size, (130,), generator=generator).tolist()
    with httpx.Client(base_url=url, timeout=30) as client:
        for turn in range(2):
            for user in (1, 2):
                context = prompt + [user] * (3 + turn)
                response = client.post("/draft", json={"tokens": context, "num_draft_tokens": 6})
                assert response.status_code == 200, response.text
                assert response.json()["tokens"] == hf_greedy(model, context, 6)
                if (turn, user) != (0, 1):
                    assert response.json()["cached"] >= 128  # two full pages of the shared prompt
