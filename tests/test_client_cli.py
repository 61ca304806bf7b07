"""`python -m drafter.client`: against a server of the target's own weights it prints both speeds, a full
k + 1 tokens per round and a matching output; bad input and an unreachable server exit 2 in one line."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys

import pytest

from tests.conftest import TARGET_MODEL
from tests.server_process import REPO


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "drafter.client", *args]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def target_dir(hf_checkpoint):
    return str(hf_checkpoint(TARGET_MODEL)[1])


def test_cli_speculates_through_the_server_and_matches(target_drafters, target_dir):
    done = cli(
        "--url",
        target_drafters["same"],
        "--target",
        target_dir,
        "--max-new-tokens=27",
        "--num-draft-tokens=8",
    )
    assert done.returncode == 0, done.stderr
    assert re.search(r"target alone: 27 tokens in [\d.]+ s, [\d.]+ tokens/s", done.stdout), done.stdout
    # 27 = 3 rounds of 8 accepted drafts + the target's own token
    assert "9.00 tokens per round of at most 9 over 3 rounds, 0 draft calls skipped" in done.stdout, (
        done.stdout
    )
    assert "note: the target kept every draft, as it does when it is the drafter's own model" in done.stdout
    assert "output matched: yes" in done.stdout


def test_cli_takes_the_prompt_and_checks_its_ids(target_drafters, target_dir):
    url = target_drafters["fp8"]
    done = cli("--url", url, "--target", target_dir, "--prompt-tokens", "5", "6", "7", "--max-new-tokens=10")
    assert done.returncode == 0 and "output matched: yes" in done.stdout, done.stderr
    done = cli("--url", url, "--target", target_dir, "--prompt-tokens", "5", "99999")
    assert done.returncode == 2 and "below the drafter's vocabulary size 997" in done.stderr
    assert "Traceback" not in done.stderr


def test_cli_unreachable_server_exits_2(target_dir):
    with socket.socket() as probe:  # a port nobody listens on once closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = cli("--url", f"http://127.0.0.1:{port}", "--target", target_dir)
    assert (
        done.returncode == 2 and "cannot reach the drafter" in done.stderr and "Traceback" not in done.stderr
    )


CHAT_TEMPLATE = "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} {% endfor %}<assistant>"


@pytest.fixture(scope="module")
def target_with_tokenizer(target_dir, tmp_path_factory):
    """The target's weights with a small word-level tokenizer beside them: one copy without a chat template,
    one with."""
    import shutil

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    # as many words as the target has ids, so every id it emits decodes to one
    words = ["<unk>", "</s>", "<user>", "<assistant>", "write", "a", "sort", "in", "python"]
    words += [f"w{i}" for i in range(997 - len(words))]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", eos_token="</s>")
    made = {}
    for name, template in (("plain", None), ("chat", CHAT_TEMPLATE)):
        directory = tmp_path_factory.mktemp(f"target-{name}")
        shutil.copytree(target_dir, directory, dirs_exist_ok=True)
        fast.chat_template = template
        fast.save_pretrained(directory)
        made[name] = str(directory)
    return made


@pytest.mark.parametrize("chat", [False, True])
def test_cli_speculates_on_a_text_prompt_and_prints_the_answer(target_drafters, target_with_tokenizer, chat):
    target = target_with_tokenizer["chat" if chat else "plain"]
    flags = ["--chat"] if chat else []
    done = cli("--url", target_drafters["fp8"], "--target", target, "--prompt", "write a sort in python",
               *flags, "--max-new-tokens=12")  # fmt: skip
    assert done.returncode == 0 and "output matched: yes" in done.stdout, done.stderr
    answer, _, report = done.stdout.partition("\n---\n")
    assert answer.strip() and "target alone:" in report  # the decoded answer first, then the speeds
    assert all(
        word in ("write", "a", "sort", "in", "python") or word[1:].isdigit() for word in answer.split()
    )


def test_cli_refuses_text_prompts_it_cannot_tokenize(target_drafters, target_dir, target_with_tokenizer):
    url = target_drafters["fp8"]
    done = cli("--url", url, "--target", target_dir, "--prompt", "write a sort")
    assert done.returncode == 2 and "--prompt needs the target's tokenizer" in done.stderr
    done = cli("--url", url, "--target", target_with_tokenizer["plain"], "--prompt", "sort", "--chat")
    assert done.returncode == 2 and "has no chat template" in done.stderr
    done = cli("--url", url, "--target", target_with_tokenizer["plain"], "--chat")
    assert done.returncode == 2 and "give --prompt TEXT" in done.stderr
    done = cli("--url", url, "--target", target_with_tokenizer["plain"], "--prompt", "  ")
    assert done.returncode == 2 and "--prompt is empty" in done.stderr
    assert "Traceback" not in done.stderr
