"""What one draft call asks for, once the HTTP face has parsed and checked it: `DraftParams`, and `AUTO`
for a `num_draft_tokens` the server picks.

Below both the HTTP face, which builds them (drafter/server/validation.py), and what a conversation learns,
which reads them (drafter/sessions/speculation.py). Plain data: nothing here parses, checks or drafts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

AUTO = "auto"  # num_draft_tokens: let the server pick k (drafter.sessions.draft_length)


@dataclass(frozen=True, slots=True)
class DraftParams:
    tokens: np.ndarray  # int64; v1: the whole context; v2: the tokens after the session's first prefix_len
    num_draft_tokens: int | str  # or AUTO
    session: str | None = None
    min_confidence: float = 0.0
    return_probs: bool = False
    prefix_len: int | None = None  # set: a v2 (incremental) call
    session_token: str | None = None
    close: bool = False
    source: str | None = None  # "model", "suffix" or "hybrid"; None: the server's default
