"""What the session tests share: the server they run against (a transformers checkpoint, so drafts can be
checked against greedy generate) and a scripted target that drives a conversation in v1 or v2 form."""

from __future__ import annotations

import random
from pathlib import Path

import httpx

ORACLE_MODEL = "gqa2-untied"
MAX_SEQ_LEN = 4096
# The one place that sizes the engine's KV cache for these tests: 0.002 GiB of this model's 512-byte
# positions is 65 pages of 64, just one max-length request, so a long context evicts every conversation.
CACHE_ARGS = ["--kv-cache-gb=0.002"]
AUTO_MAX_QUEUE = 3


def session_server_args(directory: Path) -> list[str]:
    return [
        f"--model={directory}",
        "--dtype=float32",
        "--device=cpu",
        "--no-compile",
        f"--max-seq-len={MAX_SEQ_LEN}",
        "--max-batch-size=1",  # one request per batch: a burst of long contexts builds a real queue
        *CACHE_ARGS,
        "--max-queue=64",
        "--request-timeout-s=60",
        "--default-draft-length=auto",
        # A verify pass worth ~50 draft steps or more, whatever this shared CPU measures at startup, so
        # auto's choices depend on acceptance, not on the machine's load.
        "--target-verify-ms=50",
        "--target-cost=told",  # this scripted target answers at once: its gaps are no target's rounds
        f"--auto-max-queue={AUTO_MAX_QUEUE}",
        "--draft-source=model",  # drafts checked against transformers' (suffix: test_server_suffix)
    ]


class Conversation:
    """A target's side of one session: its context, the drafts it was last given and its session token."""

    def __init__(self, client: httpx.Client, name: str, context: list[int], vocab_size: int, seed: int = 0):
        self.client, self.name, self.context, self.vocab_size = client, name, list(context), vocab_size
        self.rng = random.Random(seed)
        self.token: str | None = None
        self.drafts: list[int] = []

    def post(self, body: dict) -> httpx.Response:
        response = self.client.post("/draft", json=body)
        if response.status_code == 200:
            answer = response.json()
            self.token, self.drafts = answer["session_token"], answer["tokens"]
        return response

    def sync(self, num_draft_tokens=None, **fields) -> httpx.Response:
        """A full-context (v1) call: rebuilds the session and gets a fresh token."""
        body = {"tokens": self.context, "session": self.name, **fields}
        if num_draft_tokens is not None:
            body["num_draft_tokens"] = num_draft_tokens
        return self.post(body)

    def own_token(self, position: int) -> int:
        """The target's token after accepting `position` drafts: never the draft it rejected there."""
        if position < len(self.drafts):
            return (self.drafts[position] + 1 + self.rng.randrange(self.vocab_size - 1)) % self.vocab_size
        return self.rng.randrange(self.vocab_size)

    def accept(self, num_accepted: int, num_draft_tokens=None, **fields) -> httpx.Response:
        """Keep the first num_accepted drafts, add the target's own token, and send only that (v2)."""
        own = self.own_token(num_accepted)
        prefix_len = len(self.context) + num_accepted
        self.context = self.context + self.drafts[:num_accepted] + [own]
        return self.extend(prefix_len, [own], num_draft_tokens, **fields)

    def extend(
        self, prefix_len: int, new_tokens: list[int], num_draft_tokens=None, **fields
    ) -> httpx.Response:
        body = {
            "session": self.name,
            "session_token": self.token,
            "prefix_len": prefix_len,
            "tokens": new_tokens,
            **fields,
        }
        if num_draft_tokens is not None:
            body["num_draft_tokens"] = num_draft_tokens
        return self.post(body)

    def accept_with_probability(self, p: float, num_draft_tokens="auto") -> tuple[int, httpx.Response]:
        """A target that accepts each draft with probability p, stopping at its first rejection."""
        accepted = 0
        while accepted < len(self.drafts) and self.rng.random() < p:
            accepted += 1
        return accepted, self.accept(accepted, num_draft_tokens)
