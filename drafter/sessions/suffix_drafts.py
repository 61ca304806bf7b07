"""Suffix drafts for the server: per session, a suffix index over its context; across sessions, a global
index over recent conversations' responses; one lookup per call, and index work done later, in slices.

What goes where (as SuffixDecoding and arctic-inference's `SuffixDecodingCache` split it):
- a session's **local index** holds its whole context as the server last saw it: the prompt and everything
  the conversation added since. It is freed with its session (`drop`), and all local indexes together hold
  at most `local_tokens` tokens: past that, the least recently updated session's index goes first.
- the **global index** holds each session's *response*: what its context added after its first call (the
  prompt stays private to its session). A full-context call that rebuilds a session is a first call again:
  its context is a prompt, never a response. At most `global_tokens` tokens; past that, the oldest
  conversation's response goes first. 0 turns it off. Anyone's lookup may draft from it: a server shared
  by tenants who must not see each other's text should turn it off.
A lookup takes the best-scoring draft of the two indexes (the local one on a tie), as arctic does. Only
sessions that draft from the index are given to it (drafter.sessions.speculation).

Why later and in slices: indexing costs ~20 us a token in Python, an 8k-token prompt ~0.15 s.
`update` only notes the session's new context; `work` indexes it a slice at a time (`budget_s` each), so
the event loop runs other requests in between and no call waits for more than one slice. Until it is
done a lookup sees the index as far as it got: a prefix of a context this session really sent.

Whose text a lookup may read: a session's local index only ever holds tokens its own calls sent, as the
session table committed them (drafter.sessions.speculation gives it nothing else). A full-context call (no
session token) reads it only when the index holds a prefix of the very context that call sent, and a
rebuild keeps of it only what the rebuilding call sent, so naming someone else's session never reveals
their text.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from drafter.sessions.suffix_index import SuffixDraft, SuffixIndex

NO_DRAFT = SuffixDraft([], [], 0.0, 0)
CHUNK = 8  # tokens indexed between two looks at the clock (~0.15 ms)
MAX_UNDO = 256  # tokens a rollback undoes in place (~5 ms); past that the session's index starts again


@dataclass(frozen=True, slots=True)
class SuffixRules:
    """SuffixDecoding's draft rules (arctic-inference's and vLLM's defaults)."""

    max_depth: int = 24  # the longest substring indexed: a match plus its draft
    max_spec_factor: float = 1.0  # a draft matched on m tokens is at most factor * m + offset long
    max_spec_offset: float = 0.0
    min_token_prob: float = 0.1  # stop where the running probability falls below this


class _Conversation:
    """One session's indexing: its local index (one sequence), the context being indexed (`target`, a view
    that nobody writes again) and how much of it the indexes hold."""

    __slots__ = ("local", "target", "indexed", "prompt_len", "global_seq")

    def __init__(self, max_depth: int, target: np.ndarray):
        self.local = SuffixIndex(max_depth)
        self.local.add()
        self.target = target
        self.indexed = 0  # target[:indexed] is in the local index
        self.prompt_len = len(target)  # where its response (what the global index holds) starts: the first
        # context's end, or where a long rollback restarted the index
        self.global_seq: int | None = None  # its response's sequence in the global index, once it has one


