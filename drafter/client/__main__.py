"""Try speculation from the command line: a transformers target decodes one prompt greedily on its own and
then through a drafter server (drafter/integrations/transformers_generate.py), and we print both speeds, the tokens each round
kept, and whether the outputs matched (they must: speculation is lossless).

    python -m drafter.client --url http://127.0.0.1:8000 --target DIR --prompt "Write quicksort." --chat
    python -m drafter.client --url http://127.0.0.1:8000 --target DIR|tiny [--prompt-tokens 1 2 3 ...]

`--prompt` is tokenized with the target's tokenizer (`--chat`: under its chat template, the assistant's turn
open) and the answer is printed as text; without a prompt it is 64 seeded random ids. Decoding stops at the
target's end-of-sequence tokens or --max-new-tokens. Exit 0 if the outputs matched, 1 if not, 2 on
bad input or a server that cannot be used (one line on stderr). This module imports torch; the client
package it lives in does not.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import time
from pathlib import Path

from drafter.client import DraftClient, DraftRequestError, TransportError

RANDOM_PROMPT_LEN, RANDOM_PROMPT_SEED = 64, 0
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
# transformers imports torchao, whose CPU-only import chatter is not the user's concern.
NOISY_LOGGERS = ("torchao", "torch.utils._pytree")


class CliError(Exception):
    """Bad input or an unusable server: one line on stderr, exit 2."""


def parse_args(argv):
    def positive(text: str) -> int:
        if not text.isdigit() or int(text) < 1:
            raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
        return int(text)

    def token_id(text: str) -> int:
        if not text.isdigit():
            raise argparse.ArgumentTypeError(f"expected a token id (a non-negative integer), got {text!r}")
        return int(text)

    parser = argparse.ArgumentParser(
        prog="python -m drafter.client",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--url", required=True, help="base URL of a running drafter server")
    parser.add_argument("--target", required=True, help="HF checkpoint directory of the target, or a preset")
    prompt = parser.add_mutually_exclusive_group()
    prompt.add_argument("--prompt", help="the prompt as text, tokenized with the target's tokenizer")
    prompt.add_argument("--prompt-tokens", type=token_id, nargs="+", help="the prompt's token ids")
    parser.add_argument("--chat", action="store_true", help="--prompt under the target's chat template")
    parser.add_argument("--max-new-tokens", type=positive, default=64)
    parser.add_argument("--num-draft-tokens", type=positive, default=8)
    parser.add_argument(
        "--source",
        choices=("model", "suffix", "hybrid"),
        help="where drafts come from [the server's default]",
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), help="[cuda if available]")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), help="[bfloat16 on CUDA, float32 on CPU]")
    parser.add_argument("--timeout-s", type=float, default=5.0, help="per draft call [5]")
    parser.add_argument("--api-key", help="bearer token for the server [DRAFTER_API_KEY]")
    args = parser.parse_args(argv)
    if args.chat and args.prompt is None:
        parser.error("--chat applies the chat template to --prompt; give --prompt TEXT")
    args.api_key = args.api_key or os.environ.get("DRAFTER_API_KEY")
    return args


def check_server(client: DraftClient) -> dict:
    try:
        ready = client.get("/health/ready")
        if ready.status != 200:
            raise CliError(f"the drafter at {client.url} is not ready (HTTP {ready.status_code})")
        return client.info()
    except TransportError as error:
        raise CliError(f"cannot reach the drafter at {client.url}: {error}") from None


def run(args, client: DraftClient) -> bool:
    # The server and the prompt are checked before the slow imports, so a typo fails at once; the target
    # must share the drafter's vocabulary (checked once it is loaded).
    info = check_server(client)
    vocab_size = info["vocab_size"]
    tokenizer = target_tokenizer(args.target, args.chat) if args.prompt is not None else None
    if tokenizer is not None:
        prompt = prompt_ids(tokenizer, args.prompt, args.chat)
    else:
        prompt = args.prompt_tokens or random.Random(RANDOM_PROMPT_SEED).choices(
            range(vocab_size), k=RANDOM_PROMPT_LEN
        )
    if max(prompt) >= vocab_size:
        what = (
            "--prompt-tokens: every id"
            if tokenizer is None
            else "--prompt: the target's tokenizer gave ids that"
        )
        raise CliError(f"{what} must be below the drafter's vocabulary size {vocab_size}")

    import torch

    from drafter.integrations.target import load_target
    from drafter.integrations.transformers_generate import SpeculationStats, speculative_decoding

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = args.dtype or ("bfloat16" if device == "cuda" else "float32")
    try:
        model = load_target(args.target, device, dtype)
    except ValueError as error:
        raise CliError(str(error)) from None
    if model.config.vocab_size != vocab_size:
        raise CliError(
            f"the drafter's vocabulary ({vocab_size}) is not the target's ({model.config.vocab_size})"
        )

    plain_greedy(model, tokenizer)
    ids = torch.tensor([prompt], device=device)
    common = dict(attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=args.max_new_tokens)
    stats = SpeculationStats(args.num_draft_tokens)
    speculative = dict(
        custom_generate=speculative_decoding,
        draft_client=client,
        num_draft_tokens=stats.num_draft_tokens,
        draft_source=args.source,
    )
    model.generate(ids, **{**common, "max_new_tokens": 2})  # warm-up, untimed, of both paths
    model.generate(ids, **{**common, "max_new_tokens": 2}, **speculative)

    started = time.perf_counter()
    alone = model.generate(ids, **common)[0, len(prompt) :].tolist()
    alone_s = time.perf_counter() - started
    started = time.perf_counter()
    spec = model.generate(ids, **common, **speculative, speculation_stats=stats)[0, len(prompt) :].tolist()
    spec_s = time.perf_counter() - started

    if tokenizer is not None:
        print(tokenizer.decode(spec, skip_special_tokens=True).strip())
        print("---")
    print(f"target alone: {len(alone)} tokens in {alone_s:.3f} s, {len(alone) / alone_s:.1f} tokens/s")
    print(
        f"speculative:  {len(spec)} tokens in {spec_s:.3f} s, {len(spec) / spec_s:.1f} tokens/s "
        f"({alone_s / spec_s:.2f}x); {stats.mean_accepted_tokens:.2f} tokens per round of at most "
        f"{stats.num_draft_tokens + 1} over {stats.num_rounds} rounds, {stats.num_skipped} draft calls skipped"
    )
    if kept_every_draft(stats):
        print(
            "note: the target kept every draft, as it does when it is the drafter's own model (--target tiny "
            "against the tiny preset): this speedup is an upper bound, not what a real target/drafter pair gets"
        )
    matched = spec == alone
    print("output matched: yes" if matched else "output matched: NO")
    return matched


def plain_greedy(model, tokenizer) -> None:
    """Greedy as the drafter drafts: a checkpoint's sampling defaults (temperature, top-p, a repetition
    penalty) set aside, and the tokenizer's end of sequence (a chat turn's end) stopping it too."""
    config = model.generation_config
    for name in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty"):
        setattr(config, name, None)
    eos = config.eos_token_id
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    if tokenizer is not None and tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos:
        eos.append(tokenizer.eos_token_id)
    config.eos_token_id = eos or None


def target_tokenizer(target: str, chat: bool):
    """The target directory's tokenizer (with a chat template if `chat`), or CliError saying what is missing."""
    from transformers import AutoTokenizer

    missing = CliError(
        f"--prompt needs the target's tokenizer, and {target!r} has none: give --prompt-tokens"
    )
    if not any((Path(target) / name).is_file() for name in TOKENIZER_FILES):
        raise missing
    try:
        tokenizer = AutoTokenizer.from_pretrained(target)
    except (OSError, ValueError):
        raise missing from None
    if chat and not tokenizer.chat_template:
        raise CliError(f"--chat: the tokenizer in {target!r} has no chat template")
    return tokenizer


