"""The stream bench/adapt/run.py serves: prompts from a domain the testbed pair never saw. The pair was trained
on the Python standard library's modules and its reference docs (bench/testbed/corpus.py); this project's
own Markdown documentation (docs/*.md and README.md) is prose of another kind: tables, code spans, command
lines and the project's vocabulary. Its drafter agrees with its target there far less than on its own
domains (k = 8, teacher-forced on 96 greedy target tokens, 5 prompts each, one run: 1.84 tokens per round on
docs/*.md against 3.49 on held-out stdlib prose and 5.66 on held-out stdlib code; another package's Python,
starlette's, gave 6.19: code from outside the stdlib is no shift for it).

Prompts are cut as the testbed's prose workload cuts its own (bench/testbed/workloads.py: one per paragraph
start, ending at a sentence end, documents taken round-robin), EOS in front as its workloads have it.

The real pair (Qwen2.5-Coder-1.5B / 0.5B-Instruct) knows Python and Markdown alike; what is its own to a
deployment is a code base's style. Its stream is this project's own Python (drafter/, engine/, export/), cut
as the testbed's code workload cuts modules (one function head per module, seeded, with as much of the
module before it as fits): the target writes the function's body, raw completion, no chat template.

The documents change as the project does, so a report records each file and a hash of all of them.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

from bench.testbed import PAIR
from bench.testbed.corpus import Document
from bench.testbed.train import EOS_ID
from bench.testbed.workloads import at_token_boundary, code_prompts, prose_prompts

REPO = Path(__file__).resolve().parents[2]
SEQ_LEN = 512  # the testbed pair's trained window (bench/testbed/recipe.py)
MAX_PROMPT_TOKENS = 256  # shorter than the window needs: the stream's time goes to decoding, not prefill
CODE_ROOTS = ("drafter", "engine", "export")
CODE_SEED = 0


def documents() -> list[Document]:
    paths = [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md"]
    return [Document(f"prose/{p.relative_to(REPO)}", p.read_text(encoding="utf-8")) for p in paths]


def modules(roots: tuple[str, ...] = CODE_ROOTS) -> list[Document]:
    paths = sorted(p for root in roots for p in (REPO / root).rglob("*.py") if p.stat().st_size)
    return [Document(f"code/{p.relative_to(REPO)}", p.read_text(encoding="utf-8")) for p in paths]


def stream_prompts(num_prompts: int, max_new_tokens: int) -> tuple[list[dict], dict]:
    """The testbed's stream: `num_prompts` prompts (`{"name", "tokens"}`) of this project's docs, and what
    they were cut from (files, their hash)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(PAIR / "target" / "tokenizer.json"))
    budget = min(MAX_PROMPT_TOKENS, SEQ_LEN - max_new_tokens - 1)
    docs = documents()
    domain = "this project's Markdown documentation (prose the testbed pair never saw)"
    return cut_prompts(tokenizer, docs, prose_prompts(docs, tokenizer, budget), num_prompts, [EOS_ID], domain)


def code_stream_prompts(
    num_prompts: int, tokenizer_file: Path, roots: tuple[str, ...] = CODE_ROOTS
) -> tuple[list[dict], dict]:
    """The real pair's stream: `num_prompts` function heads of this project's Python under `roots`, cut with
    the target's tokenizer, and what they were cut from."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    code = modules(roots)
    cuts = code_prompts(code, tokenizer, MAX_PROMPT_TOKENS, random.Random(CODE_SEED))
    domain = f"this project's own Python under {', '.join(roots)} (a code base's style), function bodies"
    return cut_prompts(tokenizer, code, cuts, num_prompts, [], domain)


def cut_prompts(tokenizer, docs: list[Document], cuts, num_prompts: int, lead: list[int], domain: str):
    """The first `num_prompts` cuts as prompts, `lead` before each, and the source's description."""
    if len(cuts) < num_prompts:
        raise ValueError(f"the documents give {len(cuts)} prompts, fewer than the {num_prompts} asked for")
    prompts = []
    for name, source, cut in cuts[:num_prompts]:
        tokens, _ = at_token_boundary(tokenizer, source, cut)
        prompts.append({"name": name, "tokens": [*lead, *tokens]})
    digest = hashlib.sha256()
    for document in docs:
        digest.update(document.name.encode() + b"\0" + document.text.encode() + b"\0")
    source = {
        "domain": domain,
        "files": [d.name.split("/", 1)[1] for d in docs],
        "sha256": digest.hexdigest(),
        "prompts_available": len(cuts),
    }
    return prompts, source
