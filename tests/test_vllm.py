"""drafter as a real vLLM's proposer (vLLM's CPU build, its own venv: bench/vllm_target/install.sh). One vLLM
engine without speculation gives the reference outputs; one engine with drafter as its `custom_class` proposer
runs every test, against drafter servers started in turn on the one port it calls: the target's own weights
(drafts accepted), the testbed drafter's FP8 export (other weights: some rejected), and one stopped
mid-generation. The target is the testbed pair's (head_dim 64: vLLM's CPU attention has no kernel for the
suite's tiny head sizes). Greedy outputs must equal vLLM's alone, token for token; vLLM's own acceptance
counters must equal the server's. Batches mix prompt lengths and output lengths over more requests than vLLM
runs at once, so requests finish and are replaced mid-run (and move between rows).

Both engines run eager (`enforce_eager`): compiling the target with torch.compile took 37 s of the two
engines' start on a quiet 2-core machine (the module ran 106 s, 72 s eager), and what is tested, the
proposer's drafts and vLLM's verdicts on them, does not depend on how vLLM runs its model. The benchmarks
(bench/vllm_target/peers.py) run it compiled, lossless too. Skipped without the vLLM venv.
"""

from __future__ import annotations

import time

import httpx
import pytest

from bench.harness.server import free_port
from bench.testbed import PAIR, workload_tokens
from bench.vllm_target.driver import VllmTarget, vllm_available, vllm_python
from tests.server_process import ServerProcess, metric_value

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        not vllm_available(), reason=f"no vLLM venv at {vllm_python()} (bench/vllm_target/install.sh)"
    ),
]

TARGET = PAIR / "target"
OTHER_DRAFTER = PAIR / "drafter-fp8-weight-only"
K = 4
MAX_NUM_SEQS = 3  # fewer than the prompts: requests finish and others take their rows mid-run
SERVER_ARGS = ["--device=cpu", "--dtype=float32", "--max-seq-len=1024", "--batch-window-ms=1"]
MIXED_LENGTHS = (3, 40, 170, 12, 90, 300)
MAX_TOKENS = [24, 9, 40, 16, 31, 20]
LONG_MAX_TOKENS = 400  # long enough to stop the server while vLLM is still generating


def workload_prompts() -> list[list[int]]:
    return [tokens[:length] for tokens, length in zip(workload_tokens("code"), MIXED_LENGTHS, strict=False)]


@pytest.fixture(scope="module")
def prompts():
    return workload_prompts()


@pytest.fixture(scope="module")
def alone(prompts):
    """vLLM without speculation: the outputs every run with drafter must equal."""
    with VllmTarget(TARGET, "none", max_num_seqs=MAX_NUM_SEQS, enforce_eager=True) as vllm:
        return {
            "mixed": vllm.generate(prompts, MAX_TOKENS)["outputs"],
            "long": vllm.generate(prompts[:2], LONG_MAX_TOKENS)["outputs"],
        }


@pytest.fixture(scope="module")
def port():
    return free_port()


@pytest.fixture(scope="module")
def vllm(port, tmp_path_factory):
    stats = tmp_path_factory.mktemp("proposer") / "stats.json"
    url = f"http://127.0.0.1:{port}"
    with VllmTarget(
        TARGET,
        "drafter",
        k=K,
        drafter_url=url,
        stats_path=stats,
        max_num_seqs=MAX_NUM_SEQS,
        enforce_eager=True,
    ) as engine:
        yield engine


def drafter_server(model, port: int, *extra: str) -> ServerProcess:
    return ServerProcess([f"--model={model}", *SERVER_ARGS, f"--port={port}", *extra])


def server_counters(url: str) -> dict:
    text = httpx.get(f"{url}/metrics").text
    return {
        "calls": metric_value(text, 'drafter_request_seconds_count{status="200"}'),
        "num_drafts": metric_value(text, "drafter_spec_decode_num_drafts_total"),
        "num_draft_tokens": metric_value(text, "drafter_spec_decode_num_draft_tokens_total"),
        "num_accepted_tokens": metric_value(text, "drafter_spec_decode_num_accepted_tokens_total"),
        "accepted_per_position": [
            metric_value(text, f'drafter_spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}}')
            for i in range(K)
        ],
    }


def vllm_counters(answer: dict) -> dict:
    spec = answer["spec"]
    return {name: spec[name] for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")} | {
        "accepted_per_position": spec["accepted_per_position"][:K]
    }


def test_vllm_with_drafter_of_the_same_weights_equals_vllm_alone(vllm, alone, prompts, port):
    with drafter_server(TARGET, port, "--draft-source=model") as server:  # its own drafts: all accepted
        answer = vllm.generate(prompts, MAX_TOKENS)
        assert answer["outputs"] == alone["mixed"]
        counted = server_counters(server.url)
        assert (
            counted["calls"] >= answer["proposer"]["num_calls"] > 0
        )  # the proposer's calls reach the server
        assert {k: v for k, v in counted.items() if k != "calls"} == vllm_counters(answer)
        spec = answer["spec"]
        assert spec["num_accepted_tokens"] >= 0.8 * spec["num_draft_tokens"] > 0  # its own weights


def test_vllm_with_drafter_of_other_weights_equals_vllm_alone(vllm, alone, prompts, port):
    """The server's default source (hybrid): suffix drafts lead where the index is sure, the model's
    otherwise; vLLM's outputs are still its own."""
    with drafter_server(OTHER_DRAFTER, port) as server:
        answer = vllm.generate(prompts, MAX_TOKENS)
        assert answer["outputs"] == alone["mixed"]
        assert {k: v for k, v in server_counters(server.url).items() if k != "calls"} == vllm_counters(answer)
        spec = answer["spec"]
        assert 0 < spec["num_accepted_tokens"] < spec["num_draft_tokens"]
        by_source = httpx.get(f"{server.url}/info").json()["speculation"]["by_source"]
        assert by_source["suffix"]["num_draft_tokens"] > 0 and by_source["model"]["num_draft_tokens"] > 0


def test_vllm_goes_on_without_drafts_when_drafter_refuses_its_calls(vllm, alone, prompts, port):
    """A misconfigured proposer (no key for a server that wants one): every call is refused, logged once,
    and vLLM generates as it would alone."""
    with ServerProcess([f"--model={TARGET}", *SERVER_ARGS, f"--port={port}", "--api-key=not-the-proposers"]):
        answer = vllm.generate(prompts, MAX_TOKENS)
    assert answer["outputs"] == alone["mixed"]
    assert answer["spec"]["num_drafts"] == 0 and answer["proposer"]["skipped"].get("refused", 0) > 0


def test_vllm_finishes_without_speculation_when_drafter_stops_mid_generation(vllm, alone, prompts, port):
    server = drafter_server(TARGET, port)
    try:
        url = server.wait_ready()
        vllm.send(prompts[:2], LONG_MAX_TOKENS)
        deadline = time.monotonic() + 120
        while server_counters(url)["num_drafts"] < 5 and time.monotonic() < deadline:
            time.sleep(0.02)
        server.stop()
        answer = vllm.receive(600)
    finally:
        server.close()
    assert answer["outputs"] == alone["long"]
    spec = answer["spec"]
    assert spec["num_drafts"] > 0  # it speculated before the stop ...
    assert sum(answer["proposer"]["skipped"].values()) > 0  # ... and went on without drafts after it
    assert spec["num_generated_tokens"] == 2 * LONG_MAX_TOKENS
