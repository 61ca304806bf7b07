"""The testbed's workloads: prompts cut from held-out documents only, written as JSONL that bench/ reads
(`{"workload", "name", "tokens", "text"}` per line; `tokens` is EOS, the documents' separator, then the
document's own tokens up to the cut, whose text is `text`).

- prose: a reference topic cut after a sentence, mid-paragraph: the target continues the paragraph;
- code: a module cut after a `def ...:` line: the target writes the function's body;
- edit: a chunk of a module, an instruction to rename an identifier in it, and the start of the answer: the
  target re-emits the chunk with the change (agentic work, where lookup-based drafting is judged).

Each prompt leaves `workload_new_tokens` of room below the models' trained window.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

from bench.testbed.corpus import Corpus, Document, rename_edit
from bench.testbed.recipe import Recipe
from bench.testbed.train import EOS_ID

WORKLOADS = ("prose", "code", "edit")
MIN_PROMPT_TOKENS = 24
SENTENCE_END = re.compile(r"\.(?=[ \t]+\S|\n[ \t]*\S)")  # followed by more of the same paragraph
FUNCTION_HEAD = re.compile(r"^[ \t]*def [^\n]*\):[ \t]*\n(?=[ \t]+\S)", re.MULTILINE)


def token_budget(recipe: Recipe) -> int:
    return recipe.seq_len - recipe.workload_new_tokens - 1  # the EOS in front


def char_limit(tokenizer, text: str, budget: int) -> int:
    """How many leading characters of `text` fit in `budget` tokens."""
    offsets = tokenizer.encode(text, add_special_tokens=False).offsets
    return len(text) if len(offsets) <= budget else offsets[budget][0]


def prose_prompts(documents: list[Document], tokenizer, budget: int) -> list[tuple[str, str, int]]:
    """Per document, one prompt from each paragraph start, taken round-robin so that documents vary."""
    per_document = []
    for document in documents:
        text, found = document.text, []
        for start in [0, *(m.end() for m in re.finditer(r"\n\n", document.text))]:
            window = text[start : start + 8 * budget]
            limit = char_limit(tokenizer, window, budget)
            ends = [m.start() + 1 for m in SENTENCE_END.finditer(window, 0, limit)]
            if ends and len(tokenizer.encode(window[: ends[-1]]).ids) >= MIN_PROMPT_TOKENS:
                found.append((f"{document.name}@{start}", window, ends[-1]))
        per_document.append(found)
    return [prompt for round_ in zip_longest_lists(per_document) for prompt in round_]


def code_prompts(
    documents: list[Document], tokenizer, budget: int, rng: random.Random
) -> list[tuple[str, str, int]]:
    """Per module, one function head (seeded choice) with as much of the module before it as fits."""
    prompts = []
    for document in documents:
        heads = [m.end() for m in FUNCTION_HEAD.finditer(document.text)]
        if heads:
            end = rng.choice(heads)
            before = document.text[:end]
            lines = before.splitlines(keepends=True)
            while len(tokenizer.encode("".join(lines)).ids) > budget and len(lines) > 1:
                lines = lines[max(1, len(lines) // 8) :]
            prompt = "".join(lines)
            if MIN_PROMPT_TOKENS <= len(tokenizer.encode(prompt).ids) <= budget:
                source = document.text[end - len(prompt) : end + 8 * budget]
                prompts.append((f"{document.name}@{end}", source, len(prompt)))
    return prompts


def edit_prompts(documents: list[Document], tokenizer, budget: int, rng: random.Random, num_lines: int):
    """Per module, one rename edit whose context fits (its chunk shortened until it does)."""
    prompts = []
    for document in documents:
        for lines in range(num_lines, 3, -2):
            edit = rename_edit(document, random.Random(rng.random()), lines)
            if edit is not None and len(tokenizer.encode(edit[0]).ids) <= budget:
                prompts.append((document.name, edit[0] + edit[1], len(edit[0])))
                break
    return prompts


def zip_longest_lists(lists: list[list]) -> list[list]:
    rounds = max(map(len, lists), default=0)
    return [[items[i] for items in lists if i < len(items)] for i in range(rounds)]


def build_workloads(corpus: Corpus, tokenizer, recipe: Recipe) -> dict[str, list[dict]]:
    budget, rng = token_budget(recipe), random.Random(recipe.seed)
    prose = [d for d in corpus.held_out if d.kind == "prose"]
    code = [d for d in corpus.held_out if d.kind == "code"]
    candidates = {
        "prose": prose_prompts(prose, tokenizer, budget),
        "code": code_prompts(code, tokenizer, budget, rng),
        "edit": edit_prompts(code, tokenizer, budget, rng, recipe.edit_lines),
    }
    workloads = {}
    for workload, prompts in candidates.items():
        chosen = prompts[: recipe.workload_prompts]
        if not chosen:
            raise ValueError(f"the held-out documents give no {workload} prompt")
        workloads[workload] = []
        for name, source, cut in chosen:
            tokens, text = at_token_boundary(tokenizer, source, cut)
            workloads[workload].append(
                {"workload": workload, "name": name, "tokens": [EOS_ID, *tokens], "text": text}
            )
    return workloads


def at_token_boundary(tokenizer, source: str, cut: int) -> tuple[list[int], str]:
    """The tokens of `source` that end by character `cut`, and their text. A prompt is cut from its
    document's own encoding: encoding the prompt alone would split the token that crosses the cut (a line
    break and the next line's indent are one token), a split training never showed the models."""
    encoding = tokenizer.encode(source, add_special_tokens=False)
    count = sum(1 for _, end in encoding.offsets if end <= cut)
    return encoding.ids[:count], source[: encoding.offsets[count - 1][1]]


def write_workloads(workloads: dict[str, list[dict]], directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for workload, prompts in workloads.items():
        lines = [json.dumps(prompt, ensure_ascii=False) for prompt in prompts]
        (directory / f"{workload}.jsonl").write_text("\n".join(lines) + "\n")