def prompt_ids(tokenizer, text: str, chat: bool) -> list[int]:
    if not text.strip():
        raise CliError("--prompt is empty")
    if chat:
        messages = [{"role": "user", "content": text}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=not chat)["input_ids"]
    if not ids:
        raise CliError("--prompt: the target's tokenizer made no tokens of it")
    return ids


def kept_every_draft(stats) -> bool:
    """Whether every round kept all its drafts (the last one may stop short at --max-new-tokens): a target
    with the drafter's own weights, as with --target tiny against a server of the tiny preset."""
    rounds = stats.round_log[:-1] if len(stats.round_log) > 1 else stats.round_log
    drafted = [(drafts, kept) for drafts, kept, _ in rounds if drafts]
    return bool(drafted) and all(kept == drafts + 1 for drafts, kept in drafted)


def main(argv=None) -> int:
    args = parse_args(argv)
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        client = DraftClient(args.url, args.api_key, timeout_s=args.timeout_s)
    except ValueError as error:  # a URL it cannot use
        print(f"drafter.client: error: {error}", file=sys.stderr)
        return 2
    with client:
        try:
            return 0 if run(args, client) else 1
        except (CliError, DraftRequestError) as error:
            print(f"drafter.client: error: {error}", file=sys.stderr)
            return 2


if __name__ == "__main__":
    sys.exit(main())
