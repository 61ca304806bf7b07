"""The stream bench/adapt.py serves: prompts from a domain the testbed pair never saw. The pair was trained
on the Python standard library's modules and its reference docs (bench/testbed/corpus.py); this project's
own Markdown documentation (docs/*.md and README.md) is prose of another kind: tables, code spans, command
lines and the project's vocabulary. Its drafter agrees with its target there far less than on its own
domains (k = 8, teacher-forced on 96 greedy target tokens, 5 prompts each, one run: 1.84 tokens per round on
docs/*.md against 3.49 on held-out stdlib prose and 5.66 on held-out stdlib code; another package's Python,
starlette's, gave 6.19: code from outside the stdlib is no shift for it).

Prompts are cut as the testbed's prose workload cuts its own (bench/testbed/workloads.py: one per paragraph
start, ending at a sentence end, documents taken round-robin), EOS in front as its workloads have it. The
documents change as the project does, so a report records each file and a hash of all of them.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from bench.testbed import PAIR
from bench.testbed.corpus import Document
from bench.testbed.train import EOS_ID
from bench.testbed.workloads import at_token_boundary, prose_prompts

REPO = Path(__file__).resolve().parents[1]
SEQ_LEN = 512  # the testbed pair's trained window (bench/testbed/recipe.py)
MAX_PROMPT_TOKENS = 256  # shorter than the window needs: the stream's time goes to decoding, not prefill


def documents() -> list[Document]:
    paths = [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md"]
    return [Document(f"prose/{p.relative_to(REPO)}", p.read_text(encoding="utf-8")) for p in paths]


def stream_prompts(num_prompts: int, max_new_tokens: int) -> tuple[list[dict], dict]:
    """`num_prompts` prompts (`{"name", "tokens"}`), and what they were cut from (files, their hash)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(PAIR / "target" / "tokenizer.json"))
    budget = min(MAX_PROMPT_TOKENS, SEQ_LEN - max_new_tokens - 1)
    docs = documents()
    cuts = prose_prompts(docs, tokenizer, budget)
    if len(cuts) < num_prompts:
        raise ValueError(f"the documents give {len(cuts)} prompts, fewer than the {num_prompts} asked for")
    prompts = []
    for name, source, cut in cuts[:num_prompts]:
        tokens, _ = at_token_boundary(tokenizer, source, cut)
        prompts.append({"name": name, "tokens": [EOS_ID, *tokens]})
    digest = hashlib.sha256()
    for document in docs:
        digest.update(document.name.encode() + b"\0" + document.text.encode() + b"\0")
    source = {
        "domain": "this project's Markdown documentation (prose the testbed pair never saw)",
        "files": [d.name.removeprefix("prose/") for d in docs],
        "sha256": digest.hexdigest(),
        "prompts_available": len(cuts),
    }
    return prompts, source
