"""bench/testbed: the committed pair matches its recipe (the target well below the drafter's loss, at 1/6 of its cost), and a miniature
build (the same code, seconds) goes the whole path: corpus, tokenizer, both models, the FP8 exports, the
workloads, a server of the exported drafter, and a lossless speculative round against it."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from bench.harness.prompts import read_prompt_lines
from bench.testbed.__main__ import main as run_testbed_cli
from bench.testbed.build import PAIR, MismatchError, build, check
from bench.testbed.recipe import FULL, MINIATURE
from bench.testbed.workloads import WORKLOADS, token_budget
from drafter.client import DraftClient
from drafter.integrations.transformers_generate import SpeculationStats, speculative_decoding
from tests.oracle import hf_greedy
from tests.server_process import ServerProcess

pytestmark = pytest.mark.usefixtures("one_thread")


def test_committed_pair_matches_the_recipe_and_is_a_real_pair():
    manifest = check(FULL, PAIR)
    assert manifest["threads"] == 2 and manifest["files"]
    report = json.loads((PAIR / "report.json").read_text())
    losses = report["held_out_loss"]
    assert losses["drafter"] - losses["target"] >= 0.3 and report["cost_ratio"] >= 6
    assert set(report["agreement"]) == {"prose", "code", "edit"}
    code = report["agreement"]["code"]  # the bar for a pair that agrees where real pairs do
    assert code["by_position"][0] >= 0.6 and code["tokens_per_round"]["8"] >= 2


@pytest.fixture(scope="module")
def miniature(tmp_path_factory):
    directory = tmp_path_factory.mktemp("testbed") / "pair"
    threads = torch.get_num_threads()
    try:
        report = build(MINIATURE, directory)
    finally:
        torch.set_num_threads(threads)
    return directory, report


def test_miniature_build_writes_a_pair_its_check_accepts(miniature, tmp_path, capsys):
    directory, report = miniature
    assert check(MINIATURE, directory)["recipe_key"] == MINIATURE.key() == report["recipe_key"]
    assert run_testbed_cli(["check", "--miniature", str(directory)]) == 0
    with pytest.raises(MismatchError, match="not"):  # another recipe's pair
        check(FULL, directory)
    tampered = tmp_path / "pair"
    shutil.copytree(directory, tampered)
    (tampered / "workloads" / "code.jsonl").write_text("[1]\n")
    assert run_testbed_cli(["check", "--miniature", str(tampered)]) == 1
    assert "files differ from the manifest, e.g. workloads/code.jsonl" in capsys.readouterr().err
    for mode in ("weight-only", "dynamic"):
        assert json.loads((directory / f"drafter-fp8-{mode}" / "report.json").read_text())["mode"] == mode
    assert set(report["agreement"]) == set(WORKLOADS)


def test_miniature_tokenizer_and_workloads_agree(miniature):
    from transformers import AutoTokenizer

    directory, _ = miniature
    tokenizer = AutoTokenizer.from_pretrained(directory / "target")
    for workload in WORKLOADS:
        [(_, prompt)] = read_prompt_lines(directory / "workloads" / f"{workload}.jsonl")
        assert prompt["workload"] == workload and prompt["tokens"][0] == tokenizer.eos_token_id
        # Cut from the document's own tokens, so that the prompt ends on a token boundary training saw.
        assert tokenizer.decode(prompt["tokens"][1:]) == prompt["text"]
        assert len(prompt["tokens"]) <= token_budget(MINIATURE) + 1


def test_miniature_speculative_round_against_the_served_fp8_drafter_is_lossless(miniature):
    from transformers import Qwen3ForCausalLM

    directory, _ = miniature
    target = Qwen3ForCausalLM.from_pretrained(directory / "target", dtype=torch.float32).eval()
    args = ["--model", str(directory / "drafter-fp8-weight-only"), "--device=cpu", "--no-compile"]
    with ServerProcess(args) as server, DraftClient(server.url, timeout_s=30) as client:
        assert client.info()["quantization"] == "fp8-weight-only"
        for workload in WORKLOADS:
            [(_, prompt)] = read_prompt_lines(directory / "workloads" / f"{workload}.jsonl")
            stats = SpeculationStats(4)
            ids = torch.tensor([prompt["tokens"]])
            out = speculative_decoding(target, ids, draft_client=client, num_draft_tokens=4, speculation_stats=stats,
                                       attention_mask=torch.ones_like(ids), max_new_tokens=12, min_new_tokens=12,
                                       do_sample=False)  # fmt: skip
            assert out[0, ids.shape[1] :].tolist() == hf_greedy(target, prompt["tokens"], 12)
            assert stats.num_skipped == 0 and stats.num_rounds >= 3
