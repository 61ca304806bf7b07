"""The server's configuration: one frozen dataclass, validated once, passed explicitly to every part.

It holds what the HTTP side needs (address, queue bound, batch window, deadline, auth) and the engine's
sizes, which it hands on as an `EngineConfig`. Where it comes from (flags, `DRAFTER_*` variables) is
`drafter.server.cli`'s business.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from drafter.sessions.draft_source import SOURCES
from drafter.sessions.target_cost import TARGET_COSTS
from engine.config import EngineConfig

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
DEFAULT_NUM_DRAFT_TOKENS = 16  # the wire protocol's default k, capped by the server's maximum
MAX_SESSION_CHARS = 128
MAX_UDS_PATH_BYTES = 108  # sockaddr_un's sun_path on Linux, terminating NUL included


# Top choices per position an engine drafting ahead keeps: a branch's bonus token is one of them.
AHEAD_TOP_CHOICES = 4
# Branches per session by default (bench/README.md, "Drafting ahead"): on, since a server whose sessions call
# faster than an ahead loop runs (or that is under load) drafts nothing ahead, so it costs nothing there.
DEFAULT_DRAFT_AHEAD = 8


# The traffic buffer holds Python ints, ~36 bytes an id: the default is ~2.4 MB, the maximum ~600 MB. The
# minimum leaves its held-out fifth room for a few examples of a 256-token context window.
DEFAULT_ADAPT_BUFFER_TOKENS = 65536
MIN_ADAPT_BUFFER_TOKENS = 4096
MAX_ADAPT_BUFFER_TOKENS = 2**24
MAX_ADAPT_RANK = 256  # low-rank adapters wider than this save little over training every weight
VERSION_DIR = re.compile(r"v\d+")


class ServerConfigError(ValueError):
    """A server setting that cannot work; the message names the setting."""


@dataclass(frozen=True, slots=True)
class ServerConfig:
    model: str = "tiny"
    host: str = "127.0.0.1"
    port: int = 8000
    uds: str | None = None  # also serve on this Unix domain socket path
    device: str = "cpu"
    dtype: str = "float32"
    max_seq_len: int = 4096
    max_batch_size: int = 8
    kv_cache_gb: float | None = None  # None: the engine's default for the device
    attention: str = "sdpa"
    max_draft_tokens: int = 16
    draft_length_tiers: tuple[int, ...] = (4, 8, 16)  # graphs per tier (engine/tiers.py)
    max_queue: int = 128  # requests waiting for the engine; beyond it, 429 at once
    batch_window_ms: float = 0.2  # at most how long an idle engine waits for requests already being read
    inline_max_ms: float = 10.0  # a lone draft expected to take at most this runs on the event loop's thread
    request_timeout_s: float = 1.0  # a request still queued after this is dropped (504), never drafted
    compile: bool = False
    cuda_graphs: bool = False
    api_key: str | None = field(default=None, repr=False)  # never logged
    log_level: str = "info"
    drain_timeout_s: float = 30.0  # on SIGTERM, how long in-flight requests may take to finish
    num_threads: int | None = None  # torch intra-op threads; None leaves torch's default
    body_timeout_s: float = 10.0  # a /draft body not fully received after this is refused (408)
    default_draft_length: int | str | None = None  # k when a request names none: N or "auto" [min(16, max)]
    target_verify_ms: float = (
        25.0  # the target's step (one token verified), the cost auto weighs drafts against
    )
    target_verify_ms_per_token: float = 0.0  # what each more token verified adds to the target's pass
    # "learn": the two above are a prior, replaced by the gaps between a session's calls; "told": kept
    target_cost: str = "learn"
    auto_max_queue: int | None = None  # queue depth at which auto answers 0 drafts at once [max batch size]
    max_sessions: int = 1024  # sessions held (each up to max_seq_len int64 ids); least recently used go first
    session_ttl_s: float = 600.0  # a session idle this long is dropped
    draft_source: str | None = None  # a request's source when it names none [hybrid; model if suffix is off]
    suffix_tokens: int = 262144  # tokens all sessions' suffix indexes hold together; 0: no suffix drafts
    suffix_global_tokens: int = 65536  # tokens of recent responses in the shared suffix index; 0: none
    suffix_min_score: float = 0.0  # a hybrid draft starts with the suffix's only if its score reaches this
    # Branches drafted ahead per session while the engine idles (drafter/sessions/ahead.py); 0: off;
    # None: DEFAULT_DRAFT_AHEAD, at most max_batch_size.
    draft_ahead: int | None = None
    # Online adaptation (docs/adaptation.md): fine-tune the drafter on what targets emitted, while idle.
    adapt: bool = False
    adapt_buffer_tokens: int = DEFAULT_ADAPT_BUFFER_TOKENS  # ids the traffic buffer holds, context included
    adapt_rank: int = 0  # 0: every decoder weight trains; else low-rank adapters of this rank
    adapt_dir: str | None = None  # where each version is saved as v{N}/; None: nothing written to disk

    def __post_init__(self):
        if self.draft_ahead is None:
            object.__setattr__(self, "draft_ahead", min(DEFAULT_DRAFT_AHEAD, self.max_batch_size))
        if not self.model:
            raise ServerConfigError("model must be a preset name or a checkpoint directory")
        if not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ServerConfigError(f"port must be in [0, 65535], got {self.port!r}")
        if self.uds is not None and not 0 < len(os.fsencode(self.uds)) < MAX_UDS_PATH_BYTES:
            raise ServerConfigError(f"uds must be a path of 1 to {MAX_UDS_PATH_BYTES - 1} bytes")
        if self.max_queue < 1:
            raise ServerConfigError(f"max_queue must be at least 1, got {self.max_queue}")
        if not 0 <= self.batch_window_ms <= 100:
            raise ServerConfigError(f"batch_window_ms must be in [0, 100], got {self.batch_window_ms}")
        if not 0 <= self.inline_max_ms <= 1000:
            raise ServerConfigError(f"inline_max_ms must be in [0, 1000], got {self.inline_max_ms}")
        if not self.request_timeout_s > 0:
            raise ServerConfigError(f"request_timeout_s must be positive, got {self.request_timeout_s}")
        if not self.drain_timeout_s > 0:
            raise ServerConfigError(f"drain_timeout_s must be positive, got {self.drain_timeout_s}")
        if not self.body_timeout_s > 0:
            raise ServerConfigError(f"body_timeout_s must be positive, got {self.body_timeout_s}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ServerConfigError(f"num_threads must be at least 1, got {self.num_threads}")
        if self.log_level not in LOG_LEVELS:
            raise ServerConfigError(
                f"log_level must be one of {', '.join(LOG_LEVELS)}, got {self.log_level!r}"
            )
        default = self.default_draft_length
        if default is not None and default != "auto" and not 1 <= default <= self.max_draft_tokens:
            raise ServerConfigError(
                f"default_draft_length must be auto or in [1, {self.max_draft_tokens}], got {default!r}"
            )
        if not self.target_verify_ms > 0:
            raise ServerConfigError(f"target_verify_ms must be positive, got {self.target_verify_ms}")
        if not self.target_verify_ms_per_token >= 0:
            raise ServerConfigError(
                f"target_verify_ms_per_token must be >= 0, got {self.target_verify_ms_per_token}"
            )
        if self.auto_max_queue is not None and self.auto_max_queue < 0:
            raise ServerConfigError(f"auto_max_queue must be at least 0, got {self.auto_max_queue}")
        if self.max_sessions < 1:
            raise ServerConfigError(f"max_sessions must be at least 1, got {self.max_sessions}")
        if not self.session_ttl_s > 0:
            raise ServerConfigError(f"session_ttl_s must be positive, got {self.session_ttl_s}")
        if self.target_cost not in TARGET_COSTS:
            raise ServerConfigError(
                f"target_cost must be one of {', '.join(TARGET_COSTS)}, got {self.target_cost!r}"
            )
        if self.draft_source is not None and self.draft_source not in SOURCES:
            raise ServerConfigError(
                f"draft_source must be one of {', '.join(SOURCES)}, got {self.draft_source!r}"
            )
        if self.suffix_tokens < 0 or self.suffix_global_tokens < 0:
            raise ServerConfigError("suffix_tokens and suffix_global_tokens must be at least 0")
        if not 0 <= self.suffix_min_score <= 1000:
            raise ServerConfigError(f"suffix_min_score must be in [0, 1000], got {self.suffix_min_score}")
        if self.default_source not in self.sources:
            raise ServerConfigError("suffix_tokens 0 turns suffix drafting off: draft_source must be model")
        if not 0 <= self.draft_ahead <= self.max_batch_size:
            raise ServerConfigError(
                f"draft_ahead must be in [0, max_batch_size = {self.max_batch_size}] (one decode loop drafts "
                f"a session's branches), got {self.draft_ahead}"
            )
        self.check_adaptation()
        if self.api_key is not None and not self.api_key.strip():
            raise ServerConfigError("api_key must not be empty (unset it to turn auth off)")
        self.engine_config()  # the engine's own checks (sizes, dtype, graphs on CUDA only) fail here too

    def check_adaptation(self) -> None:
        if not MIN_ADAPT_BUFFER_TOKENS <= self.adapt_buffer_tokens <= MAX_ADAPT_BUFFER_TOKENS:
            raise ServerConfigError(
                f"adapt_buffer_tokens must be in [{MIN_ADAPT_BUFFER_TOKENS}, {MAX_ADAPT_BUFFER_TOKENS}], "
                f"got {self.adapt_buffer_tokens}"
            )
        if not 0 <= self.adapt_rank <= MAX_ADAPT_RANK:
            raise ServerConfigError(f"adapt_rank must be in [0, {MAX_ADAPT_RANK}], got {self.adapt_rank}")
        if self.adapt_dir is None:
            return
        if not self.adapt:
            raise ServerConfigError("adapt_dir saves adapted versions: it needs --adapt")
        directory = Path(self.adapt_dir).expanduser()
        if directory.exists() and not directory.is_dir():
            raise ServerConfigError(f"adapt_dir {str(directory)!r} exists and is not a directory")
        if directory.is_dir() and any(VERSION_DIR.fullmatch(p.name) for p in directory.iterdir()):
            raise ServerConfigError(
                f"adapt_dir {str(directory)!r} already holds versions (v0, v1, ...) of an earlier run; "
                "choose an empty directory or move them away"
            )
        existing = next(p for p in (directory, *directory.parents) if p.exists())
        if not os.access(existing, os.W_OK | os.X_OK):
            raise ServerConfigError(f"adapt_dir {str(directory)!r} cannot be created or written here")

    def engine_config(self) -> EngineConfig:
        return EngineConfig(
            device=self.device,
            dtype=self.dtype,
            max_seq_len=self.max_seq_len,
            kv_cache_gb=self.kv_cache_gb,
            attention=self.attention,
            max_batch_size=self.max_batch_size,
            max_draft_tokens=self.max_draft_tokens,
            draft_length_tiers=self.draft_length_tiers,
            compile=self.compile,
            cuda_graphs=self.cuda_graphs,
            top_choices=AHEAD_TOP_CHOICES if self.draft_ahead else 0,
        )

    @property
    def default_num_draft_tokens(self) -> int | str:
        if self.default_draft_length is not None:
            return self.default_draft_length
        return min(DEFAULT_NUM_DRAFT_TOKENS, self.max_draft_tokens)

    @property
    def default_source(self) -> str:
        if self.draft_source is not None:
            return self.draft_source
        return "hybrid" if self.suffix_tokens else "model"

    @property
    def sources(self) -> tuple[str, ...]:
        """The draft sources requests may ask for."""
        return SOURCES if self.suffix_tokens else ("model",)

    @property
    def auto_zero_queue_depth(self) -> int:
        return self.max_batch_size if self.auto_max_queue is None else self.auto_max_queue

    @property
    def max_body_bytes(self) -> int:
        """Room for a full context of the largest ids with generous whitespace, plus the other fields."""
        return 16 * self.max_seq_len + 4096

    @property
    def log_level_number(self) -> int:
        return getattr(logging, self.log_level.upper())
