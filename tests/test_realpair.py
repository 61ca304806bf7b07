"""The real pair (Qwen2.5-Coder 1.5B target, 0.5B drafter; `python -m bench.realpair fetch` puts it in
build/realpair/): the served FP8 drafter drafts exactly what transformers with compressed-tensors drafts on
the same export, and a speculative generation with the real target through it is lossless. Skipped, saying
so, where build/realpair/ holds no finished fetch: CI does not download 1.6 GB on every run."""

from __future__ import annotations

import pytest
import torch

from bench.realpair.workloads import chat_ids, load_prompts
from drafter.client import DraftClient
from drafter.integrations.transformers_generate import speculative_decoding
from tests.oracle import hf_greedy
from tests.server_process import REPO, ServerProcess

PAIR = REPO / "build" / "realpair"
DRAFTER_FP8 = PAIR / "drafter-fp8-weight-only"
K = 8

pytestmark = [
    pytest.mark.realpair,
    pytest.mark.skipif(
        not all((path / "config.json").exists() for path in (PAIR / "target", DRAFTER_FP8)),
        reason="no real pair in build/realpair/ (python -m bench.realpair fetch)",
    ),
]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(PAIR / "target")


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    return [chat_ids(prompt, tokenizer) for prompt in load_prompts(quick=True)[:3]]


@pytest.fixture(scope="module")
def url():
    args = [f"--model={DRAFTER_FP8}", "--dtype=float32", "--device=cpu", "--no-compile", "--port=0"]
    server = ServerProcess([*args, "--max-seq-len=2048", "--draft-source=model", "--request-timeout-s=120"])
    try:
        yield server.wait_ready()
    finally:
        server.close()


def test_the_served_fp8_drafter_drafts_what_transformers_and_compressed_tensors_draft(url, prompts):
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    oracle = AutoModelForCausalLM.from_pretrained(
        DRAFTER_FP8, quantization_config=CompressedTensorsConfig(run_compressed=False), dtype=torch.float32
    ).eval()
    with DraftClient(url, timeout_s=120) as client:
        for context in prompts:
            assert client.draft(context, K).tokens == hf_greedy(oracle, context, K)


def test_speculative_generation_with_the_real_target_is_lossless(url, prompts):
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(PAIR / "target", dtype=torch.float32).eval()
    ids = torch.tensor([prompts[0]])
    common = dict(attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=24)
    with torch.no_grad(), DraftClient(url, timeout_s=120) as client:
        alone = target.generate(ids, **common)
        spec = target.generate(
            ids, **common, custom_generate=speculative_decoding, draft_client=client, num_draft_tokens=4
        )
    assert spec.tolist() == alone.tolist()
