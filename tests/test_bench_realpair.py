"""`python -m bench.acceptance --realpair [DIR]`: its defaults; a directory that is not a finished fetch exits
2 with one line naming the fetch; on a fake real pair laid out from the testbed pair (its target given a
ChatML chat template: it has none of its own) the run covers one workload per kind of
bench/realpair/prompts.jsonl and is lossless; and, once `python -m bench.realpair fetch` has run, the same on
the real pair."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest

from bench.acceptance import main
from bench.acceptance_args import parse_args
from bench.harness.decoding import PAIR_DRAFTERS
from bench.realpair.benchmark import DEFAULT_DIR, missing, plain_greedy
from bench.realpair.workloads import KINDS, load_prompts
from bench.testbed import PAIR
from tests.test_realpair_prompts import CHATML

pytestmark = pytest.mark.usefixtures("one_thread")
FETCHED = missing(DEFAULT_DIR, PAIR_DRAFTERS["weight-only"])


@pytest.fixture(scope="module")
def fake_realpair(tmp_path_factory):
    """build/realpair/'s layout made of the testbed pair: target/ with a chat template, drafters linked."""
    from transformers import PreTrainedTokenizerFast

    directory = tmp_path_factory.mktemp("realpair")
    target = directory / "target"
    target.mkdir()
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        shutil.copy(PAIR / "target" / name, target / name)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(PAIR / "target" / "tokenizer.json"), eos_token="<|endoftext|>"
    )
    tokenizer.chat_template = CHATML
    tokenizer.save_pretrained(target)
    for name in PAIR_DRAFTERS.values():
        (directory / name).symlink_to(PAIR / name, target_is_directory=True)
    return directory


def test_realpair_defaults_suit_a_two_core_cpu():
    args = parse_args(["--realpair"], "")
    assert args.pair == args.realpair == DEFAULT_DIR and args.target == DEFAULT_DIR / "target"
    assert args.max_new_tokens == 96 and args.num_draft_tokens == [4, 8, "auto"]
    assert args.source == ["model", "hybrid"] and args.stop_at_eos and args.dtype == "float32"
    assert [gpu.name for gpu in args.gpus] == [
        "H100, Qwen2.5-Coder-1.5B / 0.5B FP8",
        "H100, Qwen3-8B / 0.6B FP8",
    ]
    quick = parse_args(["--realpair", "elsewhere", "--quick", "--no-stop-at-eos", "--source=suffix"], "")
    assert quick.max_new_tokens == 64 and not quick.stop_at_eos and quick.source == ["suffix"]
    assert str(quick.target) == "elsewhere/target"
    testbed = parse_args(["--testbed"], "")
    assert not testbed.stop_at_eos and testbed.source == ["model"] and len(testbed.gpus) == 1


def test_realpair_given_gpu_figures_replace_the_first_models():
    args = parse_args(["--realpair", "--gpu-verify-ms=2", "--gpu-draft-overhead-ms=0.1"], "")
    first, second = args.gpus
    assert (first.verify_ms, first.draft_overhead_ms) == (2, 0.1) and "Given: verify_ms 2" in first.basis
    assert second.name == "H100, Qwen3-8B / 0.6B FP8" and second.verify_ms > 4


def test_realpair_quick_needs_realpair(capsys):
    with pytest.raises(SystemExit) as exited:
        parse_args(["--testbed", "--quick"], "")
    assert exited.value.code == 2 and "give --realpair" in capsys.readouterr().err


def test_realpair_target_decodes_plain_greedy_to_the_chat_end():
    """Qwen2.5-Coder-Instruct's generation_config.json samples with a repetition penalty; the benchmark
    measures greedy decoding, and stops at the tokenizer's EOS (<|im_end|>) as well as the config's."""
    from transformers import GenerationConfig

    config = GenerationConfig(do_sample=True, temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.1,
                              eos_token_id=151643, pad_token_id=151643)  # fmt: skip
    model = SimpleNamespace(generation_config=config)
    generation = plain_greedy(model, SimpleNamespace(eos_token_id=151645))
    assert generation["set_aside"] == {
        "do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.1
    }  # fmt: skip
    assert config.eos_token_id == generation["eos_token_ids"] == [151643, 151645]
    assert (config.do_sample, config.repetition_penalty, config.temperature) == (None, None, None)
    config.validate(strict=True)  # nothing left that greedy decoding would warn about


