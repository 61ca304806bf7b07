"""The client a target imports: `DraftClient` (blocking) and `AsyncDraftClient`, with per-conversation
sessions that speak the incremental protocol (v2) when the server offers it. Importing this package loads
h11 and orjson only: no torch, no engine, no httpx. The transformers integration is drafter/integrations/transformers_generate.py.

    with DraftClient("http://127.0.0.1:8000") as client, client.session() as session:
        drafts = session.draft(context, 8)  # drafts.tokens may be empty: speculation is optional
"""

from drafter.client.async_client import AsyncDraftClient, AsyncDraftSession
from drafter.client.backoff import Backoff
from drafter.client.http11 import TransportError
from drafter.client.results import DraftRequestError, Drafts
from drafter.client.sync_client import DEFAULT_TIMEOUT_S, DraftClient, DraftSession

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "AsyncDraftClient",
    "AsyncDraftSession",
    "Backoff",
    "DraftClient",
    "DraftRequestError",
    "DraftSession",
    "Drafts",
    "TransportError",
]
