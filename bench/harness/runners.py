"""How one benchmark case is driven, returning per-call latencies in seconds (warmup calls excluded).

In-process variants run in lockstep rounds: each round drafts one call of every conversation in a single
`draft_batch` (the engine's batching, without the server), so every request of a round waits the round's
time. Over HTTP each conversation is an independent session of drafter.client's AsyncDraftClient (what a
target uses, so the figure includes the client's own cost) posting its next call as soon as the last one
returned, which is what concurrent target workers do; latency is measured at the client.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from bench.harness.refusals import NoDrafts
from bench.harness.workload import Conversation
from drafter.client import AsyncDraftClient
from engine.requests import DraftRequest

DraftRound = Callable[[list[list[int]], int], list[list[int]]]  # contexts, k -> drafts


def run_lockstep(
    draft_round: DraftRound, conversations: list[Conversation], k: int, calls: int
) -> list[float]:
    latencies = []
    for call in range(calls + 1):  # call 0 is the conversations' unmeasured join
        contexts = [c.context() for c in conversations]
        start = time.perf_counter()
        drafts = draft_round(contexts, k)
        elapsed = time.perf_counter() - start
        if call:
            latencies.extend([elapsed] * len(conversations))
        for conversation, draft in zip(conversations, drafts, strict=True):
            conversation.accept(draft)
    return latencies


def engine_round(engine, tag: str, on_results: Callable | None = None) -> DraftRound:
    """One `draft_batch` per round; `on_results` sees each round's DraftResults (their timings)."""

    def draft_round(contexts: list[list[int]], k: int) -> list[list[int]]:
        requests = [DraftRequest(c, k, f"{tag}-{i}") for i, c in enumerate(contexts)]
        results = engine.draft_batch(requests)
        if on_results is not None:
            on_results(results)
        return [result.tokens for result in results]

    return draft_round


def sequential_round(drafters: list) -> DraftRound:
    """Baselines serve one request at a time: one drafter (and cache) per conversation, in turn."""

    def draft_round(contexts: list[list[int]], k: int) -> list[list[int]]:
        return [d.draft(c, k) for d, c in zip(drafters, contexts, strict=True)]

    return draft_round


def run_http(
    url: str, conversations: list[Conversation], k: int, calls: int, headers: dict, tag: str
) -> list[float]:
    return asyncio.run(_run_http(url, conversations, k, calls, headers, tag))


async def _run_http(url, conversations, k, calls, headers, tag) -> list[float]:
    # A benchmark waits for every answer instead of skipping it, and stops on the first refusal.
    client = AsyncDraftClient(url, timeout_s=120, max_connections=len(conversations))
    client.http.headers.update(headers)  # the bearer token, as the caller built it
    # Measured calls start together once every conversation has joined: else the first ones queue behind
    # other clients' cold joins (whole-context prefills), which dominates a case's p99 and is not per-call work.
    joined = asyncio.Barrier(len(conversations))
    async with client:
        per_client = await asyncio.gather(
            *(_client(client, c, k, calls, f"{tag}-{i}", joined) for i, c in enumerate(conversations))
        )
    return [latency for latencies in per_client for latency in latencies]


async def _client(
    client: AsyncDraftClient, conversation: Conversation, k: int, calls: int, session: str, joined
):
    latencies = []
    conversation_session = client.session(session)
    for call in range(calls + 1):
        if call == 1:
            await joined.wait()
        context = conversation.context()
        start = time.perf_counter()
        drafts = await conversation_session.draft(context, k)
        elapsed = time.perf_counter() - start
        if drafts.skipped is not None:
            raise NoDrafts(drafts.skipped)  # the benchmark stops instead of timing skipped calls
        if call:
            latencies.append(elapsed)
        conversation.accept(drafts.tokens)
    return latencies