@pytest.mark.parametrize("layout", ["no directory", "no drafter", "no tokenizer"])
def test_realpair_missing_fetch_exits_2_with_one_line(tmp_path, capsys, layout):
    directory = tmp_path / "realpair"
    if layout != "no directory":
        (directory / "target").mkdir(parents=True)
        for name in ("config.json", "model.safetensors"):
            shutil.copy(PAIR / "target" / name, directory / "target" / name)
    if layout == "no tokenizer":
        (directory / "drafter-fp8-weight-only").symlink_to(PAIR / "drafter-fp8-weight-only")
    assert main(["--realpair", str(directory)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "run `python -m bench.realpair fetch` first" in err, err
    assert {"no directory": "does not exist", "no drafter": "no drafter-fp8-weight-only/ checkpoint",
            "no tokenizer": "has no tokenizer"}[layout] in err  # fmt: skip


def run_quick(directory, tmp_path, *flags) -> tuple[dict, str]:
    out = tmp_path / "out"
    argv = ["--realpair", str(directory), "--quick", "--device=cpu", "--out", str(out), *flags]
    assert main(argv) == 0
    return json.loads((out / "report.json").read_text()), (out / "report.md").read_text()


def test_realpair_on_a_fake_pair_runs_each_kind_losslessly(fake_realpair, tmp_path):
    report, markdown = run_quick(
        fake_realpair, tmp_path, "--max-new-tokens=8", "--num-draft-tokens=4", "--source=model"
    )
    assert report["lossless"] and "Lossless (every output exactly the target's alone): yes." in markdown
    assert [r["workload"] for r in report["results"]] == list(KINDS)
    config = report["config"]
    assert config["num_prompts"] == {kind: len(load_prompts(kind, quick=True)) for kind in KINDS}
    assert config["stop_at_eos"] and config["url"] == "started by --realpair" and config["quick"]
    assert config["generation"] == {"decoding": "greedy", "set_aside": {}, "eos_token_ids": [0]}
    for row in report["results"]:
        assert row["lossless"] and row["rounds"] >= 2 and all(len(out) <= 8 for out in row["outputs"])
        assert set(row["projected_gpu_by_model"]) == {gpu["name"] for gpu in config["gpu_models"]}
    assert "projected speedup, H100, Qwen2.5-Coder-1.5B / 0.5B FP8 |" in markdown
    assert "Qwen2.5-Coder-1.5B's 3.09 GB of bf16 weights" in markdown and "3.35 TB/s" in markdown


@pytest.mark.slow
@pytest.mark.realpair
@pytest.mark.skipif(FETCHED is not None, reason=f"needs `python -m bench.realpair fetch` first: {FETCHED}")
def test_realpair_quick_on_the_real_pair_is_lossless(tmp_path):
    report, _ = run_quick(DEFAULT_DIR, tmp_path, "--max-new-tokens=16", "--num-draft-tokens=4")
    assert report["lossless"] and all(r["lossless"] for r in report["results"])
    assert {r["workload"] for r in report["results"]} == set(KINDS)
    assert report["config"]["drafter"]["quantization"] == "fp8-weight-only"


def test_rounds_by_agreement_are_the_loops_rounds():
    """bench.realpair rounds: a k-draft loop keeps the run of agreements from each round's start, at most k,
    never past the output's last token, then the target's own token."""
    from bench.realpair.rounds import round_log

    agree = [True, True, False, True, True, True, True, False, True]
    assert round_log(agree, 2) == [(2, 2), (2, 2), (2, 1), (0, 0)]  # rounds at 0, 3, 6 and 8
    assert round_log(agree, 8) == [(8, 2), (5, 4), (0, 0)]  # the last round has no room to draft
    assert round_log([], 4) == []


def test_rounds_on_a_fake_pair_equal_the_measured_loop(fake_realpair, tmp_path):
    """The exact tokens per round from teacher-forced agreement equal the speculative loop's, measured."""
    from bench.realpair.__main__ import main as realpair_main

    out = tmp_path / "rounds"
    argv = [
        "rounds",
        "--dir",
        str(fake_realpair),
        "--quick",
        "--max-new-tokens=12",
        "--k=4",
        "--drafters=weight-only,bf16",
        "--out",
        str(out),
    ]
    assert realpair_main(argv) == 0
    report = json.loads((out / "report.json").read_text())
    exact = {
        row["workload"]: row["tokens_per_round"]
        for row in report["results"]
        if row["drafter"] == "weight-only"
    }
    assert {row["drafter"] for row in report["results"]} == {"weight-only", "bf16"}
    assert "greedy token differs from bf16's" in (out / "report.md").read_text()
    measured, _ = run_quick(
        fake_realpair, tmp_path, "--max-new-tokens=12", "--num-draft-tokens=4", "--source=model"
    )
    loop = {row["workload"]: row["mean_accepted_tokens"] for row in measured["results"]}
    assert exact.keys() == loop.keys() == set(KINDS)
    for kind in KINDS:  # up to a near-tie between a decode step's rounding and a prefill's
        assert exact[kind] == pytest.approx(loop[kind], rel=0.05), (kind, exact, loop)
    gpu = measured["config"]["gpu_models"][0]["name"]
    projected = {
        r["workload"]: r["projected"][gpu] for r in report["results"] if r["drafter"] == "weight-only"
    }
    for row in measured["results"]:
        assert projected[row["workload"]] == pytest.approx(row["projected_gpu"]["speedup"], rel=0.05)
