"""Flags and `DRAFTER_*` environment variables → a `ServerConfig`. A flag beats its variable, which beats the
default; defaults that depend on the machine (device, dtype, compile, graphs) are settled here.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Mapping, Sequence

from drafter.server.config import LOG_LEVELS, ServerConfig

TRUE_WORDS, FALSE_WORDS = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


class UsageError(ValueError):
    """A flag or variable that cannot be read; printed as one line, without a traceback."""


def boolean(text: str) -> bool:
    word = text.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError(f"expected one of {sorted(TRUE_WORDS | FALSE_WORDS)}")


def draft_length(text: str) -> int | str:
    word = text.strip().lower()
    if word == "auto":
        return word
    if not word.isdigit():
        raise ValueError("expected auto or a positive integer")
    return int(word)


def int_tuple(text: str) -> tuple[int, ...]:
    """Comma-separated integers, e.g. `4,8,16`."""
    return tuple(int(part) for part in text.split(","))


# flag name -> (type for flag and variable, help). Every flag reads DRAFTER_<NAME> when not given.
OPTIONS: dict[str, tuple] = {
    "model": (
        str,
        "preset name (tiny, bench-cpu, qwen3-0.6b-random) or an exported FP8 / HF Qwen3 or Qwen2 directory "
        "[tiny]",
    ),
    "host": (str, "address to bind [127.0.0.1]"),
    "port": (int, "port to bind; 0 picks a free one [8000]"),
    "uds": (str, "also listen on this Unix socket path, for a target on the same host [off]"),
    "device": (str, "cpu or cuda [cuda if available]"),
    "dtype": (str, "bfloat16 or float32 [bfloat16 on CUDA, float32 on CPU]"),
    "max-seq-len": (int, "longest context + draft accepted [4096]"),
    "max-batch-size": (int, "requests drafted in one decode loop [8]"),
    "kv-cache-gb": (
        float,
        "KV-cache page pool budget in GiB; LRU conversations are evicted past it [8 on CUDA, 1 on CPU]",
    ),
    "attention": (str, "sdpa or flex: how decode attention reads the pages [flex on CUDA, sdpa on CPU]"),
    "max-draft-tokens": (int, "largest num_draft_tokens accepted [16]"),
    "draft-length-tiers": (
        int_tuple,
        "comma-separated k a CUDA graph is captured for; a call runs the smallest tier >= its k, "
        "max-draft-tokens is always one [4,8,16]",
    ),
    "max-queue": (int, "requests that may wait for the engine; beyond it, 429 [128]"),
    "batch-window-ms": (float, "at most how long an idle engine waits for requests already being read [0.2]"),
    "inline-max-ms": (
        float,
        "a lone request on an idle engine, expected to draft within this, is drafted on the event loop's "
        "own thread (saves two thread hand-offs; the loop reads nothing else meanwhile); 0: never [10]",
    ),
    "request-timeout-s": (float, "a request still queued after this is dropped with 504 [1.0]"),
    "drain-timeout-s": (float, "on SIGTERM, how long in-flight requests may take to finish [30]"),
    "body-timeout-s": (float, "a /draft body still incomplete after this is refused with 408 [10]"),
    "num-threads": (int, "torch CPU threads [on CPU: cores - 1, leaving one to the HTTP side]"),
    "default-draft-length": (draft_length, "k when a request names none: auto or N [min(16, max)]"),
    "target-verify-ms": (
        float,
        "the target's step in ms (a verify pass of one token), which auto weighs drafts against [25]",
    ),
    "target-verify-ms-per-token": (
        float,
        "what each more token verified adds to the target's pass, in ms: ~0 where the verify is "
        "memory-bound (a GPU), a sizeable part of a step on a CPU [0]",
    ),
    "target-cost": (
        str,
        "learn: the two flags above are where auto starts, then the gaps between a session's calls (the "
        "target's own rounds) replace them; told: auto keeps them [learn]",
    ),
    "auto-max-queue": (int, "queue depth at which auto answers 0 drafts at once [max batch size]"),
    "max-sessions": (int, "sessions held; the least recently used go first [1024]"),
    "session-ttl-s": (float, "a session idle this long is dropped [600]"),
    "draft-source": (
        str,
        "where drafts come from when a request does not say: model, suffix (the suffix index alone, no "
        "model work) or hybrid (the suffix draft when it beats the model's, the model after it) [hybrid]",
    ),
    "suffix-tokens": (
        int,
        "tokens all sessions' suffix indexes hold together (~2.3 KB each); the least recently used "
        "session's index goes first; 0 turns suffix drafting off [262144]",
    ),
    "suffix-min-score": (
        float,
        "hybrid: the suffix draft leads only if its score (expected accepted tokens by the index's "
        "counts) reaches this, besides beating the model's expectation [0]",
    ),
    "suffix-global-tokens": (
        int,
        "tokens of recent conversations' responses in the suffix index every session drafts from, oldest "
        "evicted first; 0 for servers whose tenants must not see each other's text [65536]",
    ),
    "draft-ahead": (
        int,
        "branches per session drafted ahead while the engine idles: the likeliest next contexts (drafts "
        "kept, the target's token), so the session's next call may be answered with no engine work; 0: off "
        "[8, at most --max-batch-size]",
    ),
    "adapt-buffer-tokens": (
        int,
        "with --adapt: token ids the buffer of what targets emitted holds, context included; the oldest "
        "go first [65536]",
    ),
    "adapt-rank": (
        int,
        "with --adapt: train low-rank adapters of this rank instead of every decoder weight: far less "
        "optimizer memory, for drafters whose full training state does not fit [0: every weight]",
    ),
    "adapt-dir": (
        str,
        "with --adapt: save each weights version as DIR/v{N}/, a checkpoint --model serves; an empty or "
        "new directory [none: nothing written to disk]",
    ),
    "api-key": (
        str,
        "bearer token required on /draft, /info and /metrics [none: open]; prefer the variable, "
        "since a flag's value shows in ps and shell history",
    ),
    "log-level": (str, f"one of {', '.join(LOG_LEVELS)} [info]"),
}
SWITCHES = {
    "compile": "torch.compile the decode step [on for CUDA, off for CPU]",
    "cuda-graphs": "capture the k-step loop in CUDA graphs [on for CUDA, off for CPU]",
    "adapt": "fine-tune the drafter on what targets emit, while idle; better versions go live (their "
    "weights carry every conversation's outputs: docs/adaptation.md) [off]",
}


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="drafter",
        allow_abbrev=False,  # a misspelt flag must fail, not silently match a longer one
        description="Speculative-decoding draft server: POST /draft answers greedy drafts.",
    )
    for name, (kind, text) in OPTIONS.items():
        env = env_name(name)
        parser.add_argument(f"--{name}", type=kind, default=None, help=f"{text} (${env})")
    for name, text in SWITCHES.items():
        parser.add_argument(
            f"--{name}",
            action=argparse.BooleanOptionalAction,
            default=None,
            help=f"{text} (${env_name(name)})",
        )
    return parser


def env_name(flag: str) -> str:
    return "DRAFTER_" + flag.upper().replace("-", "_")


def read_settings(argv: Sequence[str], environ: Mapping[str, str]) -> dict:
    """Flag or variable values by ServerConfig field name; settings given nowhere are left out."""
    flags = vars(build_parser().parse_args(list(argv)))
    types = {name: kind for name, (kind, _) in OPTIONS.items()} | dict.fromkeys(SWITCHES, boolean)
    settings = {}
    for name, kind in types.items():
        key = name.replace("-", "_")
        if flags[key] is not None:
            settings[key] = flags[key]
        elif env_name(name) in environ:
            try:
                settings[key] = kind(environ[env_name(name)])
            except ValueError as error:
                expected = EXPECTED.get(kind, str(error))
                raise UsageError(f"{env_name(name)} (or --{name}) must be {expected}") from None
    return settings


EXPECTED = {
    int: "an integer",
    float: "a number",
    int_tuple: "comma-separated integers, e.g. 4,8,16",
    boolean: f"one of {', '.join(sorted(TRUE_WORDS | FALSE_WORDS))}",
}


def in_flag_words(message: str) -> str:
    """Config errors name dataclass fields (`cuda_graphs`); the user typed flags (`--cuda-graphs`). One-word
    names (port, device) are common words too, so they are replaced only where they open the message."""
    for name in [*OPTIONS, *SWITCHES]:
        field_name = name.replace("-", "_")
        where = rf"\b{field_name}\b" if "-" in name else rf"^{field_name}\b"
        message = re.sub(where, f"--{name}", message)
    return message


def config_from_args(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> ServerConfig:
    settings = read_settings(
        sys.argv[1:] if argv is None else argv, os.environ if environ is None else environ
    )
    device = settings.get("device")
    if device is None:
        device = settings["device"] = "cuda" if cuda_available() else "cpu"
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise UsageError(f"--device must be cpu or cuda, got {device!r}")
    on_cuda = device.startswith("cuda")
    if on_cuda and not cuda_available():
        raise UsageError("--device cuda was asked for, but no CUDA device is available")
    settings.setdefault("dtype", "bfloat16" if on_cuda else "float32")
    # FlexAttention reads pages in place on the GPU; eagerly on the CPU it scores the whole pool.
    settings.setdefault("attention", "flex" if on_cuda else "sdpa")
    # torch.compile on CPU costs ~15 s per shape at startup for little gain on the tiny preset.
    settings.setdefault("compile", on_cuda)
    settings.setdefault("cuda_graphs", on_cuda)
    if not on_cuda:
        # Decode threads spinning on every core starve the event loop: a tiny CPU draft measured 16 ms
        # with 2 threads on 2 cores and 2.5 ms with 1.
        settings.setdefault("num_threads", max(1, (os.cpu_count() or 2) - 1))
    if settings.get("log_level"):
        settings["log_level"] = settings["log_level"].lower()
    try:
        return ServerConfig(**settings)
    except ValueError as error:  # ServerConfigError and the engine's ConfigError
        raise UsageError(f"bad configuration: {in_flag_words(str(error))}") from None


def cuda_available() -> bool:
    import torch  # only when asked: importing it takes seconds, and `--help` or a typo should not wait

    return torch.cuda.is_available()
