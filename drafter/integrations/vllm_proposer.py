"""drafter as vLLM's speculative proposer: vLLM loads this class by path and calls `propose` once per step.

    LLM(model=TARGET, speculative_config={"method": "custom_class",
        "model": "drafter.integrations.vllm_proposer.DrafterProposer", "num_speculative_tokens": 8},
        additional_config={"drafter": {"url": "http://127.0.0.1:8000"}})

Settings, from vLLM's `additional_config["drafter"]`, else the environment, else the default:
`url` (DRAFTER_URL, http://127.0.0.1:8000; also unix:/PATH), `api_key` (DRAFTER_API_KEY), `timeout_s`
(DRAFTER_TIMEOUT_S, 0.5: the most one step waits for drafts), `num_draft_tokens` (DRAFTER_NUM_DRAFT_TOKENS:
a k below vLLM's num_speculative_tokens, or "auto" for the server's adaptive k, at most vLLM's; default
vLLM's) and `stats_path` (DRAFTER_VLLM_STATS: a JSON file of this proposer's counters, rewritten every step,
for benchmarks).

Each step drafts every row in one round trip: one POST /draft/batch holding a v2 call per row (or, from a
server without that route, one call per row, all in flight together), sent from an event loop in a
background thread; the server drafts the rows as one engine batch. Rows are matched to sessions by their tokens (drafter/integrations/vllm_rows.py). Failures
follow drafter.client's policy: a slow, overloaded or stopped server gives empty drafts (vLLM then decodes
without speculation) and a backoff, never an exception into vLLM. Imports drafter.client only: no torch, no
server code.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass, field

from drafter.client import AsyncDraftClient, AsyncDraftSession, DraftRequestError, Drafts
from drafter.client.sync_client import DEFAULT_TIMEOUT_S
from drafter.integrations.vllm_rows import RowSessions

log = logging.getLogger(__name__)

DEFAULT_URL = "http://127.0.0.1:8000"
AUTO = "auto"
SETTINGS_ENV = {"url": "DRAFTER_URL", "api_key": "DRAFTER_API_KEY", "timeout_s": "DRAFTER_TIMEOUT_S",
                "num_draft_tokens": "DRAFTER_NUM_DRAFT_TOKENS", "stats_path": "DRAFTER_VLLM_STATS"}  # fmt: skip


@dataclass(frozen=True, slots=True)
class ProposerSettings:
    url: str = DEFAULT_URL
    api_key: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    num_draft_tokens: int | str | None = (
        None  # None: vLLM's num_speculative_tokens; "auto": the server's pick
    )
    stats_path: str | None = None

    def __post_init__(self):
        if not isinstance(self.url, str) or not self.url:
            raise ValueError("drafter proposer: url must be a non-empty string")
        if type(self.timeout_s) not in (int, float) or not self.timeout_s > 0:
            raise ValueError(f"drafter proposer: timeout_s must be a positive number, got {self.timeout_s!r}")
        k = self.num_draft_tokens
        if k is not None and k != AUTO and (type(k) is not int or k < 1):
            raise ValueError(
                f'drafter proposer: num_draft_tokens must be a positive integer or "auto", got {k!r}'
            )

    @classmethod
    def from_vllm(cls, vllm_config, environ=os.environ) -> ProposerSettings:
        given = getattr(vllm_config, "additional_config", None) or {}
        given = given.get("drafter") or {} if isinstance(given, dict) else {}
        unknown = set(given) - set(SETTINGS_ENV)
        if unknown:
            raise ValueError(f"drafter proposer: unknown additional_config['drafter'] keys {sorted(unknown)}; "
                             f"known: {sorted(SETTINGS_ENV)}")  # fmt: skip
        values = {}
        for name, variable in SETTINGS_ENV.items():
            value = given.get(name, environ.get(variable))
            if value is not None:
                values[name] = READERS.get(name, lambda given: given)(value)
        return cls(**values)


def number(kind):
    """A reader of a number from the config (a number) or the environment (a string); what is not one is
    left as it came, for __post_init__ to refuse by name."""

    def read(value):
        if isinstance(value, str) and value != AUTO:
            try:
                return kind(value)
            except ValueError:
                return value
        return value

    return read


READERS = {"timeout_s": number(float), "num_draft_tokens": number(int)}


@dataclass
class ProposerStats:
    """What the proposer did, for benchmarks: steps, the time vLLM waited in `propose`, and the calls."""

    num_steps: int = 0
    propose_s: float = 0.0
    num_calls: int = 0
    num_draft_tokens: int = 0
    skipped: dict[str, int] = field(default_factory=dict)

    def count(self, drafts: Drafts) -> None:
        self.num_calls += 1
        self.num_draft_tokens += len(drafts.tokens)
        if drafts.skipped:
            self.skipped[drafts.skipped] = self.skipped.get(drafts.skipped, 0) + 1


class DrafterProposer:
    """vLLM's `custom_class` proposer backed by a drafter server (see the module docstring)."""

    def __init__(self, vllm_config):
        self.settings = ProposerSettings.from_vllm(vllm_config)
        # vLLM verifies at most num_speculative_tokens drafts a row; a smaller fixed k asks for fewer.
        k, fixed = vllm_config.speculative_config.num_speculative_tokens, self.settings.num_draft_tokens
        self.max_draft_tokens = min(k, fixed) if isinstance(fixed, int) else k
        self.max_model_len = vllm_config.model_config.max_model_len
        self.stats = ProposerStats()
        self.refusals_logged: set[str] = set()
        self.warned_auto_cap = False
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="drafter-proposer", daemon=True).start()
        self.client: AsyncDraftClient = self.on_loop(self.open_client()).result()
        self.rows: RowSessions[AsyncDraftSession] = RowSessions(self.client.session)
        log.info("drafter proposer: %s, k = %s (at most %d), timeout %.3f s", self.settings.url,
                 self.settings.num_draft_tokens or self.max_draft_tokens, self.max_draft_tokens,
                 self.settings.timeout_s)  # fmt: skip

    async def open_client(self) -> AsyncDraftClient:
        # Made on its own loop: its connection pool belongs to the loop it runs on.
        return AsyncDraftClient(self.settings.url, self.settings.api_key, timeout_s=self.settings.timeout_s)

    def on_loop(self, coroutine) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def load_model(self, *args, **kwargs) -> None:
        """vLLM's CPU runner hands the target model over; drafts come from the server, so nothing to load."""

    def propose(
        self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None
    ) -> list[list[int]]:
        """One list of draft ids per row (empty: no speculation for that row). A row's context is
        `token_ids_cpu[row, :num_tokens_no_spec[row]]`, its newly sampled token included; a row that sampled
        nothing this step (a prompt still being prefilled in chunks) gets no drafts."""
        started = time.perf_counter()
        drafts: list[list[int]] = [[] for _ in sampled_token_ids]
        contexts, rooms = {}, {}
        for row, sampled in enumerate(sampled_token_ids):
            num_tokens = int(num_tokens_no_spec[row])
            room = min(self.max_draft_tokens, self.max_model_len - num_tokens - 1)
            if sampled and room > 0:
                contexts[row], rooms[row] = token_ids_cpu[row, :num_tokens], room
        requests, gone = self.rows.assign(contexts)
        for session in gone:
            self.on_loop(session.close())  # frees the server's copy; nobody waits for it
        if requests:
            jobs = []
            for row, request in requests.items():
                request.session.state.known_len = request.known_len  # checked by the match: skip comparing it
                k = AUTO if self.settings.num_draft_tokens == AUTO else rooms[row]
                jobs.append((row, request.session, request.tokens, k))
            if self.settings.num_draft_tokens == AUTO:
                self.check_auto_cap()
            for row, answer in self.draft_rows(jobs):
                self.stats.count(answer)
                drafts[row] = answer.tokens[: rooms[row]]
        self.stats.num_steps += 1
        self.stats.propose_s += time.perf_counter() - started
        if self.settings.stats_path:
            self.write_stats()
        return drafts

    def check_auto_cap(self) -> None:
        """With "auto" the server may draft up to its --max-draft-tokens; vLLM verifies fewer when its k is
        smaller, and the server, counting acceptance over all it sent, may then count one more accepted draft
        than vLLM did. Said once; serving with --max-draft-tokens at vLLM's k makes the counts exact."""
        server_k = self.client.server.max_draft_tokens
        if server_k is not None and server_k > self.max_draft_tokens and not self.warned_auto_cap:
            self.warned_auto_cap = True
            log.warning("drafter proposer: the server drafts up to %d tokens with \"auto\", vLLM verifies %d: "
                        "serve drafter with --max-draft-tokens %d", server_k, self.max_draft_tokens,
                        self.max_draft_tokens)  # fmt: skip

    def draft_rows(self, jobs) -> list[tuple[int, Drafts]]:
        """Every row's call in one round trip; the client's deadline bounds them all, and so does the wait."""
        future = self.on_loop(
            self.client.draft_many([(session, context, k) for _, session, context, k in jobs])
        )
        try:
            answers = future.result(timeout=self.settings.timeout_s + 1.0)
        except concurrent.futures.TimeoutError:  # the loop is stuck: never hold vLLM's step for it
            future.cancel()
            answers = [Drafts.none("timeout")] * len(jobs)
        return [(row, self.refused(answer)) for (row, *_), answer in zip(jobs, answers, strict=True)]

    def refused(self, answer: Drafts | DraftRequestError) -> Drafts:
        """A row the server refused (a wrong key, a token past the drafter's vocabulary) goes without drafts,
        logged once per kind of refusal."""
        if isinstance(answer, Drafts):
            return answer
        if answer.type not in self.refusals_logged:
            self.refusals_logged.add(answer.type)
            log.error(
                "drafter proposer: the server refused a draft call (%s); such rows go on without drafts",
                answer,
            )
        return Drafts.none("refused")

    def write_stats(self) -> None:
        path = self.settings.stats_path
        with open(f"{path}.tmp", "w") as file:
            json.dump(asdict(self.stats), file)
        os.replace(f"{path}.tmp", path)

    def close(self) -> None:
        """Closes every session and the client (vLLM never calls this; tests and benchmarks may)."""
        sessions = self.rows.clear()

        async def shut() -> None:
            await asyncio.gather(*(session.close() for session in sessions))
            await self.client.close()

        self.on_loop(shut()).result(timeout=self.settings.timeout_s + 1.0)
        self.loop.call_soon_threadsafe(self.loop.stop)
