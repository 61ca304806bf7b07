"""A drafter server's refusal of a benchmark's request, said in one line that names the server's error and
the flag to change, instead of a traceback: every bench command that talks to a server exits 2 with it."""

from __future__ import annotations

import functools
import sys

import orjson

from drafter.client import DraftRequestError


class ServerRefused(Exception):
    """A 4xx (or other non-200) answer to a benchmark's own request: the benchmark and the server disagree."""

    def __init__(self, status: int, body: bytes | str, what: str = "a benchmark call"):
        try:
            error = orjson.loads(body).get("error") or {}
        except (orjson.JSONDecodeError, AttributeError):
            error = {}
        text = body.decode(errors="replace") if isinstance(body, bytes) else body
        self.status, self.what = status, what
        self.type, self.message = error.get("type", "error"), error.get("message") or text[:200]
        self.param = error.get("param")
        super().__init__(str(self))

    @classmethod
    def from_client(cls, error: DraftRequestError) -> ServerRefused:
        body = orjson.dumps({"error": {"type": error.type, "message": error.message, "param": error.param}})
        return cls(error.status, body, "a draft call")

    def __str__(self) -> str:
        hint = flag_hint(self.status, self.message, self.param)
        return f"the server refused {self.what}: {self.status} {self.type}: {self.message}" + (
            f"; {hint}" if hint else ""
        )


SKIP_HINTS = {  # drafter.client's reasons for answering no drafts -> what to change
    "context_too_long": "start the server with a larger --max-seq-len, or ask for shorter contexts",
    "overloaded": "start the server with a larger --max-queue, or run fewer clients",
    "timeout": "the server answered after the client's deadline: is the machine busy, or the model too large?",
    "not_ready": "the server is loading, draining or failed: see its /health/ready",
    "unreachable": "no server answers at that address",
}


class NoDrafts(Exception):
    """drafter.client answered a benchmark's call with no drafts (`Drafts.skipped`): nothing to time."""

    def __init__(self, skipped: str):
        self.skipped = skipped
        hint = SKIP_HINTS.get(skipped)
        super().__init__(
            f"the server gave a draft call no drafts ({skipped})" + (f"; {hint}" if hint else "")
        )


def flag_hint(status: int, message: str, param: str | None) -> str | None:
    """Which setting of the server (or of the benchmark) the refusal points at."""
    if status == 401:
        return "pass the server's key (--api-key here; the server's --api-key or DRAFTER_API_KEY)"
    if status == 413 or "max context" in message:
        return "start the server with a larger --max-seq-len, or ask for shorter contexts"
    if param == "num_draft_tokens":
        return "start the server with a larger --max-draft-tokens, or ask for fewer draft tokens"
    return None


def exits_2_on_refusal(main):
    """`main(argv) -> int` that prints a refusal as one line on stderr and returns 2."""

    @functools.wraps(main)
    def run(argv=None):
        try:
            return main(argv)
        except DraftRequestError as error:
            refusal = ServerRefused.from_client(error)
        except (ServerRefused, NoDrafts) as error:
            refusal = error
        print(f"error: {refusal}", file=sys.stderr)
        return 2

    return run
