"""bench/realpair's prompts: the file parses into at least 16 prompts of each kind with unique ids, a source
each and a quick subset; malformed lines are refused by line; `chat_ids` turns messages into token ids with
a chat template (the testbed's tokenizer, given a ChatML template here: it has none of its own)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from bench.realpair.workloads import KINDS, PROMPTS_FILE, PromptsError, RealPrompt, chat_ids, load_prompts

TESTBED_TOKENIZER = Path(__file__).resolve().parents[1] / "bench/testbed/pair/target/tokenizer.json"
# Qwen2.5's template without its default system prompt and tool calls: ChatML turns.
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_the_file_has_at_least_16_prompts_of_each_kind_with_unique_ids_and_sources():
    prompts = load_prompts()
    counts = Counter(prompt.kind for prompt in prompts)
    assert set(counts) == set(KINDS) and min(counts.values()) >= 16, counts
    assert len({prompt.id for prompt in prompts}) == len(prompts)
    for prompt in prompts:
        assert prompt.id.startswith(f"{prompt.kind}-"), prompt.id
        assert prompt.source.strip(), prompt.id
        if "quotes" in prompt.source:  # quoted text names its license
            assert "License" in prompt.source or "public domain" in prompt.source, prompt.id
    assert sum(len(load_prompts(kind)) for kind in KINDS) == len(prompts)
    assert all(prompt.kind == "edit" for prompt in load_prompts("edit"))


def test_edit_prompts_include_multi_turn_exchanges():
    """The user's last turn changes code an assistant turn gave, so that earlier content comes back."""
    multi_turn = [p for p in load_prompts("edit") if any(m["role"] == "assistant" for m in p.messages)]
    assert len(multi_turn) >= 4
    assert all(prompt.messages[-1]["role"] == "user" for prompt in load_prompts())


def test_quick_subset_has_at_least_two_of_each_kind():
    quick = load_prompts(quick=True)
    assert all(prompt.quick for prompt in quick)
    assert min(Counter(prompt.kind for prompt in quick).values()) >= 2
    assert {prompt.kind for prompt in quick} == set(KINDS)
    assert len(quick) < len(load_prompts()) / 4
    assert [p.id for p in load_prompts("code", quick=True)] == [p.id for p in quick if p.kind == "code"]


def test_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="unknown kind 'poetry'"):
        load_prompts("poetry")


GOOD = {
    "id": "code-01",
    "kind": "code",
    "messages": [{"role": "user", "content": "Write a function."}],
    "source": "written for this test",
    "quick": False,
}


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"kind": "poem"}, "kind 'poem' is not one of code, prose, edit"),
        ({"messages": []}, "'messages' must be a non-empty list"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "message 0: role 'robot'"),
        ({"messages": [{"role": "user"}]}, "message 0 must be an object with exactly 'role' and 'content'"),
        ({"messages": [{"role": "user", "content": " "}]}, "message 0: 'content' must be a non-empty string"),
        (
            {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
            "the last message must be the user's, not the assistant's",
        ),
        (
            {"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]},
            "message 1: a system message may only come first",
        ),
        ({"source": ""}, "'source' must be a non-empty string"),
        ({"quick": "yes"}, "'quick' must be true or false"),
        ({"extra": 1}, "unknown extra"),
    ],
)
def test_a_malformed_line_is_refused_by_its_number(tmp_path, change, error):
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps(GOOD) + "\n\n" + json.dumps({**GOOD, "id": "code-02", **change}) + "\n")
    with pytest.raises(PromptsError, match=f"line 3: .*{re.escape(error)}"):
        load_prompts(path=path)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("{not json", "line 2: not valid JSON"),
        ("[1, 2]", "line 2: expected a JSON object, got list"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "source"}), "line 2: .*missing source"),
        (json.dumps(GOOD), "line 2: id 'code-01' is already used on line 1"),
    ],
)
def test_bad_json_missing_fields_and_duplicate_ids_are_refused(tmp_path, text, error):
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + text + "\n")
    with pytest.raises(PromptsError, match=error):
        load_prompts(path=path)


def test_an_empty_or_missing_file_is_refused(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(PromptsError, match="has no prompts"):
        load_prompts(path=tmp_path / "empty.jsonl")
    with pytest.raises(PromptsError, match="cannot read prompts file"):
        load_prompts(path=tmp_path / "absent.jsonl")


@pytest.fixture(scope="module")
def chat_tokenizer():
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(TESTBED_TOKENIZER), eos_token="<|endoftext|>")
    tokenizer.chat_template = CHATML
    return tokenizer


def test_chat_ids_applies_the_chat_template_and_returns_ints(chat_tokenizer):
    for prompt in load_prompts(quick=True) + [p for p in load_prompts("edit") if len(p.messages) >= 4]:
        ids = chat_ids(prompt, chat_tokenizer)
        assert ids and all(type(token) is int for token in ids)
        text = chat_tokenizer.apply_chat_template(
            [dict(m) for m in prompt.messages], add_generation_prompt=True, tokenize=False
        )
        assert text.endswith("<|im_start|>assistant\n")
        assert prompt.messages[-1]["content"] in text
        assert ids == chat_tokenizer.encode(text, add_special_tokens=False)


class ReturnsAsIs:
    """A tokenizer whose chat template returns whatever it was given, as older transformers might."""

    def __init__(self, encoded):
        self.encoded = encoded

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        assert add_generation_prompt and tokenize and messages[-1]["role"] == "user"
        return self.encoded


@pytest.mark.parametrize(
    "encoded", [[5, 6, 7], [[5, 6, 7]], {"input_ids": [5, 6, 7], "attention_mask": [1, 1, 1]}]
)
def test_chat_ids_accepts_a_list_a_batch_of_one_or_a_mapping(encoded):
    prompt = RealPrompt("x-1", "code", ({"role": "user", "content": "hi"},), "test", False)
    assert chat_ids(prompt, ReturnsAsIs(encoded)) == [5, 6, 7]


def test_the_loader_does_not_import_torch():
    root = Path(__file__).resolve().parents[1]
    code = "import sys, bench.realpair.workloads as w; w.load_prompts(); assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True)


def test_the_prompts_file_sits_next_to_the_loader():
    assert PROMPTS_FILE.name == "prompts.jsonl" and PROMPTS_FILE.is_file()
