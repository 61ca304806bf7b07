"""`python -m bench.acceptance` against real drafter servers: with the target's own weights as the drafter
every draft is accepted, with an FP8 export of them some are not, and either way the output is exactly
transformers' greedy generate (lossless). Bad input exits 2 with one line saying why. The loop itself is
tested in tests/test_speculative.py."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest
import torch

import bench.acceptance
from bench.acceptance import main, random_prompts, target_greedy
from tests.conftest import TARGET_MODEL as MODEL
from tests.oracle import HF_CONFIGS, hf_greedy
from tests.server_process import REPO

pytestmark = pytest.mark.usefixtures("one_thread")
VOCAB_SIZE = HF_CONFIGS[MODEL]["vocab_size"]


@pytest.fixture(scope="module")
def target(hf_checkpoint):
    return hf_checkpoint(MODEL)


@pytest.fixture(scope="module")
def urls(target_drafters):
    return target_drafters


def prompts_file(path) -> tuple[str, list[list[int]]]:
    """A JSONL file with both accepted forms of token ids, and the prompts it holds."""
    generator = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, VOCAB_SIZE, (n,), generator=generator).tolist() for n in (1, 37, 150)]
    lines = [
        json.dumps({"tokens": prompts[0]}),
        json.dumps(prompts[1]),
        "",
        json.dumps({"tokens": prompts[2]}),
    ]
    path.write_text("\n".join(lines) + "\n")
    return str(path), prompts


def run_all(target, url, tmp_path, *args) -> tuple[int, dict]:
    _, directory = target
    out = tmp_path / "report.json"
    code = main(["--target", str(directory), "--url", url, "--device", "cpu", "--json", str(out), *args])
    return code, json.loads(out.read_text())


def run(target, url, tmp_path, *args) -> tuple[int, dict]:
    """One workload, one k: its result."""
    code, report = run_all(target, url, tmp_path, *args)
    [result] = report["results"]
    assert report["lossless"] == result["lossless"]
    return code, result


def test_acceptance_own_weights_accept_every_draft(target, urls, tmp_path):
    model, _ = target
    path, prompts = prompts_file(tmp_path / "prompts.jsonl")
    code, report = run(
        target, urls["same"], tmp_path, "--prompts", path, "--max-new-tokens=45", "--num-draft-tokens=8"
    )
    assert code == 0
    assert report["outputs"] == [hf_greedy(model, prompt, 45) for prompt in prompts]
    assert report["target_only_outputs"] == report["outputs"] and report["lossless"]
    assert report["mean_accepted_tokens"] == 9 and report["acceptance_by_position"] == [1.0] * 8
    assert report["rounds"] == 5 * len(prompts)  # 45 = 5 rounds of 8 drafts + the target's own token
    assert report["draft_call_ms"]["p50"] > 0 and report["draft_wait_share"] > 0


def test_acceptance_counts_clipped_final_rounds(target, urls, tmp_path):
    # 30 new tokens with k = 8: three full rounds of 9, then one of k = 2 drafts + the target's token.
    code, report = run(target, urls["same"], tmp_path, "--max-new-tokens=30", "--num-draft-tokens=8")
    assert code == 0 and report["lossless"] and all(len(out) == 30 for out in report["outputs"])
    assert report["rounds"] == 4 * 4 and report["mean_accepted_tokens"] == 30 / 4
    assert report["acceptance_by_position"] == [1.0] * 8  # position i counts only rounds that drafted it


def test_acceptance_fp8_drafter_stays_lossless(target, urls, tmp_path, capsys):
    model, _ = target
    code, report = run(target, urls["fp8"], tmp_path, "--max-new-tokens=64", "--num-draft-tokens=8")
    assert code == 0 and report["lossless"]
    assert report["outputs"] == [hf_greedy(model, p, 64) for p in random_prompts(VOCAB_SIZE, max_len=449)]
    assert 1 <= report["mean_accepted_tokens"] <= 9
    assert len(report["acceptance_by_position"]) == 8
    assert all(0 <= a <= 1 for a in report["acceptance_by_position"])
    with capsys.disabled():
        print(
            f"\nFP8 drafter of {MODEL}: mean accepted tokens {report['mean_accepted_tokens']:.2f}, "
            f"acceptance by position {[round(a, 3) for a in report['acceptance_by_position']]}, "
            f"speedup {report['speedup']:.2f}x over {report['rounds']} rounds"
        )


def test_acceptance_tokenizes_text_prompts_with_the_targets_tokenizer(target, urls, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    model, directory = target
    with_tokenizer = tmp_path / "target"
    shutil.copytree(directory, with_tokenizer)
    words = Tokenizer(models.WordLevel({"?": 0, "the": 1, "cat": 2, "sat": 3}, unk_token="?"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="?").save_pretrained(with_tokenizer)
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"text": "the cat sat"}\n')
    code, report = run(
        (model, with_tokenizer), urls["same"], tmp_path, "--prompts", str(path), "--max-new-tokens=9"
    )
    assert code == 0 and report["outputs"] == [hf_greedy(model, [1, 2, 3], 9)]


def test_acceptance_exits_1_when_not_lossless(target, urls, tmp_path, monkeypatch):
    def off_by_one_at_5(model, prompt, max_new_tokens, stop_at_eos):
        out = target_greedy(model, prompt, max_new_tokens, stop_at_eos)
        return out[:5] + [(out[5] + 1) % VOCAB_SIZE] + out[6:]

    monkeypatch.setattr(bench.acceptance, "target_greedy", off_by_one_at_5)
    code, report = run(target, urls["same"], tmp_path, "--max-new-tokens=9")
    assert code == 1 and not report["lossless"] and report["first_mismatch"] == [5] * 4


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"tokens": [1, 2, 997]}', "line 2: token id 997 is outside the target's vocabulary [0, 997)"),
        ('{"tokens": [1, 2', "line 2: not valid JSON"),
        ('{"text": "hello"}', "line 2: a text prompt needs a tokenizer"),
        ("[1, true]", "line 2: token ids must be a non-empty list of integers"),
    ],
)
def test_acceptance_bad_prompts_exit_2(target, urls, tmp_path, capsys, line, message):
    _, directory = target
    path = tmp_path / "prompts.jsonl"
    path.write_text(f"[1, 2, 3]\n{line}\n")
    assert main(["--target", str(directory), "--url", urls["same"], "--prompts", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and str(path) in err, err


def test_acceptance_unreachable_server_exits_2(target):
    _, directory = target
    with socket.socket() as probe:  # a port nobody listens on once closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [
        sys.executable,
        "bench/acceptance.py",
        "--target",
        str(directory),
        "--url",
        f"http://127.0.0.1:{port}",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # this checkout's `bench`, not an installed copy
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "cannot reach the drafter" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_acceptance_runs_workloads_by_k_with_auto_and_writes_its_files(target, urls, tmp_path):
    model, _ = target
    path, prompts = prompts_file(tmp_path / "code.jsonl")
    code, report = run_all(target, urls["same"], tmp_path, "--prompts", path, "--max-new-tokens=20",
                           "--num-draft-tokens=4,auto", "--out", str(tmp_path / "out"))  # fmt: skip
    assert code == 0 and report["lossless"]
    fixed, auto = report["results"]
    assert (fixed["workload"], fixed["num_draft_tokens"], auto["num_draft_tokens"]) == ("code", 4, "auto")
    assert auto["outputs"] == [hf_greedy(model, prompt, 20) for prompt in prompts]
    assert auto["mean_drafts_per_round"] >= 1 and set(auto["acceptance_by_position"]) == {1.0}
    assert fixed["projected_gpu"]["speedup"] > 1  # every draft accepted: any cost model gains
    assert report["summary"]["code"]["measured"]["best_fixed_k"] == 4
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"report.json", "report.md", "speedup.png"}
    assert "| code | model | auto |" in (tmp_path / "out" / "report.md").read_text()