def common_prefix(a: np.ndarray, b: np.ndarray, limit: int) -> int:
    n = min(limit, len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


class SuffixDrafts:
    def __init__(
        self,
        rules: SuffixRules,
        local_tokens: int,
        global_tokens: int,
        on_work: Callable[[], None] = lambda: None,  # called when there is indexing to do
    ):
        if local_tokens < 1 or global_tokens < 0:
            raise ValueError("local_tokens must be at least 1 and global_tokens at least 0")
        self.rules, self.local_tokens, self.global_tokens = rules, local_tokens, global_tokens
        self.on_work = on_work
        self.conversations: OrderedDict[str, _Conversation] = OrderedDict()  # least recently updated first
        self.pending: OrderedDict[str, None] = OrderedDict()  # sessions with indexing to do, oldest first
        self.global_index = SuffixIndex(rules.max_depth)
        self.global_owner: OrderedDict[int, _Conversation | None] = OrderedDict()  # oldest response first
        self.num_local = 0  # tokens over all local indexes
        self.num_local_dropped = self.num_global_evicted = 0
        self._bounds: dict[tuple[int, int], int] = {}

    def lookup(self, session: str | None, context: np.ndarray, max_tokens: int, trusted: bool) -> SuffixDraft:
        """The best draft for `context`, at most `max_tokens` long. `trusted`: the caller proved it holds the
        session (a v2 call); otherwise the local index is read only if it holds a prefix of `context`."""
        if max_tokens < 1:
            return NO_DRAFT
        rules = self.rules
        best = NO_DRAFT
        # Only the last max_depth - 1 tokens can match; as a list, since indexing a dict with numpy ints
        # costs several times what Python ints do.
        tail = context[1 - rules.max_depth :].tolist() if rules.max_depth > 1 else []
        draft_rules = (rules.max_spec_factor, rules.max_spec_offset, rules.min_token_prob)
        conversation = None if session is None else self.conversations.get(session)
        if conversation is not None and conversation.indexed > 0:
            target, indexed = conversation.target, conversation.indexed
            if trusted or (indexed <= len(context) and common_prefix(target, context, indexed) == indexed):
                best = conversation.local.speculate(tail, max_tokens, *draft_rules)
        if len(self.global_index) and best.score < self._best_possible(len(tail), max_tokens):
            found = self.global_index.speculate(tail, max_tokens, *draft_rules)
            if found.score > best.score:
                best = found
        return best

    def _best_possible(self, tail_len: int, max_tokens: int) -> int:
        """What no draft can beat (the global one only replaces a strictly better local one); cached."""
        key = (tail_len, max_tokens)
        bound = self._bounds.get(key)
        if bound is None:
            rules = self.rules
            bound = self._bounds[key] = self.global_index.best_possible_score(
                tail_len, max_tokens, rules.max_spec_factor, rules.max_spec_offset
            )
        return bound

    def update(self, session: str, context: np.ndarray, first_call: bool = False) -> None:
        """The session's context is now `context` (a view nobody writes again): index it later (`work`).
        `first_call`: a full-context call (re)built the session, perhaps another client knowing only its
        name, so `context` is a prompt: none of it goes to the global index, and the local index keeps only
        what it shares with `context` (what that call itself sent)."""
        conversation = self.conversations.get(session)
        if conversation is None:
            conversation = self.conversations[session] = _Conversation(self.rules.max_depth, context)
        else:
            self.conversations.move_to_end(session)
            if first_call:
                self._detach_response(conversation)
            # What the index holds of the old context and the new one shares stays; the rest is undone now,
            # so the index never holds tokens outside the session's context (see `_truncate` for the cost).
            # Two views of one session buffer share their common length (a buffer's head is never rewritten).
            if context.base is not None and context.base is conversation.target.base:
                keep = min(conversation.indexed, len(context))
            else:
                keep = common_prefix(conversation.target, context, conversation.indexed)
            self._truncate(conversation, keep)
            conversation.target = context
            if first_call:
                conversation.prompt_len = len(context)
        if conversation.indexed < self._goal(conversation):
            self.pending[session] = None
            self.pending.move_to_end(session)
            self.on_work()

    def drop(self, session: str) -> None:
        """The session is gone: free its local index. Its response stays in the global index until evicted."""
        conversation = self.conversations.pop(session, None)
        self.pending.pop(session, None)
        if conversation is not None:
            self.num_local -= conversation.indexed
            self._detach_response(conversation)  # nobody extends it any more

    def _detach_response(self, conversation: _Conversation) -> None:
        """The conversation's response so far stays in the global index as a past one's, until evicted; what
        it adds from now on starts a new response."""
        if conversation.global_seq is not None:
            self.global_owner[conversation.global_seq] = None
            conversation.global_seq = None

    def _goal(self, conversation: _Conversation) -> int:
        """How much of its context a session's index holds once its work is done: all of it, up to the
        cap on local tokens (a context longer than the cap is indexed up to the cap)."""
        return min(len(conversation.target), self.local_tokens)

    @property
    def pending_tokens(self) -> int:
        return sum(self._goal(self.conversations[s]) - self.conversations[s].indexed for s in self.pending)

    def work(self, budget_s: float = 1e-4) -> bool:
        """Index pending tokens for about `budget_s` seconds; whether any are still pending."""
        deadline = time.perf_counter() + budget_s
        while self.pending:
            session = next(iter(self.pending))
            conversation = self.conversations[session]
            goal = self._goal(conversation)
            while conversation.indexed < goal:
                self._index(conversation, min(CHUNK, goal - conversation.indexed))
                if conversation.indexed < goal and time.perf_counter() >= deadline:
                    return True
            del self.pending[session]
            self._enforce_local_cap(keep=conversation)
            if time.perf_counter() >= deadline:
                break
        return bool(self.pending)

    def _index(self, conversation: _Conversation, num_tokens: int) -> None:
        start = conversation.indexed
        end = start + num_tokens
        chunk = conversation.target[start:end].tolist()
        conversation.local.extend(0, chunk)
        conversation.indexed = end
        self.num_local += end - start
        response_start = max(start, conversation.prompt_len)
        if self.global_tokens and end > response_start:
            if conversation.global_seq is None:
                conversation.global_seq = self.global_index.add()
                self.global_owner[conversation.global_seq] = conversation
            self.global_index.extend(conversation.global_seq, chunk[response_start - start :])
            self._enforce_global_cap()

    def _truncate(self, conversation: _Conversation, keep: int) -> None:
        """Forget what the index holds past `keep`. Undoing a token costs about what indexing it did, and this
        runs on the call's path: past MAX_UNDO tokens (a regenerated answer, a session rebuilt with other
        text) the local index starts again empty instead, to be filled later in slices, and the response
        stays in the global index as it was, a past conversation's, until it is evicted."""
        if keep >= conversation.indexed:
            return
        if conversation.indexed - keep > MAX_UNDO:
            self.num_local -= conversation.indexed
            conversation.local = SuffixIndex(self.rules.max_depth)
            conversation.local.add()
            conversation.indexed = 0
            self._detach_response(conversation)  # its later tokens go to a new sequence
            conversation.prompt_len = max(conversation.prompt_len, keep)  # the old response keeps up to keep
            return
        conversation.local.truncate(0, keep)
        self.num_local -= conversation.indexed - keep
        conversation.indexed = keep
        if conversation.global_seq is not None:
            response_len = max(0, keep - conversation.prompt_len)
            if response_len < self.global_index.sequence_len(conversation.global_seq):
                self.global_index.truncate(conversation.global_seq, response_len)

    def _enforce_global_cap(self) -> None:
        while len(self.global_index) > self.global_tokens:
            seq_id, owner = self.global_owner.popitem(last=False)
            self.global_index.remove(seq_id)
            self.num_global_evicted += 1
            if owner is not None:
                owner.global_seq = None  # its later tokens go to a new response sequence

    def _enforce_local_cap(self, keep: _Conversation) -> None:
        """Drop the least recently updated sessions' indexes (never `keep`, just indexed) until the cap holds."""
        for session, conversation in list(self.conversations.items()):
            if self.num_local <= self.local_tokens:
                return
            if conversation is not keep:
                self.drop(session)
                self.num_local_dropped += 1

    def describe(self) -> dict:
        rules = self.rules
        return {
            "max_depth": rules.max_depth,
            "max_spec_factor": rules.max_spec_factor,
            "max_spec_offset": rules.max_spec_offset,
            "min_token_prob": rules.min_token_prob,
            "local": {
                "sessions": len(self.conversations),
                "tokens": self.num_local,
                "max_tokens": self.local_tokens,
                "dropped": self.num_local_dropped,
            },
            "global": {
                "responses": len(self.global_owner),
                "tokens": len(self.global_index),
                "max_tokens": self.global_tokens,
                "evicted": self.num_global_evicted,
            },
            "pending_tokens": self.pending_tokens,
        }
