"""Prompts for the acceptance benchmark: a JSONL file of token ids or text (tokenized with the target's own
tokenizer), or seeded random ids; every problem is a BenchError naming the line."""

from __future__ import annotations

import json
from pathlib import Path

import torch

RANDOM_PROMPT_LENS = (16, 64, 128, 200)
PROMPT_SEED, WARMUP_SEED, WARMUP_PROMPT_LEN = 0, 1, 32
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


class BenchError(Exception):
    """Bad input or an unusable server: one line for the user, exit code 2."""


def read_prompt_lines(path: Path) -> list[tuple[str, object]]:
    """(where, parsed JSON) for each non-blank line; `where` names the line in later errors."""
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise BenchError(f"cannot read prompts file {str(path)!r}: {error}") from None
    entries = []
    for number, line in enumerate(lines, 1):
        if line.strip():
            try:
                entries.append((f"{path} line {number}", json.loads(line)))
            except json.JSONDecodeError as error:
                raise BenchError(f"{path} line {number}: not valid JSON ({error.msg})") from None
    if not entries:
        raise BenchError(f"prompts file {str(path)!r} has no prompts")
    return entries


def is_text(entry) -> bool:
    return isinstance(entry, dict) and isinstance(entry.get("text"), str)


def load_tokenizer(target: Path, entries: list[tuple[str, object]]):
    """The target's tokenizer when some prompt is text, else None."""
    where = next((where for where, entry in entries if is_text(entry)), None)
    if where is None:
        return None
    # transformers makes an empty tokenizer out of nothing, so look for its files first.
    if not any((target / name).is_file() for name in TOKENIZER_FILES):
        raise BenchError(f"{where}: a text prompt needs a tokenizer and {target} has none; give token ids")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(target)


def prompt_tokens(where: str, entry, tokenizer, vocab_size: int) -> list[int]:
    """One JSONL entry as token ids: `{"tokens": [...]}`, `{"text": "..."}` or a bare list of ids."""
    if is_text(entry):
        tokens = tokenizer.encode(entry["text"])
    elif isinstance(entry, dict) and "tokens" in entry:
        tokens = entry["tokens"]
    elif isinstance(entry, list):
        tokens = entry
    else:
        raise BenchError(f'{where}: expected {{"tokens": [ids]}}, {{"text": "..."}} or a JSON list of ids')
    if not isinstance(tokens, list) or not tokens or any(type(t) is not int for t in tokens):
        raise BenchError(f"{where}: token ids must be a non-empty list of integers")
    outside = next((t for t in tokens if not 0 <= t < vocab_size), None)
    if outside is not None:
        raise BenchError(f"{where}: token id {outside} is outside the target's vocabulary [0, {vocab_size})")
    return tokens


def load_prompts(args, entries, vocab_size: int, max_context: int) -> list[list[int]]:
    max_prompt_len = max_context - args.max_new_tokens + 1  # then the last draft call fits the server
    if entries is None:
        return random_prompts(vocab_size, max_prompt_len)
    tokenizer = load_tokenizer(args.target, entries)
    prompts = [prompt_tokens(where, entry, tokenizer, vocab_size) for where, entry in entries]
    for (where, _), prompt in zip(entries, prompts, strict=True):
        if len(prompt) > max_prompt_len:
            raise BenchError(
                f"{where}: {len(prompt)} tokens; --max-new-tokens {args.max_new_tokens} leaves room for "
                f"{max_prompt_len} in the server's max context {max_context}"
            )
    return prompts


def random_prompts(vocab_size: int, max_len: int, lengths=RANDOM_PROMPT_LENS, seed=PROMPT_SEED):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size, (min(n, max_len),), generator=generator).tolist() for n in lengths]
