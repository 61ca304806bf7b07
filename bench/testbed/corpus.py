"""The testbed's corpus: real text every machine here has offline, the running Python's own standard
library. Code is its modules (tests, vendored tools and generated data left out); prose is the language and
library reference that `pydoc` ships (pydoc_data.topics: the docs' own English text). Both are split into
train and held-out sets by document, by a hash of its name, so a held-out file never leaks into training.

Edit documents stand in for agentic work: a chunk of a file, an instruction, and the chunk rewritten with a
rename, in the shape an assistant re-emits a file it was shown. Training sees some, so the pair learns to
copy from context as real models do; the `edit` workload is built the same way from held-out files.

`content_hash` covers every document's name and text: a different Python gives another hash, and the
recipe's key (bench/testbed/recipe.py) records it.
"""

from __future__ import annotations

import hashlib
import random
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

SKIPPED_PARTS = {"test", "tests", "idle_test", "site-packages", "__pycache__", "lib2to3", "ensurepip",
                 "turtledemo", "pydoc_data"}  # fmt: skip
IDENTIFIER = re.compile(r"\b[a-z_][a-z0-9_]{3,}\b")
KEYWORDS = {"self", "None", "True", "False", "return", "import", "from", "class", "def", "else", "elif",
            "while", "with", "raise", "pass", "break", "continue", "lambda", "yield", "assert", "async",
            "await", "global", "nonlocal", "except", "finally", "print", "args", "kwargs"}  # fmt: skip


@dataclass(frozen=True)
class Document:
    name: str  # "code/<path in the stdlib>" or "prose/<topic>"
    text: str

    @property
    def kind(self) -> str:
        return self.name.split("/", 1)[0]


@dataclass
class Corpus:
    train: list[Document]
    held_out: list[Document]

    def content_hash(self) -> str:
        digest = hashlib.sha256()
        for document in [*self.train, *self.held_out]:
            digest.update(document.name.encode() + b"\0" + document.text.encode() + b"\0")
        return digest.hexdigest()


def is_held_out(name: str, held_out_per_mille: int) -> bool:
    return int(hashlib.sha256(name.encode()).hexdigest(), 16) % 1000 < held_out_per_mille


def stdlib_documents(max_files: int | None = None) -> list[Document]:
    """Code then prose, in a fixed order; `max_files` keeps the first few of each (the miniature build)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    paths = [p for p in sorted(root.rglob("*.py")) if not SKIPPED_PARTS & set(p.relative_to(root).parts)]
    code = [Document(f"code/{p.relative_to(root)}", p.read_text(encoding="utf-8", errors="replace"))
            for p in paths[:max_files]]  # fmt: skip
    from pydoc_data.topics import topics

    prose = [Document(f"prose/{name}", topics[name]) for name in sorted(topics)[:max_files]]
    return code + prose


def load_corpus(held_out_per_mille: int, max_files: int | None = None) -> Corpus:
    documents = stdlib_documents(max_files)
    held = [d for d in documents if is_held_out(d.name, held_out_per_mille)]
    for kind in ("code", "prose") if max_files is not None else ():  # a miniature still needs both held out
        if not any(d.kind == kind for d in held):
            held.append(next(d for d in documents if d.kind == kind))
    names = {d.name for d in held}
    return Corpus([d for d in documents if d.name not in names], held)


def rename_edit(document: Document, rng: random.Random, num_lines: int) -> tuple[str, str] | None:
    """(context, rewrite) for one chunk of a code file: the chunk shown, an instruction to rename one of its
    identifiers, and the start of the answer; then the chunk rewritten. None if the chunk has no candidate."""
    lines = document.text.splitlines(keepends=True)
    if len(lines) < 8:
        return None
    start = rng.randrange(max(1, len(lines) - num_lines))
    chunk = "".join(lines[start : start + num_lines])
    counts: dict[str, int] = {}
    for name in IDENTIFIER.findall(chunk):
        if name not in KEYWORDS:
            counts[name] = counts.get(name, 0) + 1
    candidates = sorted(name for name, count in counts.items() if count >= 2)
    if not candidates:
        return None
    old = rng.choice(candidates)
    new = rng.choice(("new_", "the_", "my_", "")) + old + rng.choice(("_value", "_list", "2", "_obj", ""))
    if new == old:
        new = old + "_renamed"
    path = document.name.removeprefix("code/")
    shown = f'<file path="{path}">\n{chunk}</file>\n'
    instruction = f"Rename `{old}` to `{new}` and show the whole file.\n"
    rewritten = re.sub(rf"\b{re.escape(old)}\b", new, chunk)
    return shown + instruction + f'<file path="{path}">\n', rewritten + "</file>\n"


def edit_documents(code: list[Document], seed: int, every: int, num_lines: int) -> list[Document]:
    """One rename edit for every `every`-th code file (seeded), as training documents."""
    rng = random.Random(seed)
    documents = []
    for document in code[::every]:
        edit = rename_edit(document, rng, num_lines)
        if edit is not None:
            documents.append(Document(f"edit/{document.name}", edit[0] + edit[1]))
    return documents
